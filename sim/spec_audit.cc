// StreamOpAudit and EpochReplay: see spec_audit.h.
#include "sim/spec_audit.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "common/crypto.h"
#include "shim/envelope.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

// The one speculation op of a request that holds STAGE or EPOCH (they are always alone in their request).
const fs::Op* stream_op(const fs::Request& r, fs::OpCode code) {
  return r.ops.size() == 1 && r.ops[0].code == code ? &r.ops[0] : nullptr;
}

const char* verdict_name(fs::EpochVerdict v) {
  static constexpr const char* kNames[] = {"APPLIED", "CHAIN", "STAGING", "ENTRY"};
  return kNames[static_cast<unsigned>(v)];
}

}  // namespace

void SpecAuditStats::add(const SpecAuditStats& o) {
  stages += o.stages;
  stages_stored += o.stages_stored;
  epochs += o.epochs;
  epochs_applied += o.epochs_applied;
  epochs_chain += o.epochs_chain;
  epochs_staging += o.epochs_staging;
  epochs_entry += o.epochs_entry;
  entries_replayed += o.entries_replayed;
  entries_staged += o.entries_staged;
  reserves += o.reserves;
  fetches += o.fetches;
}

std::string entry_mismatch(const fs::Entry& entry, const fs::Result& actual) {
  if (actual.outcome != entry.expect_outcome) {
    return fmt("outcome %u, expected %u", static_cast<unsigned>(actual.outcome),
               static_cast<unsigned>(entry.expect_outcome));
  }
  if (actual.outcome != fs::Outcome::kDone) {
    if (actual.stop != entry.expect_stop) return fmt("stopped at op %u, expected op %u", actual.stop, entry.expect_stop);
    // The errno of the op that stopped it, for a predicate too: the tree may have been told it.
    if (actual.results.at(actual.stop).err != entry.expect_err) {
      return fmt("errno %u at op %u, expected %u", actual.results[actual.stop].err, actual.stop, entry.expect_err);
    }
    return "";
  }
  if (actual.results.size() != entry.request.ops.size()) return "a done entry without a result per op";
  for (std::size_t i = 0; i < actual.results.size(); ++i) {
    const fs::Expect& e = entry.request.ops[i].expect;
    if (e.kind == fs::ExpectKind::kErrno && actual.results[i].err != e.err) {
      return fmt("op %zu gave errno %u, its predicate expects %u", i, actual.results[i].err, e.err);
    }
    if (e.kind == fs::ExpectKind::kDigest && !(fs::op_result_digest(actual.results[i]) == e.digest)) {
      return fmt("op %zu gave a result whose digest is not the one its predicate names", i);
    }
  }
  return "";
}

// ---- StreamOpAudit (property 12) ----

Bytes StreamOpAudit::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  fs::Request request;
  const bool decoded = fs::decode_request(op, request) == fs::FsDecodeError::kOk;
  const bool epoch = decoded && stream_op(request, fs::OpCode::kEpoch) != nullptr;
  const bool stage = decoded && stream_op(request, fs::OpCode::kStage) != nullptr;
  if (!epoch && !stage) return inner_.execute(ctx, op);
  ++audited_;
  const Digest all_before = fs_.objects_digest(true);
  const Digest tree_before = fs_.objects_digest(false);
  Bytes result = inner_.execute(ctx, op);
  if (!violation_.empty()) return result;
  fs::Result r;
  const bool ok = fs::decode_result(result, r) == fs::FsDecodeError::kOk;
  const bool applied = ok && epoch && r.outcome == fs::Outcome::kDone && r.results.size() == 1 &&
                       r.results[0].verdict == fs::EpochVerdict::kApplied;
  const char* what = epoch ? "EPOCH" : "STAGE";
  if (!applied && !(fs_.objects_digest(false) == tree_before)) {
    violation_ = fmt("all or nothing (property 12): a %s of client %u at seq %llu that did not apply changed the "
                     "file tree",
                     what, ctx.client, ull(ctx.seq));
  } else if (epoch && !applied && !(fs_.objects_digest(true) == all_before)) {
    violation_ = fmt("all or nothing (property 12): an EPOCH of client %u at seq %llu that did not apply changed "
                     "a stream's objects",
                     ctx.client, ull(ctx.seq));
  }
  return result;
}


// ---- EpochReplay (properties 11 and 13) ----

EpochReplay::EpochReplay(const fs::FsOptions& options)
    : service_(std::make_unique<fs::FsService>(static_cast<SnapshotStore*>(nullptr), options)) {}

EpochReplay::~EpochReplay() = default;

void EpochReplay::fail(std::string what) {
  if (violation_.empty()) violation_ = std::move(what);
}

