// Entries from requests and model results: see entry_builder.h.
#include "spec/entry_builder.h"

#include <algorithm>

#include <utility>

#include "common/assert.h"

namespace bftfs::spec {

namespace {

void shift_ref(fs::Handle& h) {
  if (!h.is_ref) return;
  BFT_ASSERT(h.ref < fs::kCompoundOpsMax - 1);
  h.ref = static_cast<std::uint8_t>(h.ref + 1);
}

// Ops whose successful result the tree learns nothing from but the success itself.
bool result_unseen(fs::OpCode code) {
  switch (code) {
    case fs::OpCode::kTime:
    case fs::OpCode::kWrite:
    case fs::OpCode::kRemove:
    case fs::OpCode::kRmdir:
    case fs::OpCode::kRename:
      return true;
    default:
      return false;
  }
}

}  // namespace

fs::Request with_time(const fs::Request& request, std::uint64_t time_ns) {
  BFT_ASSERT(!request.ops.empty());
  BFT_ASSERT(request.ops.size() < fs::kCompoundOpsMax);
  fs::Request out;
  out.ops.reserve(request.ops.size() + 1);
  fs::Op time;
  time.code = fs::OpCode::kTime;
  time.time_ns = time_ns;
  out.ops.push_back(std::move(time));
  for (fs::Op op : request.ops) {
    BFT_ASSERT(static_cast<std::uint8_t>(op.code) <= fs::kFileOpCodeMax);
    shift_ref(op.handle);
    shift_ref(op.handle2);
    out.ops.push_back(std::move(op));
  }
  return out;
}

fs::Result without_time(const fs::Result& result) {
  BFT_ASSERT(result.outcome != fs::Outcome::kMalformed);
  BFT_ASSERT(!result.results.empty());
  BFT_ASSERT(result.outcome == fs::Outcome::kDone || result.stop >= 1);
  fs::Result out;
  out.outcome = result.outcome;
  out.stop = result.outcome == fs::Outcome::kDone ? 0 : static_cast<std::uint8_t>(result.stop - 1);
  out.results.assign(result.results.begin() + 1, result.results.end());
  return out;
}

fs::Entry build_entry(const fs::Request& request, const fs::Result& model_result) {
  BFT_ASSERT(model_result.outcome != fs::Outcome::kMalformed);
  fs::Entry entry;
  entry.request = request;
  fs::set_expectation(entry, model_result);
  if (model_result.outcome != fs::Outcome::kDone) return entry;
  BFT_ASSERT(model_result.results.size() == request.ops.size());
  for (std::size_t i = 0; i < entry.request.ops.size(); ++i) {
    fs::Op& op = entry.request.ops[i];
    if (result_unseen(op.code)) continue;
    // The handler's own predicate stays when it already pins what the tree saw: a digest, or an errno naming a
    // failure (a failed op's result is its errno). "Expect success" does not: the tree also saw the result (a
    // READ's bytes, a listing), which the digest pins (the model's result has errno 0, so it implies the errno).
    if (op.expect.kind == fs::ExpectKind::kDigest) continue;
    if (op.expect.kind == fs::ExpectKind::kErrno && op.expect.err != fs::err::kOk) continue;
    op.expect.kind = fs::ExpectKind::kDigest;
    op.expect.digest = fs::op_result_digest(model_result.results[i]);
  }
  return entry;
}

fs::Op stream_op(fs::OpCode code, std::uint64_t stream, std::uint64_t epoch) {
  fs::Op op;
  op.code = code;
  op.stream = stream;
  op.epoch = epoch;
  return op;
}

fs::Request fetch_request(std::uint64_t stream, const fs::Request& entry, const std::vector<fs::ObjectKey>& missing,
                          bool trace) {
  fs::Op op = stream_op(fs::OpCode::kFetch, stream);
  if (trace || missing.empty()) {
    op.fetch_mode = fs::FetchMode::kTrace;
    op.trace = entry;
  } else {
    op.fetch_mode = fs::FetchMode::kKeys;
    op.keys.assign(missing.begin(), missing.begin() + std::min<std::size_t>(missing.size(), fs::kFetchKeysMax));
  }
  return fs::Request{{std::move(op)}};
}

}  // namespace bftfs::spec
