// The PBFT-CS shim (NSDI'09 §3.2, §3.3, §5). See shim.h for the contract and the truncation rule.
//
// Shim partition j (0 <= j < 64, partition index inner count + j) holds the logs of the clients c with
// c % 64 == j, canonically encoded (one byte string per state, so equal logs have equal digests everywhere):
//   u32 client_count (<= clients_per_partition_max)
//   client_count x ( u32 client | u32 entry_count (1..N) | entry_count x ( u64 request_id | 32-byte digest ) )
// with clients strictly increasing and, per client, request ids strictly increasing. A client without entries
// is absent (rollback removes a client whose only entry it undoes). Little-endian like every bftfs format.
//
// Durable blob "shim.ckpt" in the SnapshotStore (overwritten by every checkpoint and install; put() is atomic):
//   magic "BFTSHIM1" | u32 64 | u32 N | u32 clients_max
//   | 2 x slot ( u64 seq | 32-byte inner root | 64 x ( u32 size | partition bytes ) )
//   | BLAKE2b-256 of everything before it (32)
// Slot 0 is the newest checkpoint both services hold (the inner one is known durable), slot 1 the checkpoint
// being taken or installed. The shim writes the blob before the inner service writes its own, so after a crash
// at any point the inner service's recovered checkpoint is one of the two slots: the one with its seq and its
// inner root. Slot 1's inner root is zero when it was not known in advance (a checkpoint: the inner service
// computes it while it writes); an install knows it (the root over the partitions it hands over).
#include "shim/shim.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"
#include "common/log.h"