void EpochReplay::on_execution(const ExecRecord& rec) {
  if (failed()) return;
  // The shim passes the inner op on only when it executes the request (shim/shim.h); a no-op never reached
  // the file service.
  if (rec.shim_status != shim::ShimStatus::kExecuted) return;
  shim::ShimRequest envelope;
  if (shim::decode_envelope(rec.op, envelope) != shim::EnvelopeError::kOk) return;
  fs::Request request;
  if (fs::decode_request(envelope.op, request) != fs::FsDecodeError::kOk) request.ops.clear();
  on_fs_request(rec, request, envelope.op);
  // Undo records are kept only for the replay of the next EPOCH's entries, which undoes to its own seq.
  if (rec.seq > committed_ + 1) {
    committed_ = rec.seq - 1;
    service_->commit_through(committed_);
  }
}

void EpochReplay::on_fs_request(const ExecRecord& rec, const fs::Request& request,
                                std::span<const std::uint8_t> inner_op) {
  const ExecContext ctx{rec.seq, rec.client, rec.request_id, rec.timestamp_ns};
  const fs::Op* epoch = stream_op(request, fs::OpCode::kEpoch);
  Expected expected;
  if (epoch != nullptr) expected = replay_epoch(rec, *epoch);
  if (failed()) return;
  fs::Result result;
  if (fs::decode_result(service_->execute(ctx, inner_op), result) != fs::FsDecodeError::kOk) {
    fail(fmt("epoch replay: seq %llu client %u: the file service's result does not decode", ull(rec.seq),
             rec.client));
    return;
  }
  const bool one = result.outcome == fs::Outcome::kDone && result.results.size() == 1;
  if (request.ops.size() == 1 && request.ops[0].code == fs::OpCode::kReserve) ++stats_.reserves;
  for (const fs::Op& op : request.ops) stats_.fetches += op.code == fs::OpCode::kFetch ? 1 : 0;
  if (epoch != nullptr) {
    ++stats_.epochs;
    // The verdict checked is the one the correct replicas recorded (the replay's own execution of the EPOCH only
    // keeps its state in step; the oracle ties the two results together).
    shim::ShimResult recorded;
    fs::Result verdict;
    if (!shim::decode_envelope_result(rec.result, recorded) ||
        fs::decode_result(recorded.inner, verdict) != fs::FsDecodeError::kOk) {
      fail(fmt("epoch replay: the replicas' result of the EPOCH at seq %llu does not decode", ull(rec.seq)));
      return;
    }
    if (verdict.outcome != fs::Outcome::kDone || verdict.results.size() != 1) {
      // Only the stream limit's ENOSPC ends an EPOCH with an op failure: nothing applied.
      if (expected.verdict == fs::EpochVerdict::kApplied) ++stats_.epochs_entry;
      return;
    }
    after_epoch(rec, *epoch, verdict.results[0], expected);
  } else if (const fs::Op* stage = stream_op(request, fs::OpCode::kStage); stage != nullptr) {
    ++stats_.stages;
    if (one) after_stage({rec.client, stage->stream}, *stage, result.results[0]);
  } else if (request.ops.size() == 1 && request.ops[0].code == fs::OpCode::kStreamClose && one) {
    const StreamKey key{rec.client, request.ops[0].stream};
    staging_.erase(key);
    last_applied_.erase(key);
    prevs_used_.erase(key);
  }
}

bool EpochReplay::entries_of(const StreamKey& key, const fs::Op& op, std::vector<fs::Entry>& out) const {
  out.clear();
  if (op.parts > 0) {
    const auto it = staging_.find(key);
    if (it == staging_.end() || it->second.epoch != op.epoch) return false;
    std::vector<Bytes> parts;
    for (std::uint32_t p = 0; p < op.parts; ++p) {
      const auto part = it->second.parts.find(p);
      if (part == it->second.parts.end()) return false;
      parts.push_back(part->second);
    }
    if (!(fs::parts_digest(parts) == op.parts_digest)) return false;
    for (const Bytes& part : parts) {
      std::vector<fs::Entry> entries;
      BFT_ASSERT(fs::decode_entries(part, entries) == fs::FsDecodeError::kOk);  // stored only when they decoded
      out.insert(out.end(), entries.begin(), entries.end());
    }
  }
  out.insert(out.end(), op.entries.begin(), op.entries.end());
  return out.size() <= fs::kEntriesMax;
}

