// The PBFT-CS counter service (NSDI'09 §6.1). See counter_service.h for ops and results.
//
// Partitions (TOCS §5.3.1): 0 holds the value (u64); partition k in 1..255 holds the expected tokens of the
// clients c with (c % 255) + 1 == k, encoded canonically as
//   u32 count || count * (u32 client || u64 token)   with clients strictly increasing.
// A client with no entry expects counter_initial_token(c). The encoding is canonical (one byte string per
// state), so equal states have equal digests on every replica and a decoder can reject anything else.
//
// Tentative execution (TOCS §5.1.2) needs undo: every increment since the last commit_through records the
// value and token it replaced, and rollback_to replays those records backwards.
#include "services/counter_service.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "common/assert.h"
#include "common/crypto.h"
#include "common/log.h"
#include "services/checkpoint_keeper_internal.h"

namespace bftfs {

using services_internal::put_u32;
using services_internal::put_u64;
using services_internal::put_u8;
using services_internal::Reader;

namespace {

constexpr std::uint8_t kOpIncrement = 1;
constexpr std::uint8_t kOpRead = 2;
constexpr std::uint8_t kStatusOk = 0;
constexpr std::uint8_t kStatusBadToken = 1;
constexpr std::uint8_t kStatusMalformed = 2;
constexpr std::size_t kResultBytes = 17;
constexpr std::uint64_t kTokenSlices = kCounterPartitions - 1;  // partitions 1..255

std::span<const std::uint8_t> tag(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::uint64_t slice_of(NodeId client) { return client % kTokenSlices; }  // partition = slice + 1

// The token a client must present after a successful increment. It depends on the client, its previous
// token and the new value, so it cannot be derived from the value alone: a client can only increment with
// the token of the reply it actually received (the NSDI'09 §6.1 sequential dependency).
std::uint64_t next_token(NodeId client, std::uint64_t old_token, std::uint64_t new_value) {
  DigestBuilder b;
  b.add(tag("counter-next")).add_u32(client).add_u64(old_token).add_u64(new_value);
  return services_internal::digest_prefix_u64(b.finish());
}

Bytes encode_result(std::uint8_t status, std::uint64_t value, std::uint64_t token) {
  Bytes out;
  out.reserve(kResultBytes);
  put_u8(out, status);
  put_u64(out, value);
  put_u64(out, token);
  return out;
}

using Slice = std::map<NodeId, std::uint64_t>;

Bytes encode_value(std::uint64_t value) {
  Bytes out;
  put_u64(out, value);
  return out;
}

Bytes encode_slice(const Slice& slice) {
  Bytes out;
  out.reserve(4 + slice.size() * 12);
  put_u32(out, static_cast<std::uint32_t>(slice.size()));
  for (const auto& [client, token] : slice) {
    put_u32(out, client);
    put_u64(out, token);
  }
  return out;
}

bool decode_value(std::span<const std::uint8_t> data, std::uint64_t& value) {
  Reader r(data);
  return r.u64(value) && r.remaining() == 0;
}

// Accepts only the canonical encoding of slice `slice_index` (0-based, partition slice_index + 1).
bool decode_slice(std::span<const std::uint8_t> data, std::uint64_t slice_index, Slice& out) {
  Reader r(data);
  std::uint32_t count = 0;
  if (!r.u32(count)) return false;
  if (static_cast<std::uint64_t>(count) * 12 != r.remaining()) return false;
  out.clear();
  bool first = true;
  NodeId prev = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t client = 0;
    std::uint64_t token = 0;
    if (!r.u32(client) || !r.u64(token)) return false;
    if (slice_of(client) != slice_index) return false;
    if (!first && client <= prev) return false;
    first = false;
    prev = client;
    out.emplace_hint(out.end(), client, token);
  }
  return r.remaining() == 0;
}

}  // namespace

Bytes counter_increment_op(std::uint64_t token) {
  Bytes op;
  put_u8(op, kOpIncrement);
  put_u64(op, token);
  return op;
}

Bytes counter_read_op() { return Bytes{kOpRead}; }

bool parse_counter_result(std::span<const std::uint8_t> bytes, CounterResult& out) {
  Reader r(bytes);
  CounterResult res;
  if (!r.u8(res.status) || !r.u64(res.value) || !r.u64(res.next_token)) return false;
  if (r.remaining() != 0) return false;
  if (res.status > kStatusMalformed) return false;
  out = res;
  return true;
}

std::uint64_t counter_initial_token(NodeId client) {
  DigestBuilder b;
  b.add(tag("counter-token")).add_u32(client);
  return services_internal::digest_prefix_u64(b.finish());
}

struct CounterService::Impl {
  // The decoded state that execute() works on.
  struct State {
    std::uint64_t value = 0;
    std::array<Slice, kTokenSlices> slices;
  };
  // What one successful increment overwrote.
  struct Undo {
    std::uint64_t seq = 0;
    std::uint64_t old_value = 0;
    NodeId client = 0;
    bool had_token = false;  // false: the client expected its initial token (no entry)
    std::uint64_t old_token = 0;
  };

