#include "sim/recording_service.h"

#include <optional>

#include "common/assert.h"
#include "common/crypto.h"
#include "shim/shim.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

// ---- ExecutionProbe ----

ExecutionProbe::ExecutionProbe(Service& inner) : ForwardingService(inner) {}

Bytes ExecutionProbe::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  ++executions_;
  return inner_.execute(ctx, op);
}

// ---- RecordingService ----

RecordingService::RecordingService(Service& inner, const shim::Shim* shim, const ExecutionProbe* probe,
                                   bool keep_ops)
    : inner_(inner), shim_(shim), probe_(probe), keep_ops_(keep_ops) {
  BFT_ASSERT((shim == nullptr) == (probe == nullptr));
  committed_through_ = inner_.recovered_checkpoint().seq;
  last_executed_seq_ = committed_through_;
  executed_from_ = committed_through_;
}

Bytes RecordingService::execute_audited(const ExecContext& ctx, std::span<const std::uint8_t> op, ExecRecord& rec) {
  rec.enveloped = true;
  std::span<const std::uint8_t> inner_op;
  const bool valid = shim::decode_envelope(op, rec.deps, inner_op) == shim::EnvelopeError::kOk;
  if (!valid) rec.deps.clear();
  rec.op_kind = valid && !inner_op.empty() ? inner_op[0] : 0;
  // What the shim's own log dictates, read before the execution changes the log (shim.h: the first
  // dependency in list order that is missing or different decides).
  shim::ShimStatus expected = valid ? shim::ShimStatus::kExecuted : shim::ShimStatus::kMalformed;
  for (const shim::Dependency& d : rec.deps) {
    const std::optional<Digest> logged = shim_->logged_digest(ctx.client, d.request_id);
    if (!logged) {
      expected = shim::ShimStatus::kRetryDependencyUnknown;
      break;
    }
    if (*logged != d.result_digest) {
      expected = shim::ShimStatus::kRetryPredicateFailed;
      break;
    }
  }
  const std::uint64_t inner_before = probe_->executions();
  Bytes result = inner_.execute(ctx, op);
  const std::uint64_t inner_runs = probe_->executions() - inner_before;
  shim::ShimResult sr;
  if (!shim::decode_envelope_result(result, sr)) {
    breach(fmt("shim: s%llu c%u r%llu returned a result that is not an envelope (%zu bytes)", ull(ctx.seq),
               ctx.client, ull(ctx.request_id), result.size()));
    return result;
  }
  rec.shim_status = sr.status;
  if (sr.status != expected) {
    breach(fmt("shim decision: s%llu c%u r%llu with %zu dependencies returned %s but its log says %s", ull(ctx.seq),
               ctx.client, ull(ctx.request_id), rec.deps.size(), std::string(shim::to_string(sr.status)).c_str(),
               std::string(shim::to_string(expected)).c_str()));
  }
  const bool executed = sr.status == shim::ShimStatus::kExecuted;
  if (inner_runs != (executed ? 1u : 0u)) {
    breach(fmt("shim: s%llu c%u r%llu with status %s ran the inner service %llu times (a request whose predicate "
               "is false must never reach the counter)",
               ull(ctx.seq), ctx.client, ull(ctx.request_id), std::string(shim::to_string(sr.status)).c_str(),
               ull(inner_runs)));
  }
  const std::optional<Digest> logged = shim_->logged_digest(ctx.client, ctx.request_id);
  if (logged ? *logged != digest_of(result) : shim_->logged_entries(ctx.client) != 0 &&
                                                  shim_->logged_entries(ctx.client) <
                                                      shim_->options().log_entries_per_client) {
    breach(fmt("shim log: s%llu c%u r%llu returned %s but logged %s", ull(ctx.seq), ctx.client, ull(ctx.request_id),
               digest_of(result).short_hex().c_str(), logged ? logged->short_hex().c_str() : "nothing"));
  }
  return result;
}

void RecordingService::breach(std::string what) {
  if (contract_error_.empty()) contract_error_ = std::move(what);
}