namespace bftfs::shim {

namespace {

constexpr char kBlobName[] = "shim.ckpt";
constexpr char kBlobMagic[8] = {'B', 'F', 'T', 'S', 'H', 'I', 'M', '1'};
constexpr std::size_t kBlobSlots = 2;
constexpr std::size_t kSliceHeaderBytes = 4;           // u32 client count
constexpr std::size_t kClientHeaderBytes = 8;          // u32 client, u32 entry count
constexpr std::size_t kEntryBytes = 8 + kDigestBytes;  // u64 request id, result digest

using ClientLog = std::map<std::uint64_t, Digest>;  // request id -> digest of the result returned for it
using Slice = std::map<NodeId, ClientLog>;          // the logs of one shim partition, by client
using Slices = std::array<Slice, kShimPartitions>;
using PartitionBytes = std::shared_ptr<const Bytes>;
using Parts = std::vector<PartitionBytes>;  // kShimPartitions encoded slices

std::uint64_t slice_of(NodeId client) { return client % kShimPartitions; }

std::size_t client_bytes_max(std::uint32_t entries_max) {
  return kClientHeaderBytes + static_cast<std::size_t>(entries_max) * kEntryBytes;
}

bool options_valid(const ShimOptions& o) {
  return o.log_entries_per_client >= kLogEntriesPerClientMin &&
         o.log_entries_per_client <= kLogEntriesPerClientMax && o.clients_max >= 1;
}

Bytes encode_slice(const Slice& slice) {
  std::size_t size = kSliceHeaderBytes;
  for (const auto& [client, log] : slice) size += kClientHeaderBytes + log.size() * kEntryBytes;
  Bytes out;
  ByteWriter w(out);
  w.reserve(size);
  w.u32(static_cast<std::uint32_t>(slice.size()));
  for (const auto& [client, log] : slice) {
    BFT_ASSERT(!log.empty());  // a client without entries is absent
    w.u32(client);
    w.u32(static_cast<std::uint32_t>(log.size()));
    for (const auto& [request_id, digest] : log) {
      w.u64(request_id);
      w.digest(digest);
    }
  }
  BFT_ASSERT(out.size() == size);
  BFT_ASSERT(out.size() <= kPartitionBytesMax);  // guaranteed by clients_per_partition_max
  return out;
}

// Accepts only the canonical encoding of shim slice `slice_index` under `opt`; returns "" or why not. The
// bytes come from peers (state transfer, digest-checked) or from our own store, and are never trusted.
std::string_view decode_slice(std::span<const std::uint8_t> data, std::uint64_t slice_index, const ShimOptions& opt,
                              Slice& out) {
  out.clear();
  ByteReader r(data);
  std::uint32_t count = 0;
  if (!r.u32(count)) return "truncated client count";
  if (count > clients_per_partition_max(opt)) return "more clients than a partition holds";
  NodeId prev_client = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t client = 0;
    std::uint32_t entries = 0;
    if (!r.u32(client)) return "truncated client id";
    if (slice_of(client) != slice_index) return "client of another partition";
    if (i > 0 && client <= prev_client) return "clients not strictly increasing";
    if (!r.u32(entries)) return "truncated entry count";
    if (entries == 0) return "client with an empty log";
    if (entries > opt.log_entries_per_client) return "client log longer than log_entries_per_client";
    if (r.remaining() < static_cast<std::size_t>(entries) * kEntryBytes) return "truncated client log";
    ClientLog log;
    std::uint64_t prev_id = 0;
    for (std::uint32_t j = 0; j < entries; ++j) {
      std::uint64_t request_id = 0;
      Digest digest;
      const bool read = r.u64(request_id) && r.digest(digest);
      BFT_ASSERT(read);  // the length check above covers the whole log
      if (j > 0 && request_id <= prev_id) return "request ids not strictly increasing";
      prev_id = request_id;
      log.emplace_hint(log.end(), request_id, digest);
    }
    prev_client = client;
    out.emplace_hint(out.end(), client, std::move(log));
  }
  if (!r.done()) return "trailing bytes";
  return "";
}

// Decodes every shim partition and checks the limit across partitions; returns "" or why not.
std::string decode_slices(const Parts& parts, const ShimOptions& opt, Slices& out, std::uint64_t& clients) {
  BFT_ASSERT(parts.size() == kShimPartitions);
  clients = 0;
  for (std::uint64_t j = 0; j < kShimPartitions; ++j) {
    BFT_ASSERT(parts[j] != nullptr);
    const std::string_view why = decode_slice(*parts[j], j, opt, out[j]);
    if (!why.empty()) return "shim partition " + std::to_string(j) + ": " + std::string(why);
    clients += out[j].size();
  }
  if (clients > opt.clients_max) return "more clients than clients_max";
  return "";
}

// One checkpoint of the shim's logs as the durable blob holds it.
struct StoredSlot {
  std::uint64_t seq = 0;
  Digest inner_root;  // zero: not known when written
  Parts parts;
};

Bytes encode_blob(const ShimOptions& opt, const std::array<const StoredSlot*, kBlobSlots>& slots) {
  Bytes out;
  ByteWriter w(out);
  w.bytes(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(kBlobMagic), sizeof(kBlobMagic)));
  w.u32(static_cast<std::uint32_t>(kShimPartitions));
  w.u32(opt.log_entries_per_client);
  w.u32(opt.clients_max);
  for (const StoredSlot* slot : slots) {
    BFT_ASSERT(slot != nullptr);
    BFT_ASSERT(slot->parts.size() == kShimPartitions);
    w.u64(slot->seq);
    w.digest(slot->inner_root);
    for (const PartitionBytes& p : slot->parts) {
      BFT_ASSERT(p != nullptr);
      BFT_ASSERT(p->size() <= kPartitionBytesMax);
      w.blob(*p);
    }
  }
  w.digest(digest_of(out));
  return out;
}

