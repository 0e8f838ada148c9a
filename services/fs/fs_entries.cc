// Entries (see fs_service_impl.h and docs/SPECULATION.md §5.3): a speculating tree's requests, executed as they
// are inside an EPOCH, in the local model, and under FETCH's trace. What makes them entries: the time of each op
// is the last TIME before it (never the batch's), and creates take inode numbers from the front of the stream's
// pool (never from the global allocator), so an entry's result depends on the state and the entry alone.
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_service_impl.h"

namespace bftfs::fs {

namespace {

// Cheap checks of execute_entry's precondition (the decoder checked the rest when the request arrived).
bool is_entry_request(const Request& req) {
  if (req.ops.empty() || req.ops.size() > kCompoundOpsMax) return false;
  if (req.ops.front().code != OpCode::kTime) return false;
  for (const Op& op : req.ops) {
    if (static_cast<std::uint8_t>(op.code) > kEntryOpCodeMax) return false;
  }
  return true;
}

}  // namespace

EntryRun FsService::Impl::execute_entry(const ExecContext& ctx, std::uint64_t stream, const Request& req) {
  BFT_ASSERT(!installing);
  BFT_ASSERT(!mutating);
  BFT_ASSERT(ctx.seq >= last_executed);
  BFT_ASSERT(is_entry_request(req));
  last_executed = ctx.seq;
  cur_seq = ctx.seq;
  cur_client = ctx.client;
  now = 0;  // op 0 is TIME: the context's time is never used
  const std::size_t mark = undo.size();
  EntryRun run;
  mutating = true;
  try {
    run.result = run_as_entry(req, StreamId{ctx.client, stream});
  } catch (const UnknownKey& unknown) {
    abandon(mark);
    run.missing.push_back(unknown.key);
  } catch (const InconsistentState&) {
    abandon(mark);
    run.inconsistent = true;
  } catch (const CorruptRead&) {
    abandon(mark);
    run.result = Result{Outcome::kOpFailed, 0, {OpResult{}}};
    run.result.results[0].code = OpCode::kTime;
    run.result.results[0].err = err::kIo;
  }
  mutating = false;
  check_cheap_invariants();
  return run;
}

Result FsService::Impl::run_as_entry(const Request& req, const StreamId& sid) {
  const Scoped<std::optional<StreamId>> in_entry(pool, sid);
  return run_ops(req, undo.size());
}

std::uint32_t FsService::Impl::take_from_pool(const StreamId& sid, std::uint64_t& ino, std::uint64_t& gen) {
  const std::uint64_t head = load_pool_head(sid);
  const ObjectKey front = pool_key(sid, head);
  const Value v = get(front);
  if (v == nullptr) return err::kNoSpc;  // nothing reserved, or all of it used
  ReservedInode ri;
  const bool decoded = decode_reserved(*v, ri);
  BFT_ASSERT(decoded);  // validated when it entered the store
  erase(front);
  put(pool_head_key(sid), encode_u64(head + 1));
  ino = ri.ino;
  gen = ri.generation;
  return err::kOk;
}

void FsService::Impl::abandon(std::size_t mark) {
  restore_to(mark);
  touched.clear();
  overflow = false;
}

}  // namespace bftfs::fs
