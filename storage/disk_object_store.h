// The file service's state on disk (docs/FILESERVICE.md §6): a CheckpointedStore (services/fs/checkpointed_store.h)
// whose values live in a data file and whose index, with a checksum per value, lives in a separate journal file.
// Memory holds the index (key -> extent and checksum), the partition sizes and trees, never the values.
//
// Files in the store's directory:
//   data   values, appended (copy-on-write: a put never overwrites bytes a checkpoint may still name);
//          data.<g> after the g-th compaction (the journal's header names the generation in force)
//   index  a journal of records, each  u32 body_len || u32 crc32c(body) || body:
//            HEADER  u8 3 || "BFTFSIDX" || u32 version (1) || u64 partitions || u64 data generation  (first)
//            PART    u8 1 || u64 p || leaf digest (32) || u32 n || n * (key || u64 offset || u32 len || u32 crc)
//            COMMIT  u8 4 || u64 seq || u64 data_end || u64 partitions || root digest (32)
//                    || u32 n || n bytes of engine state (protocol/service.h)
//          PARTs replace the whole content of their partition, and take effect only with the COMMIT after them;
//          a checkpoint appends one PART per changed partition and a COMMIT. That is the checkpoint: an index
//          version, O(changed partitions), made durable by fdatasync(data) then fdatasync(index). The engine
//          state rides in the COMMIT so that the same fdatasync makes it durable with the checkpoint. A journal
//          written before engine states were stored has COMMITs of type 2 (the same fields without the engine
//          state); they still load, with an empty engine state (the engine then pairs the checkpoint with the
//          client table of its log, as it did then), and the next checkpoint appends a type-4 COMMIT. A binary
//          older than type 4 refuses such a journal ("unknown index record type 4").
//
// Checksums kept apart (Gaios's rule): a value's crc32c (over its key's encoding, then its bytes) is in the
// index, never next to the value, and the two files are written by separate I/Os. A misdirected, lost or torn
// write of a value, or bit rot, cannot produce a value and a matching checksum: every read verifies, and a
// mismatch (or an I/O error) is never returned: get() returns null, corrupt_reads() counts it and the
// partition is marked corrupt until an install replaces it (the engine then fetches it from the peers).
//
// Recovery on open: the journal is read up to the last complete COMMIT whose records all pass their crc (a
// torn tail from a crash is cut off), the tree is rebuilt from the PART leaf digests and checked against the
// COMMIT's root, and the data file is cut back to the COMMIT's data_end (values written after the checkpoint
// belong to executions the engine replays from its log). The journal is rewritten whole (temporary file,
// fsync, rename) when it grows past twice its live size, and the data file is compacted into the next
// generation (the referenced extents copied, then the rewritten journal's rename switches) when it grows past
// twice the bytes still referenced.
//
// I/O errors other than on reads (a full or failing host disk) stop the process: a replica that cannot persist
// must stop. Single-threaded: owned by the replica's event loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "os/unique_fd.h"
#include "services/fs/checkpointed_store.h"

namespace bftfs {

struct DiskStoreOptions {
  std::uint64_t partitions = 1u << 16;               // must equal the file service's FsOptions::partitions
  std::uint64_t index_compact_bytes_min = 64u << 20;  // the journal is rewritten only beyond this size
  std::uint64_t data_compact_bytes_min = 256u << 20;  // dead extents are reclaimed only beyond this size
};

struct DiskStoreStats {
  std::uint64_t data_file_bytes = 0;
  std::uint64_t live_value_bytes = 0;   // bytes of the values of the current objects
  std::uint64_t index_file_bytes = 0;
  std::uint64_t checkpoints = 0;        // since open
  std::uint64_t index_compactions = 0;  // since open
  std::uint64_t data_compactions = 0;   // since open
  std::uint64_t values_written = 0;     // since open
  std::uint64_t value_reads = 0;        // from the data file (every read: no cache above the page cache)
  std::uint64_t corrupt_reads = 0;      // since open
};

class DiskObjectStore final : public fs::CheckpointedStore {
 public:
  // Opens (creating if needed) the store in `dir`. Returns "" or why it cannot be used (the replica then
  // refuses to start; wiping the directory makes it rejoin by state transfer).
  [[nodiscard]] static std::string open(const std::string& dir, const DiskStoreOptions& options,
                                        std::unique_ptr<DiskObjectStore>& out);
  ~DiskObjectStore() override;
  DiskObjectStore(const DiskObjectStore&) = delete;
  DiskObjectStore& operator=(const DiskObjectStore&) = delete;

  // ObjectStore and CheckpointedStore: see services/fs/.
  std::uint64_t partition_count() const override;
  fs::Value get(const fs::ObjectKey& key) const override;
  std::uint64_t put(const fs::ObjectKey& key, fs::Value value) override;
  void erase(const fs::ObjectKey& key) override;
  std::optional<fs::ObjectKey> first_at_or_after(const fs::ObjectKey& from) const override;
  void for_each_in_partition(std::uint64_t p,
                             const std::function<void(const fs::ObjectKey&, const fs::Value&)>& fn) const override;
  std::uint64_t partition_bytes(std::uint64_t p) const override;
  std::uint64_t object_count() const override;
  std::uint64_t corrupt_reads() const override;
  const std::set<std::uint64_t>& corrupt_partitions() const override;
  bool has_checkpoint() const override;
  CheckpointId latest() const override;
  Bytes latest_engine_state() const override;
  std::optional<CheckpointId> checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_below(std::uint64_t seq) override;
  const PartitionTree& tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t p) const override;
  void begin_install() override;
  void stage_partition(std::uint64_t p, std::vector<std::pair<fs::ObjectKey, fs::Value>> objects) override;
  CheckpointId finish_install(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void abort_install() override;

  // ---- maintenance and inspection ----
  // Reads and verifies every value of the current objects; marks the partitions of the
  // failing ones corrupt. Returns how many failed.
  std::uint64_t scrub();
  DiskStoreStats stats() const;
  // Where the value of `key` lies in the data file: {offset, length} (tests corrupt it there).
  std::optional<std::pair<std::uint64_t, std::uint32_t>> extent_of(const fs::ObjectKey& key) const;
  // The data file in force (its name changes with each compaction).
  const std::string& data_path() const;

 private:
  struct Impl;
  explicit DiskObjectStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
