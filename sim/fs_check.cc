// FsCheck: see fs_check.h.
#include "sim/fs_check.h"

#include <algorithm>
#include <utility>

#include "services/fs/fs_codec.h"
#include "shim/envelope.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

FsCheck::FsCheck(FsOracleOptions options) : oracle_(std::move(options)) {}

void FsCheck::on_progress(NodeId replica, std::span<const ExecRecord> finals, std::uint64_t from,
                          std::uint64_t through) {
  std::uint64_t& reported = reported_through_[replica];
  // Seqs this replica covered before (in this incarnation or an earlier one) were taken then; seqs at or below
  // `from` it did not execute itself.
  const std::uint64_t first = std::max({from, reported, complete_}) + 1;
  reported = std::max(reported, through);
  if (first > through) return;
  auto rec = std::find_if(finals.begin(), finals.end(), [first](const ExecRecord& r) { return r.seq >= first; });
  for (std::uint64_t seq = first; seq <= through; ++seq) {
    std::vector<ExecRecord> execs;
    for (; rec != finals.end() && rec->seq == seq; ++rec) execs.push_back(*rec);
    known_.try_emplace(seq, std::move(execs));  // the first replica to cover a seq decides it
  }
  while (!known_.empty() && known_.begin()->first == complete_ + 1) {
    feed(known_.begin()->first, known_.begin()->second);
    known_.erase(known_.begin());
  }
}

void FsCheck::feed(std::uint64_t seq, const std::vector<ExecRecord>& execs) {
  for (const ExecRecord& rec : execs) {
    oracle_.on_execution(ExecContext{rec.seq, rec.client, rec.request_id, rec.timestamp_ns}, rec.op,
                         rec.result_digest);
    count(rec);
  }
  complete_ = seq;
  oracle_.on_complete_through(seq);
}

// What one agreed execution did, from its request and result (both kept whole: RecordingService keep_ops).
void FsCheck::count(const ExecRecord& rec) {
  ++stats_.executions;
  if (!rec.deps.empty()) ++stats_.with_dependencies;
  if (rec.shim_status != shim::ShimStatus::kExecuted) {
    ++stats_.shim_noops;
    return;
  }
  shim::ShimRequest request;
  shim::ShimResult result;
  fs::Request fr;
  fs::Result res;
  if (shim::decode_envelope(rec.op, request) != shim::EnvelopeError::kOk ||
      !shim::decode_envelope_result(rec.result, result) ||
      fs::decode_request(request.op, fr) != fs::FsDecodeError::kOk ||
      fs::decode_result(result.inner, res) != fs::FsDecodeError::kOk) {
    return;  // the oracle reports a result that is not the serial execution's; nothing to count here
  }
  if (res.outcome == fs::Outcome::kOpFailed) ++stats_.op_failed;
  if (res.outcome == fs::Outcome::kPredicateFailed) ++stats_.predicate_failed;
  if (res.outcome != fs::Outcome::kDone) return;
  ++stats_.done;
  if (fr.ops.size() >= 2) ++stats_.compounds_done;
  for (const fs::Op& op : fr.ops) {
    if (op.expect.kind != fs::ExpectKind::kNone) ++stats_.expects_held;
    switch (op.code) {
      case fs::OpCode::kRename:
        ++stats_.renames_done;
        if (!(op.handle == op.handle2)) ++stats_.renames_across_done;
        break;
      case fs::OpCode::kLink: ++stats_.links_done; break;
      case fs::OpCode::kRemove:
      case fs::OpCode::kRmdir: ++stats_.removes_done; break;
      case fs::OpCode::kWrite: ++stats_.writes_done; break;
      case fs::OpCode::kCreate:
      case fs::OpCode::kMkdir:
      case fs::OpCode::kSymlink:
      case fs::OpCode::kMknod: ++stats_.creates_done; break;
      default: break;
    }
  }
}

void FsCheck::on_checkpoint(std::uint64_t seq, const Digest& digest) { oracle_.on_replica_checkpoint(seq, digest); }

void FsCheck::finish() {
  if (!known_.empty()) {
    stats_.gaps = known_.begin()->first - complete_ - 1;
    violation_ = fmt("fs history: no correct replica reported executing seq %llu, but seqs up to %llu were (the "
                     "oracle stops at the gap)",
                     ull(complete_ + 1), ull(known_.rbegin()->first));
    return;
  }
  oracle_.finish();
}

}  // namespace bftfs::sim
