// Internal to services/: what the null and counter services share about checkpoints (TOCS §5.3.1).
//
// A small service keeps its state as decoded structures for execution and as encoded partitions for
// checkpoints. CheckpointKeeper owns the encoded side: the partition tree and bytes of every retained
// checkpoint (copy-on-write: a checkpoint shares the bytes of every partition that did not change since the
// previous one), the durable snapshot blob in the SnapshotStore, and the staging area of a state-transfer
// install. The service decides which partitions changed and how partitions decode.
//
// Snapshot blob (one per service, overwritten by every checkpoint; SnapshotStore::put is atomic and durable):
//   magic "BFTSNAP2" (8) || u64 seq || u64 partition count || per partition: u32 size || bytes
//   || u64 engine state size || engine state || BLAKE2b-256 of everything before it (32)
// All integers little-endian. The engine state (protocol/service.h) is in the same blob as the partitions so
// that one atomic put makes both durable. A blob with magic "BFTSNAP1" (written before engine states were
// stored, without the engine state field) still loads, with an empty engine state. The digest detects a
// corrupt or truncated file: a replica then stops with an error rather than starting from a wrong state (a
// silent reset would lose committed operations it promised).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/crypto.h"
#include "common/log.h"
#include "protocol/messages.h"
#include "protocol/partition_tree.h"
#include "protocol/service.h"