  explicit Impl(SnapshotStore* store) : keeper("counter.ckpt", store, initial_partitions()) {
    // A blob that passed its checksum but does not decode was written by a different version or a bug: as
    // fatal as a corrupt one.
    if (!decode_all(keeper.latest().parts, state)) {
      services_internal::fatal_snapshot(keeper.name(), "a partition does not decode as counter state");
    }
    committed = keeper.latest().seq;
    last_executed = committed;
  }

  static std::vector<Bytes> initial_partitions() {
    std::vector<Bytes> parts;
    parts.reserve(kCounterPartitions);
    parts.push_back(encode_value(0));
    for (std::uint64_t i = 0; i < kTokenSlices; ++i) parts.push_back(encode_slice({}));
    return parts;
  }

  static bool decode_all(const std::vector<services_internal::PartitionBytes>& parts, State& out) {
    BFT_ASSERT(parts.size() == kCounterPartitions);
    State s;
    if (!decode_value(*parts[0], s.value)) return false;
    for (std::uint64_t i = 0; i < kTokenSlices; ++i) {
      if (!decode_slice(*parts[i + 1], i, s.slices[i])) return false;
    }
    out = std::move(s);
    return true;
  }

  std::uint64_t expected_token(NodeId client) const {
    const Slice& slice = state.slices[slice_of(client)];
    auto it = slice.find(client);
    return it == slice.end() ? counter_initial_token(client) : it->second;
  }

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(ctx.seq >= last_executed);  // batches execute in order (several requests share a seq)
    last_executed = ctx.seq;
    const std::uint64_t expected = expected_token(ctx.client);
    Reader r(op);
    std::uint8_t code = 0;
    if (!r.u8(code)) return encode_result(kStatusMalformed, state.value, expected);
    if (code == kOpRead && r.remaining() == 0) return encode_result(kStatusOk, state.value, expected);
    std::uint64_t token = 0;
    if (code != kOpIncrement || !r.u64(token) || r.remaining() != 0) {
      return encode_result(kStatusMalformed, state.value, expected);
    }
    if (token != expected) return encode_result(kStatusBadToken, state.value, expected);