// Returns "" and fills `slots`, or why the blob is not a shim snapshot written with `opt`. The partitions are
// only split here; decode_slices validates their contents.
std::string decode_blob(std::span<const std::uint8_t> blob, const ShimOptions& opt,
                        std::array<StoredSlot, kBlobSlots>& slots) {
  if (blob.size() < sizeof(kBlobMagic) + 12 + kDigestBytes) return "shorter than the fixed fields";
  const auto body = blob.first(blob.size() - kDigestBytes);
  Digest stored;
  std::memcpy(stored.bytes.data(), blob.data() + body.size(), kDigestBytes);
  if (digest_of(body) != stored) return "checksum mismatch (corrupt or truncated)";
  ByteReader r(body);
  std::span<const std::uint8_t> magic;
  std::uint32_t partitions = 0;
  std::uint32_t entries_max = 0;
  std::uint32_t clients_max = 0;
  if (!r.view(sizeof(kBlobMagic), magic)) return "truncated magic";
  if (std::memcmp(magic.data(), kBlobMagic, sizeof(kBlobMagic)) != 0) return "bad magic";
  if (!r.u32(partitions)) return "truncated partition count";
  if (partitions != kShimPartitions) return "partition count " + std::to_string(partitions) + " != 64";
  if (!r.u32(entries_max)) return "truncated log_entries_per_client";
  if (entries_max != opt.log_entries_per_client) {
    return "written with log_entries_per_client " + std::to_string(entries_max) + ", now " +
           std::to_string(opt.log_entries_per_client);
  }
  if (!r.u32(clients_max)) return "truncated clients_max";
  if (clients_max != opt.clients_max) {
    return "written with clients_max " + std::to_string(clients_max) + ", now " + std::to_string(opt.clients_max);
  }
  for (std::size_t s = 0; s < kBlobSlots; ++s) {
    StoredSlot& slot = slots[s];
    if (!r.u64(slot.seq)) return "truncated seq of slot " + std::to_string(s);
    if (!r.digest(slot.inner_root)) return "truncated inner root of slot " + std::to_string(s);
    slot.parts.clear();
    for (std::uint64_t j = 0; j < kShimPartitions; ++j) {
      Bytes data;
      if (!r.blob(data, kPartitionBytesMax)) return "bad partition " + std::to_string(j) + " of slot " + std::to_string(s);
      slot.parts.push_back(std::make_shared<const Bytes>(std::move(data)));
    }
  }
  if (!r.done()) return "trailing bytes";
  return "";
}

// An operating error at start-up: the durable state exists but cannot be used. Stopping is the only safe answer
// (the replica's promises rest on it); the operator can wipe the replica's state so that it rejoins by state
// transfer.
[[noreturn]] void fatal_snapshot(const std::string& why) {
  LOG_ERROR("", "snapshot %s unusable: %s; refusing to start (remove this replica's state to rejoin by state "
                "transfer)", kBlobName, why.c_str());
  std::fprintf(stderr, "fatal: snapshot %s unusable: %s\n", kBlobName, why.c_str());
  std::abort();
}

}  // namespace

std::uint32_t clients_per_partition_max(const ShimOptions& options) {
  BFT_ASSERT(options_valid(options));
  const std::size_t per_partition = (kPartitionBytesMax - kSliceHeaderBytes) / client_bytes_max(options.log_entries_per_client);
  BFT_ASSERT(per_partition >= 1);  // kLogEntriesPerClientMax is chosen so
  return static_cast<std::uint32_t>(std::min<std::size_t>(per_partition, 0xFFFFFFFFu));
}

struct Shim::Impl {
  // A retained checkpoint: the shim's partitions and the tree over inner and shim leaves.
  struct Retained {
    std::uint64_t seq = 0;
    Digest inner_root;  // the inner service's root at seq (always known once retained)
    Parts parts;
    PartitionTree tree;
  };
  // What one log change overwrote (TOCS §5.1.2 undo for tentative execution).
  struct Undo {
    std::uint64_t seq = 0;
    NodeId client = 0;
    std::uint64_t request_id = 0;
    bool had_entry = false;  // request_id was logged before (re-executed): old_digest is what it held
    Digest old_digest;
    bool evicted = false;  // the change truncated the lowest entry (evicted_id, evicted_digest)
    std::uint64_t evicted_id = 0;
    Digest evicted_digest;
  };
  // A state transfer between begin_install and finish_install.
  struct Install {
    std::uint64_t target_seq = 0;
    Parts parts;                                // the install base's shim partitions, staged ones replaced
    std::map<std::uint64_t, Bytes> inner_parts;  // held back until the shim's partitions decoded
    std::string error;                          // the first staging error, if any
  };