Bytes RecordingService::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  if (installing_) breach("execute during a state install");
  if (ctx.seq < last_executed_seq_) {
    breach("execute at seq " + std::to_string(ctx.seq) + " after seq " + std::to_string(last_executed_seq_));
  }
  if (ctx.seq != last_executed_seq_) executed_at_seq_ = 0;
  last_executed_seq_ = ctx.seq;
  ExecRecord rec;
  rec.seq = ctx.seq;
  rec.index = executed_at_seq_++;
  rec.client = ctx.client;
  rec.request_id = ctx.request_id;
  rec.timestamp_ns = ctx.timestamp_ns;
  if (keep_ops_) rec.op.assign(op.begin(), op.end());
  Bytes result;
  if (shim_ != nullptr) {
    result = execute_audited(ctx, op, rec);
  } else {
    result = inner_.execute(ctx, op);
    rec.op_kind = op.empty() ? 0 : op[0];
  }
  rec.result_digest = digest_of(result);
  if (keep_ops_ || result.size() <= kRecordedResultBytesMax) rec.result = result;
  if (ctx.seq <= committed_through_) {
    // The engine may declare a seq committed before it executes it (commit_through names what is agreed,
    // not what ran); such an execution is final at once.
    final_.push_back(std::move(rec));
  } else {
    tentative_.push_back(std::move(rec));
  }
  return result;
}

bool RecordingService::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  if (installing_) breach("read-only execute during a state install");
  return inner_.execute_read_only(client, op, result);
}

void RecordingService::finalize_through(std::uint64_t seq) {
  while (!tentative_.empty() && tentative_.front().seq <= seq) {
    final_.push_back(std::move(tentative_.front()));
    tentative_.pop_front();
  }
  if (seq > committed_through_) committed_through_ = seq;
}

void RecordingService::commit_through(std::uint64_t seq) {
  finalize_through(seq);
  inner_.commit_through(seq);
}

void RecordingService::rollback_to(std::uint64_t seq) {
  if (seq < committed_through_) {
    breach("rollback_to(" + std::to_string(seq) + ") below commit_through(" + std::to_string(committed_through_) +
           ")");
    return;  // the inner service would assert; the simulator reports the breach with its trace instead
  }
  bool dropped = false;
  while (!tentative_.empty() && tentative_.back().seq > seq) {
    tentative_.pop_back();
    ++rolled_back_executions_;
    dropped = true;
  }
  if (dropped) ++rollbacks_;
  if (last_executed_seq_ > seq) last_executed_seq_ = seq;
  inner_.rollback_to(seq);
}

CheckpointId RecordingService::checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
  if (!tentative_.empty() && tentative_.back().seq > seq) {
    breach("checkpoint(" + std::to_string(seq) + ") with seq " + std::to_string(tentative_.back().seq) +
           " executed");
  }
  // A checkpoint is taken only at a committed seq (service.h), so everything at or below it is final.
  finalize_through(seq);
  const CheckpointId id = inner_.checkpoint(seq, engine_state);
  if (!id.digest.is_zero()) checkpoints_.emplace_back(id.seq, id.digest);  // zero: a damaged store took none
  return id;
}

void RecordingService::discard_checkpoints_below(std::uint64_t seq) { inner_.discard_checkpoints_below(seq); }

CheckpointId RecordingService::recovered_checkpoint() const { return inner_.recovered_checkpoint(); }
Bytes RecordingService::recovered_engine_state() const { return inner_.recovered_engine_state(); }

std::uint64_t RecordingService::partition_count() const { return inner_.partition_count(); }

const PartitionTree& RecordingService::checkpoint_tree(std::uint64_t seq) const {
  return inner_.checkpoint_tree(seq);
}

Bytes RecordingService::read_partition(std::uint64_t seq, std::uint64_t index) const {
  return inner_.read_partition(seq, index);
}

void RecordingService::begin_install(std::uint64_t target_seq) {
  installing_ = true;
  inner_.begin_install(target_seq);
}

void RecordingService::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  if (!installing_) breach("install_partition without begin_install");
  inner_.install_partition(index, data);
}

CheckpointId RecordingService::finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
  if (!installing_) breach("finish_install without begin_install");
  installing_ = false;
  CheckpointId id = inner_.finish_install(target_seq, engine_state);
  if (id.digest.is_zero()) return id;  // the service refused the state and kept its own (counter_service.cc)
  // The state is now the agreed checkpoint at target_seq. Tentative executions belonged to a state that is
  // gone: whether they matched the agreed history is unknown, so they are not evidence either way.
  tentative_.clear();
  if (target_seq > committed_through_) committed_through_ = target_seq;
  last_executed_seq_ = target_seq;
  executed_from_ = target_seq;
  checkpoints_.emplace_back(id.seq, id.digest);
  return id;
}

std::vector<std::pair<std::uint64_t, Digest>> RecordingService::take_checkpoints() {
  std::vector<std::pair<std::uint64_t, Digest>> out;
  out.swap(checkpoints_);
  return out;
}

std::vector<ExecRecord> RecordingService::take_final() {
  std::vector<ExecRecord> out;
  out.swap(final_);
  return out;
}

}  // namespace bftfs::sim
