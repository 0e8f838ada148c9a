// The null service of the BFT paper's micro-benchmarks (TOCS §8.2, the a/b operations) and the in-memory
// SnapshotStore. See null_service.h.
//
// Its one partition holds the number of requests executed (u64), so that checkpoints of a busy cluster change
// and state transfer, rollback and recovery have something to get right even in benchmarks.
#include "services/null_service.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "common/log.h"
#include "services/checkpoint_keeper_internal.h"

namespace bftfs {

using services_internal::put_u32;
using services_internal::put_u64;
using services_internal::Reader;

namespace {

Bytes encode_count(std::uint64_t count) {
  Bytes out;
  put_u64(out, count);
  return out;
}

bool decode_count(std::span<const std::uint8_t> data, std::uint64_t& count) {
  Reader r(data);
  return r.u64(count) && r.remaining() == 0;
}

// The result size an op asks for, or false if the op is malformed (too short, or a size over the limit).
bool result_size_of(std::span<const std::uint8_t> op, std::uint32_t& size) {
  Reader r(op);
  if (!r.u32(size)) return false;
  return size <= kNullResultBytesMax;
}

}  // namespace

Bytes null_op(std::uint32_t arg_bytes, std::uint32_t result_bytes) {
  BFT_ASSERT(arg_bytes <= kOpBytesMax);
  BFT_ASSERT(result_bytes <= kNullResultBytesMax);
  Bytes op;
  put_u32(op, result_bytes);
  // An argument smaller than the size field still carries the size field: the op is never shorter than 4.
  if (arg_bytes > op.size()) op.resize(arg_bytes, 0);
  return op;
}

struct NullService::Impl {
  explicit Impl(SnapshotStore* store) : keeper("null.ckpt", store, {encode_count(0)}) {
    if (!decode_count(*keeper.latest().parts[0], count)) {
      services_internal::fatal_snapshot(keeper.name(), "the partition does not decode as a request count");
    }
    committed = keeper.latest().seq;
    last_executed = committed;
  }

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(ctx.seq >= last_executed);  // batches execute in order (several requests share a seq)
    last_executed = ctx.seq;
    // Every ordered request counts, malformed or not: the state change must not depend on op contents
    // beyond what every replica sees identically, and counting all of them is the simplest such rule.
    undo.emplace_back(ctx.seq, count);
    ++count;
    dirty = true;
    std::uint32_t size = 0;
    if (!result_size_of(op, size)) return {};  // malformed: an empty result, deterministically
    return Bytes(size, 0);
  }

  bool execute_read_only(std::span<const std::uint8_t> op, Bytes& result) {
    BFT_ASSERT(!keeper.installing());
    std::uint32_t size = 0;
    if (!result_size_of(op, size)) return false;
    result.assign(size, 0);
    return true;
  }

  void commit_through(std::uint64_t seq) {
    if (seq <= committed) return;
    committed = seq;
    std::size_t keep = 0;
    while (keep < undo.size() && undo[keep].first <= seq) ++keep;
    undo.erase(undo.begin(), undo.begin() + static_cast<std::ptrdiff_t>(keep));
  }

  void rollback_to(std::uint64_t seq) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(seq >= committed);
    while (!undo.empty() && undo.back().first > seq) {
      count = undo.back().second;
      dirty = true;
      undo.pop_back();
    }
    last_executed = std::min(last_executed, seq);
  }

  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(last_executed <= seq);  // "nothing past seq is executed"
    commit_through(seq);
    std::map<std::uint64_t, Bytes> changed;
    if (dirty) changed.emplace(0, encode_count(count));
    dirty = false;
    return keeper.take(seq, std::move(changed), engine_state);
  }

  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(keeper.installing());
    // Defensive as in the counter: undecodable installed bytes yield a digest that cannot match (zero) and
    // leave the current state alone.
    std::uint64_t next = 0;
    std::string why = keeper.install_error();
    if (why.empty() && !decode_count(*keeper.staging()[0], next)) why = "the partition is not a u64 count";
    if (!why.empty()) {
      LOG_WARN("", "null service install of checkpoint %llu rejected: %s",
               static_cast<unsigned long long>(target_seq), why.c_str());
      keeper.abort_install();
      return CheckpointId{target_seq, Digest{}};
    }
    count = next;
    undo.clear();
    dirty = false;
    committed = target_seq;
    last_executed = target_seq;
    return keeper.finish_install(target_seq, engine_state);
  }

  services_internal::CheckpointKeeper keeper;
  std::uint64_t count = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> undo;  // (seq, count before) since `committed`
  bool dirty = false;
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;
};

NullService::NullService(SnapshotStore* store) : impl_(std::make_unique<Impl>(store)) {}
NullService::~NullService() = default;

Bytes NullService::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  return impl_->execute(ctx, op);
}
bool NullService::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  (void)client;  // the null service answers every client alike
  return impl_->execute_read_only(op, result);
}
void NullService::commit_through(std::uint64_t seq) { impl_->commit_through(seq); }
void NullService::rollback_to(std::uint64_t seq) { impl_->rollback_to(seq); }
CheckpointId NullService::checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
  return impl_->checkpoint(seq, engine_state);
}
void NullService::discard_checkpoints_below(std::uint64_t seq) { impl_->keeper.discard_below(seq); }
CheckpointId NullService::recovered_checkpoint() const { return impl_->keeper.recovered(); }
Bytes NullService::recovered_engine_state() const { return impl_->keeper.recovered_engine_state(); }
const PartitionTree& NullService::checkpoint_tree(std::uint64_t seq) const {
  return impl_->keeper.retained(seq).tree;
}
Bytes NullService::read_partition(std::uint64_t seq, std::uint64_t index) const {
  const auto& snap = impl_->keeper.retained(seq);
  BFT_ASSERT(index < snap.parts.size());
  return *snap.parts[index];
}
void NullService::begin_install(std::uint64_t target_seq) {
  (void)target_seq;  // the base is the newest checkpoint; see CheckpointKeeper::begin_install
  BFT_ASSERT(!impl_->keeper.installing());
  impl_->keeper.begin_install();
}
void NullService::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  BFT_ASSERT(impl_->keeper.installing());
  impl_->keeper.stage(index, data);
}
CheckpointId NullService::finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
  return impl_->finish_install(target_seq, engine_state);
}

void MemorySnapshotStore::put(const std::string& name, std::span<const std::uint8_t> data) {
  files_.insert_or_assign(name, Bytes(data.begin(), data.end()));
}

bool MemorySnapshotStore::get(const std::string& name, Bytes& out) const {
  auto it = files_.find(name);
  if (it == files_.end()) return false;
  out = it->second;
  return true;
}

}  // namespace bftfs