// The verdict this EPOCH must get, computed from the history seen so far and by running its entries on the
// replay's state at the EPOCH's place (then undone).
EpochReplay::Expected EpochReplay::replay_epoch(const ExecRecord& rec, const fs::Op& op) {
  const StreamKey key{rec.client, op.stream};
  Expected e;
  const auto last = last_applied_.find(key);
  if ((last == last_applied_.end() ? 0 : last->second) != op.prev) {
    e.verdict = fs::EpochVerdict::kChain;
    return e;
  }
  std::vector<fs::Entry> entries;
  if (!entries_of(key, op, entries)) {
    e.verdict = fs::EpochVerdict::kStaging;
    return e;
  }
  // Entries run one after another on top of each other's changes, as the EPOCH runs them, under a seq above
  // the EPOCH's own so that undoing them leaves every earlier execution of its batch in place.
  const ExecContext sandbox{rec.seq + 1, rec.client, rec.request_id, rec.timestamp_ns};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const fs::EntryRun run = service_->execute_entry(sandbox, op.stream, entries[i].request);
    BFT_ASSERT(run.complete());  // a store that holds the whole state answers every read
    ++stats_.entries_replayed;
    if (i < entries.size() - op.entries.size()) ++stats_.entries_staged;
    const std::string why = entry_mismatch(entries[i], run.result);
    if (!why.empty()) {
      e.verdict = fs::EpochVerdict::kEntry;
      e.entry = static_cast<std::uint32_t>(i);
      e.why = why;
      break;
    }
    e.results.push_back(run.result);
  }
  service_->rollback_to(rec.seq);
  if (e.verdict == fs::EpochVerdict::kApplied) {
    e.entries = std::move(entries);
  } else {
    e.results.clear();
  }
  return e;
}

void EpochReplay::after_epoch(const ExecRecord& rec, const fs::Op& op, const fs::OpResult& actual,
                              const Expected& expected) {
  const StreamKey key{rec.client, op.stream};
  const std::string where = fmt("EPOCH %llu (prev %llu) of client %u stream %llu at seq %llu", ull(op.epoch),
                                ull(op.prev), rec.client, ull(op.stream), ull(rec.seq));
  switch (actual.verdict) {
    case fs::EpochVerdict::kApplied: ++stats_.epochs_applied; break;
    case fs::EpochVerdict::kChain: ++stats_.epochs_chain; break;
    case fs::EpochVerdict::kStaging: ++stats_.epochs_staging; break;
    case fs::EpochVerdict::kEntry: ++stats_.epochs_entry; break;
  }
  if (actual.verdict == fs::EpochVerdict::kApplied && expected.verdict == fs::EpochVerdict::kEntry) {
    fail(fmt("predicates hold where applied (property 11): %s applied, but its entry %u does not hold there: %s",
             where.c_str(), expected.entry, expected.why.c_str()));
    return;
  }
  if (actual.verdict != expected.verdict ||
      (actual.verdict == fs::EpochVerdict::kEntry && actual.entry != expected.entry)) {
    fail(fmt("epoch replay: %s got verdict %s (entry %u); the independent replay says %s (entry %u)%s%s",
             where.c_str(), verdict_name(actual.verdict), actual.entry, verdict_name(expected.verdict),
             expected.entry, expected.why.empty() ? "" : ": ", expected.why.c_str()));
    return;
  }
  if (actual.verdict != fs::EpochVerdict::kApplied) return;
  // Property 13: one chain per stream, numbers increasing, no prev named twice.
  std::uint64_t& last = last_applied_[key];
  if (op.prev != last || op.epoch <= op.prev || !prevs_used_[key].insert(op.prev).second) {
    fail(fmt("chain (property 13): %s applied after epoch %llu", where.c_str(), ull(last)));
    return;
  }
  last = op.epoch;
  applied_[key].push_back(AppliedEpoch{rec.client, op.stream, op.epoch, rec.seq, rec.request_id,
                                       expected.entries, expected.results});
  const auto staged = staging_.find(key);
  if (staged != staging_.end() && staged->second.epoch <= op.epoch) staging_.erase(staged);
}

std::vector<AppliedEpoch> EpochReplay::applied(NodeId client, std::uint64_t stream) const {
  const auto it = applied_.find(StreamKey{client, stream});
  return it == applied_.end() ? std::vector<AppliedEpoch>{} : it->second;
}

// What a STAGE that the service accepted keeps (docs/SPECULATION.md §5.5): a newer epoch's first part erases
// the older epoch's parts; a part replaces one of the same number.
void EpochReplay::after_stage(const StreamKey& key, const fs::Op& op, const fs::OpResult& actual) {
  if (actual.err != fs::err::kOk) return;
  ++stats_.stages_stored;
  Staging& s = staging_[key];
  if (op.epoch > s.epoch) {
    s.parts.clear();
    s.epoch = op.epoch;
  }
  s.parts[op.part] = fs::encode_entries(op.entries);
}

}  // namespace bftfs::sim