    Slice& slice = state.slices[slice_of(ctx.client)];
    auto it = slice.find(ctx.client);
    undo.push_back(Undo{ctx.seq, state.value, ctx.client, it != slice.end(), expected});
    ++state.value;
    const std::uint64_t next = next_token(ctx.client, expected, state.value);
    slice.insert_or_assign(ctx.client, next);
    dirty.insert(0);
    dirty.insert(slice_of(ctx.client) + 1);
    return encode_result(kStatusOk, state.value, next);
  }

  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
    BFT_ASSERT(!keeper.installing());
    if (op.size() != 1 || op[0] != kOpRead) return false;  // only a well-formed read skips ordering
    result = encode_result(kStatusOk, state.value, expected_token(client));
    return true;
  }

  void commit_through(std::uint64_t seq) {
    if (seq <= committed) return;
    committed = seq;
    std::size_t keep = 0;
    while (keep < undo.size() && undo[keep].seq <= seq) ++keep;
    undo.erase(undo.begin(), undo.begin() + static_cast<std::ptrdiff_t>(keep));
  }

  void rollback_to(std::uint64_t seq) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(seq >= committed);
    while (!undo.empty() && undo.back().seq > seq) {
      const Undo& u = undo.back();
      state.value = u.old_value;
      Slice& slice = state.slices[slice_of(u.client)];
      if (u.had_token) {
        slice.insert_or_assign(u.client, u.old_token);
      } else {
        slice.erase(u.client);
      }
      dirty.insert(0);
      dirty.insert(slice_of(u.client) + 1);
      undo.pop_back();
    }
    last_executed = std::min(last_executed, seq);
  }

  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(!keeper.installing());
    BFT_ASSERT(last_executed <= seq);  // "nothing past seq is executed"
    commit_through(seq);               // a checkpoint is taken only at a committed seq
    std::map<std::uint64_t, Bytes> changed;
    for (std::uint64_t p : dirty) {
      changed.emplace(p, p == 0 ? encode_value(state.value) : encode_slice(state.slices[p - 1]));
    }
    dirty.clear();
    return keeper.take(seq, std::move(changed), engine_state);
  }

  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(keeper.installing());
    // The engine installs only bytes that matched their digests, so a failure here means the digests
    // themselves describe a state no correct counter has: answer with a digest that cannot match (zero) and
    // keep the current state, rather than crash on bytes that came from the network.
    State next;
    std::string why = keeper.install_error();
    if (why.empty() && !decode_all(keeper.staging(), next)) why = "a partition does not decode as counter state";
    if (!why.empty()) {
      LOG_WARN("", "counter install of checkpoint %llu rejected: %s",
               static_cast<unsigned long long>(target_seq), why.c_str());
      keeper.abort_install();
      return CheckpointId{target_seq, Digest{}};
    }
    state = std::move(next);
    undo.clear();
    dirty.clear();
    committed = target_seq;
    last_executed = target_seq;
    return keeper.finish_install(target_seq, engine_state);
  }

  services_internal::CheckpointKeeper keeper;
  State state;
  std::vector<Undo> undo;        // increments after `committed`, in execution order
  std::set<std::uint64_t> dirty;  // partitions changed since the last checkpoint (or install)
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;
};

CounterService::CounterService(SnapshotStore* store) : impl_(std::make_unique<Impl>(store)) {}
CounterService::~CounterService() = default;

Bytes CounterService::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  return impl_->execute(ctx, op);
}
bool CounterService::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  return impl_->execute_read_only(client, op, result);
}
void CounterService::commit_through(std::uint64_t seq) { impl_->commit_through(seq); }
void CounterService::rollback_to(std::uint64_t seq) { impl_->rollback_to(seq); }
CheckpointId CounterService::checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
  return impl_->checkpoint(seq, engine_state);
}
void CounterService::discard_checkpoints_below(std::uint64_t seq) { impl_->keeper.discard_below(seq); }
CheckpointId CounterService::recovered_checkpoint() const { return impl_->keeper.recovered(); }
Bytes CounterService::recovered_engine_state() const { return impl_->keeper.recovered_engine_state(); }
const PartitionTree& CounterService::checkpoint_tree(std::uint64_t seq) const {
  return impl_->keeper.retained(seq).tree;
}
Bytes CounterService::read_partition(std::uint64_t seq, std::uint64_t index) const {
  const auto& snap = impl_->keeper.retained(seq);
  BFT_ASSERT(index < snap.parts.size());
  return *snap.parts[index];
}
void CounterService::begin_install(std::uint64_t target_seq) {
  // The install base is the newest checkpoint (see CheckpointKeeper::begin_install); anything executed after
  // it is discarded by finish_install.
  (void)target_seq;
  BFT_ASSERT(!impl_->keeper.installing());
  impl_->keeper.begin_install();
}
void CounterService::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  BFT_ASSERT(impl_->keeper.installing());
  impl_->keeper.stage(index, data);
}
CheckpointId CounterService::finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
  return impl_->finish_install(target_seq, engine_state);
}

std::uint64_t CounterService::value() const { return impl_->state.value; }

}  // namespace bftfs