  Impl(Service& inner_service, SnapshotStore* snapshot_store, ShimOptions options)
      : inner(inner_service),
        store(snapshot_store),
        opt(options),
        per_partition_max(clients_per_partition_max(options)),  // asserts valid options
        inner_count(inner_service.partition_count()) {
    BFT_ASSERT(inner_count >= 1);
    BFT_ASSERT(inner_count <= UINT64_MAX - kShimPartitions);
    const CheckpointId r = inner.recovered_checkpoint();
    StoredSlot start{r.seq, r.digest, initial_parts()};
    Bytes blob;
    if (store != nullptr && store->get(kBlobName, blob)) {
      std::array<StoredSlot, kBlobSlots> slots;
      const std::string why = decode_blob(blob, opt, slots);
      if (!why.empty()) fatal_snapshot(why);
      const StoredSlot* match = choose_slot(slots, r);
      if (match == nullptr) {
        fatal_snapshot("holds checkpoints " + std::to_string(slots[0].seq) + " and " + std::to_string(slots[1].seq) +
                       ", none matching the inner service's recovered checkpoint " + std::to_string(r.seq) + " " +
                       r.digest.short_hex());
      }
      start.parts = match->parts;
    } else if (r.seq != 0) {
      // The inner service recovered a checkpoint that the shim never wrote logs for (a store that lost the
      // shim's blob, or a replica that ran without the shim): the logs of that state are gone.
      fatal_snapshot("missing, but the inner service recovered checkpoint " + std::to_string(r.seq));
    }
    const std::string why = decode_slices(start.parts, opt, slices, clients);
    if (!why.empty()) fatal_snapshot(why);
    const PartitionTree& inner_tree = inner.checkpoint_tree(r.seq);
    BFT_ASSERT(inner_tree.leaves() == inner_count);
    BFT_ASSERT(inner_tree.root() == r.digest);
    PartitionTree tree(inner_count + kShimPartitions, Digest{});
    for (std::uint64_t i = 0; i < inner_count; ++i) tree.set_leaf(i, inner_tree.leaf(i));
    for (std::uint64_t j = 0; j < kShimPartitions; ++j) {
      tree.set_leaf(inner_count + j, PartitionTree::leaf_digest(inner_count + j, *start.parts[j]));
    }
    const CheckpointId id = accept(Retained{r.seq, r.digest, std::move(start.parts), std::move(tree)});
    recovered = id;
    committed = r.seq;
    last_executed = r.seq;
    check_all();
  }

  static Parts initial_parts() {
    const auto empty = std::make_shared<const Bytes>(encode_slice({}));
    return Parts(kShimPartitions, empty);
  }

  // The slot of the durable blob that belongs with the inner service's recovered checkpoint `r`: same seq and
  // same inner root, or same seq and a root not known when it was written (a checkpoint the inner service may
  // or may not have completed; if it did not, the other slot names its seq and root). An exact root match wins.
  static const StoredSlot* choose_slot(const std::array<StoredSlot, kBlobSlots>& slots, const CheckpointId& r) {
    const StoredSlot* found = nullptr;
    for (const StoredSlot& s : slots) {
      if (s.seq != r.seq) continue;
      if (s.inner_root == r.digest) return &s;
      if (s.inner_root.is_zero()) found = &s;
    }
    return found;
  }

  const Retained& latest() const {
    auto it = retained.find(latest_seq);
    BFT_ASSERT(it != retained.end());
    return it->second;
  }

  // The combined tree of a new checkpoint: `base`'s tree with the inner leaves of `inner_tree` and the shim
  // leaves of every partition that is not shared with `base` (copy-on-write: unchanged partitions share bytes).
  PartitionTree next_tree(const Retained& base, const PartitionTree& inner_tree, const Parts& parts) const {
    BFT_ASSERT(inner_tree.leaves() == inner_count);
    BFT_ASSERT(parts.size() == kShimPartitions);
    PartitionTree tree = base.tree;
    for (std::uint64_t i = 0; i < inner_count; ++i) {
      if (tree.leaf(i) != inner_tree.leaf(i)) tree.set_leaf(i, inner_tree.leaf(i));
    }
    for (std::uint64_t j = 0; j < kShimPartitions; ++j) {
      if (parts[j] != base.parts[j]) tree.set_leaf(inner_count + j, PartitionTree::leaf_digest(inner_count + j, *parts[j]));
    }
    return tree;
  }

