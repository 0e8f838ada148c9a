// The file service's compound executor (see fs_service_impl.h and docs/FILESERVICE.md §1, §4): decode, run the
// ops in order, evaluate predicates, and undo everything the request changed when an op does not pass.
#include "services/fs/fs_service_impl.h"

#include <utility>
#include <vector>

#include "common/assert.h"

namespace bftfs::fs {

namespace {

// Whether result `r` satisfies predicate `e`; kNone matches anything (run_ops then asks for success instead).
bool predicate_matches(const Expect& e, const OpResult& r) {
  switch (e.kind) {
    case ExpectKind::kNone: return true;
    case ExpectKind::kErrno: return r.err == e.err;
    case ExpectKind::kDigest: return op_result_digest(r) == e.digest;
  }
  return false;
}

}  // namespace

Bytes FsService::Impl::execute(const ExecContext& ctx, std::span<const std::uint8_t> bytes) {
  BFT_ASSERT(!partial);
  BFT_ASSERT(!installing);
  BFT_ASSERT(ctx.seq >= last_executed);  // batches execute in order (several requests share a seq)
  last_executed = ctx.seq;
  Request req;
  const FsDecodeError de = decode_request(bytes, req);
  if (de != FsDecodeError::kOk) {
    Result res;
    res.outcome = Outcome::kMalformed;
    res.stop = static_cast<std::uint8_t>(de);
    return encode_checked(res);
  }
  cur_seq = ctx.seq;
  cur_client = ctx.client;
  now = ctx.timestamp_ns;
  mutating = true;
  const Result res = run_request(req);
  mutating = false;
  check_cheap_invariants();
  return encode_checked(res);
}

bool FsService::Impl::execute_read_only(NodeId client, std::span<const std::uint8_t> bytes, Bytes& result) {
  BFT_ASSERT(!partial);
  BFT_ASSERT(!installing);
  if (!store.corrupt_partitions().empty()) return false;  // nothing is answered from a damaged store
  Request req;
  if (decode_request(bytes, req) != FsDecodeError::kOk) return false;
  for (const Op& op : req.ops) {
    if (!is_read_only(op.code)) return false;
  }
  BFT_ASSERT(!mutating);
  cur_client = client;
  now = 0;  // a read-only request changes no time; a TIME op may set one for its FETCH trace
  const std::uint64_t corrupt_before = store.corrupt_reads();
  result = encode_checked(run_request(req));
  return store.corrupt_reads() == corrupt_before;
}

Result FsService::Impl::run_request(const Request& req) {
  const std::size_t request_mark = undo.size();
  try {
    return run_ops(req, request_mark);
  } catch (const CorruptRead&) {
    // Never returned (the engine checks damaged_partitions() after every execution), but defined: EIO.
    abandon(request_mark);
    Result res;
    res.outcome = Outcome::kOpFailed;
    res.stop = 0;
    OpResult r;
    r.code = req.ops.front().code;
    r.err = err::kIo;
    res.results.push_back(std::move(r));
    return res;
  }
}

Result FsService::Impl::run_ops(const Request& req, std::size_t request_mark) {
  Result res;
  for (std::size_t i = 0; i < req.ops.size(); ++i) {
    const Op& op = req.ops[i];
    OpResult r;
    r.code = op.code;
    const std::size_t op_mark = undo.size();
    touched.clear();
    r.err = run_op(op, res.results, r);
    if (overflow) {
      overflow = false;
      r.err = err::kNoSpc;  // a partition would exceed kPartitionBytesMax
    }
    if (r.err != err::kOk) {
      restore_to(op_mark);  // a failed op leaves no trace, even when its predicate expected the failure
      const std::uint32_t failed = r.err;
      r = OpResult{};
      r.code = op.code;
      r.err = failed;
    }
    const bool passes = op.expect.kind == ExpectKind::kNone ? r.err == err::kOk : predicate_matches(op.expect, r);
    res.results.push_back(std::move(r));
    if (!passes) {
      res.outcome = op.expect.kind == ExpectKind::kNone ? Outcome::kOpFailed : Outcome::kPredicateFailed;
      res.stop = static_cast<std::uint8_t>(i);
      restore_to(request_mark);
      break;
    }
  }
  touched.clear();
  return res;
}

std::uint32_t FsService::Impl::run_op(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
  switch (op.code) {
    case OpCode::kLookup: return op_lookup(op, earlier, out);
    case OpCode::kGetattr: return op_getattr(op, earlier, out);
    case OpCode::kSetattr: return op_setattr(op, earlier, out);
    case OpCode::kRead: return op_read(op, earlier, out);
    case OpCode::kWrite: return op_write(op, earlier, out);
    case OpCode::kCreate: return make_node(op, earlier, FileType::kRegular, op.mode, out);
    case OpCode::kRemove: return op_remove(op, earlier, false);
    case OpCode::kMkdir: return make_node(op, earlier, FileType::kDirectory, op.mode, out);
    case OpCode::kRmdir: return op_remove(op, earlier, true);
    case OpCode::kRename: return op_rename(op, earlier);
    case OpCode::kLink: return op_link(op, earlier, out);
    case OpCode::kSymlink: return make_node(op, earlier, FileType::kSymlink, 0777, out);
    case OpCode::kMknod: return make_node(op, earlier, op.node_type, op.mode, out);
    case OpCode::kReadlink: return op_readlink(op, earlier, out);
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus: return op_readdir(op, earlier, out);
    case OpCode::kStatfs: return op_statfs(op, earlier, out);
    case OpCode::kAccess: return op_access(op, earlier, out);
    case OpCode::kFsync: return op_getattr(op, earlier, out);  // the replicated state is durable by checkpoints
    case OpCode::kTime:
      now = op.time_ns;
      return err::kOk;
    case OpCode::kFetch: return op_fetch(op, out);
    case OpCode::kReserve: return op_reserve(op, out);
    case OpCode::kStage: return op_stage(op, out);
    case OpCode::kEpoch: return op_epoch(op, out);
    case OpCode::kStreamClose: return op_stream_close(op);
  }
  BFT_UNREACHABLE();
}

Bytes FsService::Impl::encode_checked(const Result& res) const {
  Bytes out = encode_result(res);
  BFT_ASSERT(out.size() <= kFsResultBytesMax);
  return out;
}

}  // namespace bftfs::fs