namespace bftfs::services_internal {

// ---- little-endian encoding (services' own formats; bounded, validated on decode) ----
inline void put_u8(Bytes& out, std::uint8_t v) { out.push_back(v); }
inline void put_u32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
inline void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// Reads fields in order; every read checks the remaining length and returns false instead of overrunning.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> data) : data_(data) {}
  bool u8(std::uint8_t& v) {
    if (remaining() < 1) return false;
    v = data_[pos_++];
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (remaining() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(data_[pos_++]) << (8 * i);
    return true;
  }
  bool u64(std::uint64_t& v) {
    if (remaining() < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(data_[pos_++]) << (8 * i);
    return true;
  }
  bool bytes(std::size_t n, std::span<const std::uint8_t>& out) {
    if (remaining() < n) return false;
    out = data_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  std::size_t remaining() const { return data_.size() - pos_; }
  std::size_t position() const { return pos_; }

 private:
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
};

// The first 8 bytes of a digest as a little-endian u64 (tokens of the counter).
inline std::uint64_t digest_prefix_u64(const Digest& d) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(d.bytes[static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

inline constexpr char kSnapshotMagic[8] = {'B', 'F', 'T', 'S', 'N', 'A', 'P', '2'};
inline constexpr char kSnapshotMagicV1[8] = {'B', 'F', 'T', 'S', 'N', 'A', 'P', '1'};  // no engine state

using PartitionBytes = std::shared_ptr<const Bytes>;

inline Bytes encode_snapshot_blob(std::uint64_t seq, const std::vector<PartitionBytes>& parts,
                                  std::span<const std::uint8_t> engine_state) {
  Bytes out(kSnapshotMagic, kSnapshotMagic + sizeof(kSnapshotMagic));
  put_u64(out, seq);
  put_u64(out, parts.size());
  for (const auto& p : parts) {
    BFT_ASSERT(p != nullptr);
    BFT_ASSERT(p->size() <= kPartitionBytesMax);
    put_u32(out, static_cast<std::uint32_t>(p->size()));
    out.insert(out.end(), p->begin(), p->end());
  }
  put_u64(out, engine_state.size());
  out.insert(out.end(), engine_state.begin(), engine_state.end());
  const Digest d = digest_of(out);
  out.insert(out.end(), d.bytes.begin(), d.bytes.end());
  return out;
}

// Returns "" and fills seq/parts/engine_state, or the reason the blob is not a valid snapshot of
// `partition_count` partitions (either format; a BFTSNAP1 blob has an empty engine state).
inline std::string decode_snapshot_blob(std::span<const std::uint8_t> blob, std::uint64_t partition_count,
                                        std::uint64_t& seq, std::vector<Bytes>& parts, Bytes& engine_state) {
  if (blob.size() < sizeof(kSnapshotMagic) + 16 + kDigestBytes) return "shorter than the fixed fields";
  const auto body = blob.first(blob.size() - kDigestBytes);
  Digest stored;
  std::memcpy(stored.bytes.data(), blob.data() + body.size(), kDigestBytes);
  if (digest_of(body) != stored) return "checksum mismatch (corrupt or truncated)";
  Reader r(body);
  std::span<const std::uint8_t> magic;
  if (!r.bytes(sizeof(kSnapshotMagic), magic)) return "truncated magic";
  const bool v1 = std::memcmp(magic.data(), kSnapshotMagicV1, sizeof(kSnapshotMagicV1)) == 0;
  if (!v1 && std::memcmp(magic.data(), kSnapshotMagic, sizeof(kSnapshotMagic)) != 0) return "bad magic";
  std::uint64_t count = 0;
  if (!r.u64(seq)) return "truncated seq";
  if (!r.u64(count)) return "truncated partition count";
  if (count != partition_count) return "partition count " + std::to_string(count) + " != " +
                                       std::to_string(partition_count);
  parts.clear();
  parts.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint32_t size = 0;
    if (!r.u32(size)) return "truncated size of partition " + std::to_string(i);
    if (size > kPartitionBytesMax) return "partition " + std::to_string(i) + " over kPartitionBytesMax";
    std::span<const std::uint8_t> data;
    if (!r.bytes(size, data)) return "truncated partition " + std::to_string(i);
    parts.emplace_back(data.begin(), data.end());
  }
  engine_state.clear();
  if (!v1) {
    std::uint64_t size = 0;
    std::span<const std::uint8_t> data;
    if (!r.u64(size)) return "truncated engine state size";
    if (size > r.remaining() || !r.bytes(static_cast<std::size_t>(size), data)) return "truncated engine state";
    engine_state.assign(data.begin(), data.end());
  }
  if (r.remaining() != 0) return "trailing bytes";
  return "";
}

// A fatal operating error at start-up: the durable state exists but cannot be used. Stopping is the only safe
// answer (the replica's promises rest on it); the operator can wipe the replica's state so that it rejoins by
// state transfer.
[[noreturn]] inline void fatal_snapshot(const std::string& name, const std::string& why) {
  LOG_ERROR("", "snapshot %s unusable: %s; refusing to start (remove this replica's state to rejoin by state "
                "transfer)", name.c_str(), why.c_str());
  std::fprintf(stderr, "fatal: snapshot %s unusable: %s\n", name.c_str(), why.c_str());
  std::abort();
}

class CheckpointKeeper {
 public:
  struct Snapshot {
    std::uint64_t seq = 0;
    PartitionTree tree;
    std::vector<PartitionBytes> parts;
  };

  // `initial` holds the encoded partitions of the service's initial state. If `store` holds a blob named
  // `name`, the newest checkpoint is loaded from it (fatal if it is invalid); else the initial state is
  // checkpoint 0. Either way that checkpoint is retained and is recovered(), with recovered_engine_state().
  CheckpointKeeper(std::string name, SnapshotStore* store, std::vector<Bytes> initial)
      : name_(std::move(name)), store_(store), latest_(make_snapshot(0, std::move(initial))) {
    Bytes blob;
    if (store_ != nullptr && store_->get(name_, blob)) {
      std::uint64_t seq = 0;
      std::vector<Bytes> parts;
      const std::string why = decode_snapshot_blob(blob, latest_.parts.size(), seq, parts, recovered_engine_state_);
      if (!why.empty()) fatal_snapshot(name_, why);
      latest_ = make_snapshot(seq, std::move(parts));
    }
    retained_.emplace(latest_.seq, latest_);
    recovered_ = CheckpointId{latest_.seq, latest_.tree.root()};
    latest_engine_state_ = recovered_engine_state_;
  }

  const std::string& name() const { return name_; }
  std::uint64_t partition_count() const { return latest_.parts.size(); }
  CheckpointId recovered() const { return recovered_; }
  // The engine state stored with recovered() (empty for the initial state or a BFTSNAP1 blob).
  const Bytes& recovered_engine_state() const { return recovered_engine_state_; }
  // The engine state stored with latest().
  const Bytes& latest_engine_state() const { return latest_engine_state_; }
  // The newest checkpoint (taken, installed or recovered); never discarded.
  const Snapshot& latest() const { return latest_; }

  // Records checkpoint `seq` = the newest checkpoint with `changed` partitions replaced, retains it and makes
  // it durable together with `engine_state` (one blob). Precondition: seq >= latest().seq.
  CheckpointId take(std::uint64_t seq, std::map<std::uint64_t, Bytes> changed,
                    std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(seq >= latest_.seq);
    Snapshot next{seq, latest_.tree, latest_.parts};
    apply(next, std::move(changed));
    return commit_snapshot(std::move(next), engine_state);
  }

  // Drops retained checkpoints below `seq`; latest() stays readable (it is what an install starts from).
  void discard_below(std::uint64_t seq) {
    for (auto it = retained_.begin(); it != retained_.end() && it->first < seq;) it = retained_.erase(it);
  }

  const Snapshot& retained(std::uint64_t seq) const {
    auto it = retained_.find(seq);
    if (it != retained_.end()) return it->second;
    BFT_ASSERT(seq == latest_.seq);  // precondition of the Service accessors: the checkpoint is retained
    return latest_;
  }

  // ---- install (state transfer) ----
  // The install starts from the newest checkpoint: it is the local tree a StateFetcher compares against, so
  // the partitions the fetcher skipped are exactly those of this base.
  void begin_install() {
    staging_ = latest_.parts;
    staged_.clear();
    install_error_.clear();
  }
  void stage(std::uint64_t index, std::span<const std::uint8_t> data) {
    BFT_ASSERT(staging_.has_value());
    if (index >= staging_->size()) {
      install_error_ = "partition index " + std::to_string(index) + " out of range";
      return;
    }
    if (data.size() > kPartitionBytesMax) {
      install_error_ = "partition " + std::to_string(index) + " over kPartitionBytesMax";
      return;
    }
    (*staging_)[index] = std::make_shared<const Bytes>(data.begin(), data.end());
    staged_.insert(index);
  }
  bool installing() const { return staging_.has_value(); }
  const std::string& install_error() const { return install_error_; }
  const std::vector<PartitionBytes>& staging() const {
    BFT_ASSERT(staging_.has_value());
    return *staging_;
  }
  // Makes the staged state checkpoint `seq` (retained, durable with `engine_state`). Precondition: installing()
  // and no error.
  CheckpointId finish_install(std::uint64_t seq, std::span<const std::uint8_t> engine_state) {
    BFT_ASSERT(staging_.has_value());
    BFT_ASSERT(install_error_.empty());
    Snapshot next{seq, latest_.tree, std::move(*staging_)};
    for (std::uint64_t i : staged_) next.tree.set_leaf(i, PartitionTree::leaf_digest(i, *next.parts[i]));
    abort_install();
    return commit_snapshot(std::move(next), engine_state);
  }
  void abort_install() {
    staging_.reset();
    staged_.clear();
  }

 private:
  static Snapshot make_snapshot(std::uint64_t seq, std::vector<Bytes> parts) {
    BFT_ASSERT(!parts.empty());
    Snapshot s{seq, PartitionTree(parts.size(), Digest{}), {}};
    s.parts.reserve(parts.size());
    for (std::uint64_t i = 0; i < parts.size(); ++i) {
      s.tree.set_leaf(i, PartitionTree::leaf_digest(i, parts[i]));
      s.parts.push_back(std::make_shared<const Bytes>(std::move(parts[i])));
    }
    return s;
  }

  static void apply(Snapshot& s, std::map<std::uint64_t, Bytes> changed) {
    for (auto& [i, bytes] : changed) {
      BFT_ASSERT(i < s.parts.size());
      if (*s.parts[i] == bytes) continue;  // e.g. changed and rolled back: keep sharing the old bytes
      s.tree.set_leaf(i, PartitionTree::leaf_digest(i, bytes));
      s.parts[i] = std::make_shared<const Bytes>(std::move(bytes));
    }
  }

  CheckpointId commit_snapshot(Snapshot next, std::span<const std::uint8_t> engine_state) {
    const CheckpointId id{next.seq, next.tree.root()};
    // Durable before it is named: the engine sends CHECKPOINT for it as soon as we return.
    if (store_ != nullptr) store_->put(name_, encode_snapshot_blob(next.seq, next.parts, engine_state));
    retained_.insert_or_assign(next.seq, next);
    latest_ = std::move(next);
    latest_engine_state_.assign(engine_state.begin(), engine_state.end());
    return id;
  }

  std::string name_;
  SnapshotStore* store_;
  Snapshot latest_;
  std::map<std::uint64_t, Snapshot> retained_;
  CheckpointId recovered_;
  Bytes recovered_engine_state_;
  Bytes latest_engine_state_;
  std::optional<std::vector<PartitionBytes>> staging_;
  std::set<std::uint64_t> staged_;
  std::string install_error_;
};

}  // namespace bftfs::services_internal