  CheckpointId accept(Retained next) {
    const CheckpointId id{next.seq, next.tree.root()};
    latest_seq = next.seq;
    retained.insert_or_assign(next.seq, std::move(next));
    return id;
  }

  // Durable before the inner service's write (see the blob comment at the top): slot 0 the latest checkpoint,
  // slot 1 the one being made.
  void persist(std::uint64_t seq, const Digest& inner_root, const Parts& parts) {
    if (store == nullptr) return;
    const Retained& base = latest();
    const StoredSlot previous{base.seq, base.inner_root, base.parts};
    const StoredSlot next{seq, inner_root, parts};
    store->put(kBlobName, encode_blob(opt, {&previous, &next}));
  }

  // ---- the log ----

  const ClientLog* find_log(NodeId client) const {
    const Slice& slice = slices[slice_of(client)];
    auto it = slice.find(client);
    return it == slice.end() ? nullptr : &it->second;
  }

  // Logs `digest` under (client, request_id) by the truncation rule of shim.h, with an undo record when the
  // execution is tentative.
  void log_result(const ExecContext& ctx, const Digest& digest) {
    const std::uint64_t j = slice_of(ctx.client);
    Slice& slice = slices[j];
    auto it = slice.find(ctx.client);
    if (it == slice.end()) {
      // The memory bound (shim.h): a client beyond either limit is not logged.
      if (clients >= opt.clients_max) return;
      if (slice.size() >= per_partition_max) return;
      it = slice.emplace(ctx.client, ClientLog{}).first;
      ++clients;
    }
    ClientLog& log = it->second;
    Undo u;
    u.seq = ctx.seq;
    u.client = ctx.client;
    u.request_id = ctx.request_id;
    auto [entry, inserted] = log.try_emplace(ctx.request_id, digest);
    if (!inserted) {
      // The engine never executes an id twice, but the Service contract does not promise it: the newest wins.
      u.had_entry = true;
      u.old_digest = entry->second;
      entry->second = digest;
    } else if (log.size() > opt.log_entries_per_client) {
      auto lowest = log.begin();  // possibly the id just logged, if it is lower than all N kept
      u.evicted = true;
      u.evicted_id = lowest->first;
      u.evicted_digest = lowest->second;
      log.erase(lowest);
    }
    BFT_ASSERT(!log.empty());
    BFT_ASSERT(log.size() <= opt.log_entries_per_client);
    dirty.set(j);
    // An execution at or below the last commit_through is final at once (the engine may name a seq committed
    // before it executes it): nothing will undo it.
    if (ctx.seq > committed) undo.push_back(u);
  }

  void apply_undo(const Undo& u) {
    const std::uint64_t j = slice_of(u.client);
    Slice& slice = slices[j];
    auto it = slice.find(u.client);
    BFT_ASSERT(it != slice.end());
    ClientLog& log = it->second;
    if (u.evicted) {
      const bool reinserted = log.emplace(u.evicted_id, u.evicted_digest).second;
      BFT_ASSERT(reinserted);
    }
    if (u.had_entry) {
      auto entry = log.find(u.request_id);
      BFT_ASSERT(entry != log.end());
      entry->second = u.old_digest;
    } else {
      const std::size_t erased = log.erase(u.request_id);
      BFT_ASSERT(erased == 1);
    }
    if (log.empty()) {
      slice.erase(it);
      BFT_ASSERT(clients >= 1);
      --clients;
    }
    dirty.set(j);
  }

  // ---- Service ----

