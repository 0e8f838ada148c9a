// Builders for the file service's speculation ops (docs/SPECULATION.md §5) and a harness helper that runs a
// stream op as client 7 and decodes its one OpResult: shared by the codec, epoch and spec tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "test_fs_util.h"

namespace fstest {

inline Op time_op(std::uint64_t t) {
  Op op = base(OpCode::kTime, root_cred());
  op.time_ns = t;
  return op;
}
// An entry's request: TIME t, then `ops` (their result references shifted past the TIME op by the caller).
inline Request entry_request(std::uint64_t t, std::vector<Op> ops) {
  Request r;
  r.ops.push_back(time_op(t));
  for (Op& op : ops) r.ops.push_back(std::move(op));
  return r;
}
inline Entry entry_of(Request r, Outcome outcome = Outcome::kDone, std::uint8_t stop = 0, std::uint32_t e = 0) {
  Entry entry;
  entry.expect_outcome = outcome;
  entry.expect_stop = stop;
  entry.expect_err = e;
  entry.request = std::move(r);
  return entry;
}
inline Op fetch_trace(std::uint64_t stream, Request traced) {
  Op op = base(OpCode::kFetch, root_cred());
  op.fetch_mode = FetchMode::kTrace;
  op.stream = stream;
  op.trace = std::move(traced);
  return op;
}
inline Op fetch_keys(std::vector<ObjectKey> keys) {
  Op op = base(OpCode::kFetch, root_cred());
  op.fetch_mode = FetchMode::kKeys;
  op.keys = std::move(keys);
  return op;
}
inline Op reserve_op(std::uint64_t stream, std::uint16_t count) {
  Op op = base(OpCode::kReserve, root_cred());
  op.stream = stream;
  op.reserve = count;
  return op;
}
inline Op stage_op(std::uint64_t stream, std::uint64_t epoch, std::uint32_t part, std::vector<Entry> entries) {
  Op op = base(OpCode::kStage, root_cred());
  op.stream = stream;
  op.epoch = epoch;
  op.part = part;
  op.entries = std::move(entries);
  return op;
}
inline Op epoch_op(std::uint64_t stream, std::uint64_t epoch, std::uint64_t prev, std::vector<Entry> entries,
                   std::uint32_t parts = 0, Digest digest = Digest{}) {
  Op op = base(OpCode::kEpoch, root_cred());
  op.stream = stream;
  op.epoch = epoch;
  op.prev = prev;
  op.parts = parts;
  op.parts_digest = digest;
  op.entries = std::move(entries);
  return op;
}
inline Op stream_close_op(std::uint64_t stream) {
  Op op = base(OpCode::kStreamClose, root_cred());
  op.stream = stream;
  return op;
}

}  // namespace fstest