  Bytes decide(const ExecContext& ctx, std::span<const std::uint8_t> op) {
    std::vector<Dependency> deps;
    std::span<const std::uint8_t> inner_op;
    if (decode_envelope(op, deps, inner_op) != EnvelopeError::kOk) return encode_envelope_result(ShimStatus::kMalformed, {});
    const ClientLog* log = find_log(ctx.client);
    for (const Dependency& d : deps) {
      if (log == nullptr) return encode_envelope_result(ShimStatus::kRetryDependencyUnknown, {});
      auto it = log->find(d.request_id);
      if (it == log->end()) return encode_envelope_result(ShimStatus::kRetryDependencyUnknown, {});
      if (it->second != d.result_digest) return encode_envelope_result(ShimStatus::kRetryPredicateFailed, {});
    }
    const Bytes inner_result = inner.execute(ctx, inner_op);
    BFT_ASSERT(inner_result.size() <= kInnerResultBytesMax);
    return encode_envelope_result(ShimStatus::kExecuted, inner_result);
  }

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
    BFT_ASSERT(!install.has_value());
    BFT_ASSERT(ctx.seq >= last_executed);  // batches execute in order (several requests share a seq)
    last_executed = ctx.seq;
    Bytes result = decide(ctx, op);
    BFT_ASSERT(result.size() <= kResultBytesMax);
    log_result(ctx, digest_of(result));
    check_invariants();
    check_client(ctx.client);
    return result;
  }

  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
    BFT_ASSERT(!install.has_value());
    std::vector<Dependency> deps;
    std::span<const std::uint8_t> inner_op;
    if (decode_envelope(op, deps, inner_op) != EnvelopeError::kOk) return false;
    if (!deps.empty()) return false;  // §3.3: a predicated request is always ordered
    Bytes inner_result;
    if (!inner.execute_read_only(client, inner_op, inner_result)) return false;
    BFT_ASSERT(inner_result.size() <= kInnerResultBytesMax);
    result = encode_envelope_result(ShimStatus::kExecuted, inner_result);
    return true;
  }

  void commit_own(std::uint64_t seq) {
    if (seq <= committed) return;
    committed = seq;
    std::size_t keep = 0;
    while (keep < undo.size() && undo[keep].seq <= seq) ++keep;
    undo.erase(undo.begin(), undo.begin() + static_cast<std::ptrdiff_t>(keep));
  }

  void rollback_to(std::uint64_t seq) {
    BFT_ASSERT(!install.has_value());
    BFT_ASSERT(seq >= committed);
    while (!undo.empty() && undo.back().seq > seq) {
      apply_undo(undo.back());
      undo.pop_back();
    }
    last_executed = std::min(last_executed, seq);
    inner.rollback_to(seq);
    check_all();
  }

  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(!install.has_value());
    BFT_ASSERT(last_executed <= seq);  // "nothing past seq is executed"
    commit_own(seq);                   // a checkpoint is taken only at a committed seq
    const Retained& base = latest();
    BFT_ASSERT(seq >= base.seq);
    Parts parts = base.parts;
    for (std::uint64_t j = 0; j < kShimPartitions; ++j) {
      if (!dirty.test(j)) continue;
      Bytes bytes = encode_slice(slices[j]);
      if (bytes != *parts[j]) parts[j] = std::make_shared<const Bytes>(std::move(bytes));
    }
    dirty.reset();
    // The inner root is not known before the inner service writes its checkpoint: zero in the blob (shim.cc top).
    persist(seq, Digest{}, parts);
    // The engine state goes with the inner service's checkpoint, atomically (protocol/service.h); the shim's own
    // blob is matched to that checkpoint by the slots above.
    const CheckpointId inner_id = inner.checkpoint(seq, engine_state);
    BFT_ASSERT(inner_id.seq == seq);
    // The inner service found damaged storage and took nothing (protocol/service.h): neither does the shim. Its
    // blob's other slot still names the inner service's durable checkpoint; the engine repairs by install.
    if (inner_id.digest.is_zero()) return inner_id;
    const PartitionTree& inner_tree = inner.checkpoint_tree(seq);
    BFT_ASSERT(inner_tree.root() == inner_id.digest);
    PartitionTree tree = next_tree(latest(), inner_tree, parts);
    return accept(Retained{seq, inner_id.digest, std::move(parts), std::move(tree)});
  }

  void discard_below(std::uint64_t seq) {
    inner.discard_checkpoints_below(seq);
    for (auto it = retained.begin(); it != retained.end() && it->first < seq;) {
      // The latest checkpoint stays: it is what an install starts from (and what the inner service keeps).
      it = it->first == latest_seq ? std::next(it) : retained.erase(it);
    }
  }

  const Retained& retained_at(std::uint64_t seq) const {
    auto it = retained.find(seq);
    BFT_ASSERT(it != retained.end());  // precondition of the Service accessors: the checkpoint is retained
    return it->second;
  }

  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const {
    BFT_ASSERT(index < inner_count + kShimPartitions);
    if (index < inner_count) return inner.read_partition(seq, index);
    return *retained_at(seq).parts[index - inner_count];
  }

  void begin_install(std::uint64_t target_seq) {
    BFT_ASSERT(!install.has_value());
    // Like the inner service, the install starts from the newest checkpoint: it is the local tree the engine's
    // fetcher compared against, so the partitions it did not fetch are exactly this base's.
    install = Install{target_seq, latest().parts, {}, {}};
  }

  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
    BFT_ASSERT(install.has_value());
    if (!install->error.empty()) return;  // the first error is the one reported
    if (data.size() > kPartitionBytesMax) {
      install->error = "partition " + std::to_string(index) + " over kPartitionBytesMax";
    } else if (index < inner_count) {
      install->inner_parts.insert_or_assign(index, Bytes(data.begin(), data.end()));
    } else if (index - inner_count < kShimPartitions) {
      install->parts[index - inner_count] = std::make_shared<const Bytes>(data.begin(), data.end());
    } else {
      install->error = "partition index " + std::to_string(index) + " out of range";
    }
  }

  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(install.has_value());
    BFT_ASSERT(install->target_seq == target_seq);
    Install in = std::move(*install);
    install.reset();
    // The engine installs only bytes that matched their digests, so a failure here means the digests
    // themselves describe a state no correct shim has: answer with a digest that cannot match (zero) and keep
    // the current state, rather than crash on bytes that came from the network. The inner service was not
    // touched yet, so it keeps its state too.
    Slices next;
    std::uint64_t next_clients = 0;
    std::string why = in.error;
    if (why.empty()) why = decode_slices(in.parts, opt, next, next_clients);
    if (!why.empty()) {
      LOG_WARN("", "shim install of checkpoint %llu rejected: %s", static_cast<unsigned long long>(target_seq),
               why.c_str());
      return CheckpointId{target_seq, Digest{}};
    }
    // The inner service installs from its newest checkpoint too (the latest one, taken in lockstep): the root it
    // will report is known now, so the blob can name it.
    const Retained& base = latest();
    PartitionTree expected_inner = inner.checkpoint_tree(base.seq);
    BFT_ASSERT(expected_inner.leaves() == inner_count);
    for (const auto& [i, data] : in.inner_parts) expected_inner.set_leaf(i, PartitionTree::leaf_digest(i, data));
    const Digest inner_root = expected_inner.root();
    persist(target_seq, inner_root, in.parts);
    inner.begin_install(target_seq);
    for (const auto& [i, data] : in.inner_parts) inner.install_partition(i, data);
    const CheckpointId inner_id = inner.finish_install(target_seq, engine_state);
    if (inner_id.digest.is_zero()) {
      // The inner service refused its partitions and kept its state: so does the shim. The blob's slot 0 still
      // names the inner service's durable checkpoint.
      LOG_WARN("", "shim install of checkpoint %llu rejected by the inner service",
               static_cast<unsigned long long>(target_seq));
      return CheckpointId{target_seq, Digest{}};
    }
    BFT_ASSERT(inner_id.seq == target_seq);
    BFT_ASSERT(inner_id.digest == inner_root);  // it installed what it was given, over the same base
    slices = std::move(next);
    clients = next_clients;
    undo.clear();
    dirty.reset();
    committed = target_seq;
    last_executed = target_seq;
    PartitionTree tree = next_tree(base, inner.checkpoint_tree(target_seq), in.parts);
    const CheckpointId id = accept(Retained{target_seq, inner_root, std::move(in.parts), std::move(tree)});
    check_all();
    return id;
  }

  // ---- invariants ----

  // Cheap enough for every execution: O(partitions), and the undo order only where an execution appends.
  void check_invariants() const {
    std::uint64_t total = 0;
    for (const Slice& slice : slices) {
      BFT_ASSERT(slice.size() <= per_partition_max);
      total += slice.size();
    }
    BFT_ASSERT(total == clients);
    BFT_ASSERT(clients <= opt.clients_max);
    if (!undo.empty()) BFT_ASSERT(undo.back().seq > committed);
    if (undo.size() >= 2) BFT_ASSERT(undo[undo.size() - 2].seq <= undo.back().seq);
    BFT_ASSERT(retained.count(latest_seq) == 1);
  }

  // Everything, after the rare whole-state changes (construction, rollback, install).
  void check_all() const {
    check_invariants();
    for (std::size_t i = 0; i < undo.size(); ++i) {
      BFT_ASSERT(undo[i].seq > committed);
      BFT_ASSERT(i == 0 || undo[i - 1].seq <= undo[i].seq);
    }
    for (const Slice& slice : slices) {
      for (const auto& [client, log] : slice) check_client(client);
    }
  }

  void check_client(NodeId client) const {
    const ClientLog* log = find_log(client);
    if (log == nullptr) return;
    BFT_ASSERT(!log->empty());
    BFT_ASSERT(log->size() <= opt.log_entries_per_client);
  }

  Service& inner;
  SnapshotStore* store;
  const ShimOptions opt;
  const std::uint32_t per_partition_max;
  const std::uint64_t inner_count;

  Slices slices;
  std::uint64_t clients = 0;  // logged clients over all slices
  std::vector<Undo> undo;     // log changes after `committed`, in execution order
  std::bitset<kShimPartitions> dirty;  // slices changed since the latest checkpoint
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;

  std::map<std::uint64_t, Retained> retained;
  std::uint64_t latest_seq = 0;  // the newest checkpoint taken, installed or recovered; always retained
  CheckpointId recovered;
  std::optional<Install> install;
};

Shim::Shim(Service& inner, SnapshotStore* store, ShimOptions options)
    : impl_(std::make_unique<Impl>(inner, store, options)) {}
Shim::~Shim() = default;

Bytes Shim::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) { return impl_->execute(ctx, op); }
bool Shim::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  return impl_->execute_read_only(client, op, result);
}
void Shim::commit_through(std::uint64_t seq) {
  impl_->commit_own(seq);
  impl_->inner.commit_through(seq);
}
void Shim::rollback_to(std::uint64_t seq) { impl_->rollback_to(seq); }
CheckpointId Shim::checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
  return impl_->checkpoint(seq, engine_state);
}
void Shim::discard_checkpoints_below(std::uint64_t seq) { impl_->discard_below(seq); }
CheckpointId Shim::recovered_checkpoint() const { return impl_->recovered; }
Bytes Shim::recovered_engine_state() const { return impl_->inner.recovered_engine_state(); }
std::uint64_t Shim::partition_count() const { return impl_->inner_count + kShimPartitions; }
const PartitionTree& Shim::checkpoint_tree(std::uint64_t seq) const { return impl_->retained_at(seq).tree; }
Bytes Shim::read_partition(std::uint64_t seq, std::uint64_t index) const { return impl_->read_partition(seq, index); }
void Shim::begin_install(std::uint64_t target_seq) { impl_->begin_install(target_seq); }
void Shim::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  impl_->install_partition(index, data);
}
CheckpointId Shim::finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state) {
  return impl_->finish_install(target_seq, engine_state);
}
std::vector<std::uint64_t> Shim::damaged_partitions() const { return impl_->inner.damaged_partitions(); }

std::optional<Digest> Shim::logged_digest(NodeId client, std::uint64_t request_id) const {
  const ClientLog* log = impl_->find_log(client);
  if (log == nullptr) return std::nullopt;
  auto it = log->find(request_id);
  if (it == log->end()) return std::nullopt;
  return it->second;
}
std::uint64_t Shim::logged_entries(NodeId client) const {
  const ClientLog* log = impl_->find_log(client);
  return log == nullptr ? 0 : log->size();
}
std::uint64_t Shim::logged_clients() const { return impl_->clients; }
const ShimOptions& Shim::options() const { return impl_->opt; }

}  // namespace bftfs::shim
