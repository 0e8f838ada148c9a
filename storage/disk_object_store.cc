// DiskObjectStore: see disk_object_store.h for the format and the rules.
#include "storage/disk_object_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <unordered_map>

#include "common/assert.h"
#include "common/codec.h"
#include "common/log.h"
#include "protocol/messages.h"
#include "os/clock.h"
#include "storage/crc32c.h"

namespace bftfs {

using fs::ObjectKey;
using fs::Value;

namespace {

constexpr std::uint8_t kRecPart = 1;
constexpr std::uint8_t kRecCommit = 2;
constexpr std::uint8_t kRecHeader = 3;
constexpr char kMagic[8] = {'B', 'F', 'T', 'F', 'S', 'I', 'D', 'X'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kRecordBytesMax = 1u << 30;  // a PART of a partition at kPartitionBytesMax fits easily

[[noreturn]] void die(const char* what, const std::string& path) {
  LOG_ERROR("", "fs store: %s %s: %s; stopping (cannot persist)", what, path.c_str(), std::strerror(errno));
  std::fprintf(stderr, "fatal: fs store: %s %s: %s\n", what, path.c_str(), std::strerror(errno));
  std::abort();
}

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes all of `data` at `offset`. Returns 0 or the errno.
int pwrite_all(int fd, const std::uint8_t* data, std::size_t size, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    done += static_cast<std::size_t>(w);
  }
  return 0;
}

// Reads up to `size` bytes at `offset`; returns how many (short at end of file), or -1 with errno.
ssize_t pread_all(int fd, std::uint8_t* data, std::size_t size, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t r = ::pread(fd, data + done, size - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

struct Extent {
  std::uint64_t offset = 0;
  std::uint32_t len = 0;
  std::uint32_t crc = 0;  // crc32c over the key's encoding, then the value
  friend bool operator==(const Extent&, const Extent&) = default;
};

std::uint32_t value_crc(const ObjectKey& key, std::span<const std::uint8_t> value) {
  Bytes k;
  fs::encode_key(key, k);
  return crc32c(crc32c(0, k), value);
}

// A partition's content as the index names it: keys in increasing order.
using Content = std::vector<std::pair<ObjectKey, Extent>>;

}  // namespace

struct DiskObjectStore::Impl {
  struct Slot {
    Extent ext;
    std::uint64_t partition = 0;
  };
  struct Version {
    PartitionTree tree;
    // Content at this checkpoint of the partitions changed after it (filled when the next checkpoint is taken).
    std::map<std::uint64_t, Content> frozen;
  };

  DiskStoreOptions options;
  std::string dir;
  std::string data_path;
  std::string index_path;
  UniqueFd dir_fd;
  UniqueFd data_fd;
  UniqueFd index_fd;
  std::uint64_t data_generation = 0;  // the data file is data (generation 0) or data.<generation>
  std::uint64_t data_end = 0;   // where the next value is appended
  std::uint64_t writeback_start = 0;  // the data file's bytes below this have been handed to writeback
  std::uint64_t index_end = 0;  // where the next journal record is appended

  std::map<ObjectKey, Slot> index;
  std::set<std::pair<std::uint64_t, ObjectKey>> by_partition;
  std::vector<std::uint64_t> part_bytes;
  std::uint64_t live_value_bytes = 0;

  bool has_checkpoint = false;
  std::uint64_t latest_seq = 0;
  std::map<std::uint64_t, Version> versions;  // retained checkpoints; the last is latest_seq
  std::set<std::uint64_t> dirty;              // partitions changed since latest_seq
  // Leaf digests of dirty partitions computed ahead of the checkpoint (changed()), each with the content it
  // covers: used by checkpoint() only while the partition still has exactly that content.
  struct CachedLeaf {
    Content content;
    Digest leaf;
  };
  std::map<std::uint64_t, CachedLeaf> leaf_cache;
  std::deque<std::uint64_t> digest_queue;  // partitions in the order they changed (repeats allowed), bounded
  std::unordered_map<std::uint64_t, std::uint32_t> digest_queued;  // occurrences of each partition in it
  std::map<std::uint64_t, Content> frozen;    // their content at latest_seq, captured before the first change
  std::vector<std::uint64_t> part_record_bytes;  // size of each partition's newest PART record (0: none)
  std::uint64_t live_index_bytes = 0;            // sum of part_record_bytes: what a rewritten journal holds

  std::optional<std::map<std::uint64_t, Content>> staged;
  std::map<std::uint64_t, Digest> staged_leaves;

  mutable std::set<std::uint64_t> corrupt;
  mutable std::uint64_t corrupt_read_count = 0;
  mutable DiskStoreStats stats;

  // ---- values ----

  Extent write_value(const ObjectKey& key, const Bytes& v) {
    BFT_ASSERT(v.size() <= UINT32_MAX);
    Extent e{data_end, static_cast<std::uint32_t>(v.size()), value_crc(key, v)};
    if (pwrite_all(data_fd.get(), v.data(), v.size(), data_end) != 0) die("cannot write", data_path);
    data_end += v.size();
    stats.values_written++;
    start_writeback();
    return e;
  }

  // The checkpoint's fdatasync(data) must wait only for the values written since the last kWritebackBytes,
  // not for everything since the previous checkpoint: a checkpoint interval of large writes is up to a
  // gigabyte of values, and its fdatasync blocked the event loop for tens of seconds (four replicas sharing
  // one disk), long enough for the peers to suspect the primary and change views. So writeback of the
  // appended values starts as they accumulate (asynchronous: SYNC_FILE_RANGE_WRITE waits for no I/O to
  // complete; this is a hint for the order of the disk's work, never a durability promise, which stays with
  // the fdatasync).
  static constexpr std::uint64_t kWritebackBytes = 4u << 20;
  void start_writeback() {
    if (data_end - writeback_start < kWritebackBytes) return;
    // Failure only loses the hint (the fdatasync at the checkpoint writes everything anyway).
    (void)::sync_file_range(data_fd.get(), static_cast<off64_t>(writeback_start),
                            static_cast<off64_t>(data_end - writeback_start), SYNC_FILE_RANGE_WRITE);
    writeback_start = data_end;
  }

  // Reads the extent into `out` (always e.len bytes: zeros where the file ended) and verifies it. On a mismatch
  // or an I/O error the partition is marked corrupt and false is returned; `out` then holds what was read.
  bool read_value(const ObjectKey& key, const Extent& e, std::uint64_t partition, Bytes& out) const {
    out.assign(e.len, 0);
    stats.value_reads++;
    const ssize_t n = pread_all(data_fd.get(), out.data(), out.size(), e.offset);
    const int read_errno = n < 0 ? errno : 0;
    if (n == static_cast<ssize_t>(e.len) && value_crc(key, out) == e.crc) return true;
    corrupt_read_count++;
    stats.corrupt_reads++;
    if (corrupt.insert(partition).second) {
      LOG_WARN("", "fs store: value at %llu+%u in partition %llu fails its checksum%s%s; partition marked corrupt",
               static_cast<unsigned long long>(e.offset), e.len, static_cast<unsigned long long>(partition),
               read_errno != 0 ? ": " : "", read_errno != 0 ? std::strerror(read_errno) : "");
    }
    return false;
  }

  // ---- partitions ----

  Content content_of(std::uint64_t p) const {
    Content c;
    for (auto it = by_partition.lower_bound({p, ObjectKey{}}); it != by_partition.end() && it->first == p; ++it) {
      c.emplace_back(it->second, index.at(it->second).ext);
    }
    return c;
  }

  // The first change to partition p since the latest checkpoint keeps its content at that checkpoint.
  void touch(std::uint64_t p) {
    if (dirty.insert(p).second) frozen.emplace(p, content_of(p));
  }

  // A checkpoint digests every partition changed since the last one, reading its values back: after a
  // checkpoint interval of large writes that is up to a gigabyte, and hashing it took seconds on the event
  // loop at one go, during which the replica answers nobody (its peers suspected the primary and changed
  // views). So partitions are digested as they fall kDigestLag changes behind, spreading the work over the
  // interval (a partition still changing, like a file's inode, is left for later). The cache entry names the
  // content it covers, so a later change, a rollback or an install simply makes it unused.
  static constexpr std::size_t kDigestLag = 256;
  void changed(std::uint64_t p) {
    digest_queue.push_back(p);
    ++digest_queued[p];
    while (digest_queue.size() > kDigestLag) {
      const std::uint64_t q = digest_queue.front();
      digest_queue.pop_front();
      auto n = digest_queued.find(q);
      BFT_ASSERT(n != digest_queued.end() && n->second > 0);
      if (--n->second > 0) continue;  // changed again since: digested when its last change falls behind
      digest_queued.erase(n);
      if (dirty.count(q) == 0) continue;
      Content c = content_of(q);
      auto it = leaf_cache.find(q);
      if (it != leaf_cache.end() && it->second.content == c) continue;
      const std::uint64_t before = corrupt_read_count;
      const Digest leaf = PartitionTree::leaf_digest(q, encode_content(q, c));
      if (corrupt_read_count != before) continue;  // the checkpoint reads it again and refuses
      leaf_cache.insert_or_assign(q, CachedLeaf{std::move(c), leaf});
    }
  }

  // The leaf digest of dirty partition p now, from the cache if it still holds.
  Digest current_leaf(std::uint64_t p) {
    Content c = content_of(p);
    auto it = leaf_cache.find(p);
    if (it != leaf_cache.end() && it->second.content == c) return it->second.leaf;
    return PartitionTree::leaf_digest(p, encode_content(p, c));
  }

  void forget_cached_leaves() {
    leaf_cache.clear();
    digest_queue.clear();
    digest_queued.clear();
  }

  void index_put(const ObjectKey& key, const Extent& e, std::uint64_t p) {
    auto it = index.find(key);
    if (it == index.end()) {
      index.emplace(key, Slot{e, p});
      by_partition.emplace(p, key);
      part_bytes[p] += fs::encoded_key_bytes(key) + 4 + e.len;
    } else {
      live_value_bytes -= it->second.ext.len;
      part_bytes[p] -= it->second.ext.len;
      part_bytes[p] += e.len;
      it->second.ext = e;
    }
    live_value_bytes += e.len;
  }

  void index_erase(const ObjectKey& key) {
    auto it = index.find(key);
    if (it == index.end()) return;
    const std::uint64_t p = it->second.partition;
    part_bytes[p] -= fs::encoded_key_bytes(key) + 4 + it->second.ext.len;
    live_value_bytes -= it->second.ext.len;
    by_partition.erase({p, key});
    index.erase(it);
  }

  void set_content(std::uint64_t p, const Content& c) {
    for (const ObjectKey& k : keys_of(p)) index_erase(k);
    for (const auto& [k, e] : c) index_put(k, e, p);
  }

  std::vector<ObjectKey> keys_of(std::uint64_t p) const {
    std::vector<ObjectKey> keys;
    for (auto it = by_partition.lower_bound({p, ObjectKey{}}); it != by_partition.end() && it->first == p; ++it) {
      keys.push_back(it->second);
    }
    return keys;
  }

  // The canonical partition encoding of `c`, reading every value (verified; a failure leaves wrong bytes of
  // the right size and marks p corrupt).
  Bytes encode_content(std::uint64_t p, const Content& c) const {
    Bytes out;
    ByteWriter w(out);
    w.u32(static_cast<std::uint32_t>(c.size()));
    Bytes v;
    for (const auto& [k, e] : c) {
      read_value(k, e, p, v);
      fs::encode_key(k, out);
      w.blob(v);
    }
    return out;
  }

  // Content of partition p at retained checkpoint seq: the frozen copy of the first version at or after seq
  // that changed p afterwards, else the current content (p unchanged since).
  Content content_at(std::uint64_t seq, std::uint64_t p) const {
    auto it = versions.find(seq);
    BFT_ASSERT(it != versions.end());  // precondition: retained
    for (; it != versions.end(); ++it) {
      const auto& fz = it->first == latest_seq ? frozen : it->second.frozen;
      if (auto f = fz.find(p); f != fz.end()) return f->second;
    }
    return content_of(p);
  }

  // ---- journal ----

  void append_record(Bytes& out, const Bytes& body) {
    BFT_ASSERT(body.size() <= kRecordBytesMax);
    ByteWriter w(out);
    w.u32(static_cast<std::uint32_t>(body.size()));
    w.u32(crc32c(0, body));
    out.insert(out.end(), body.begin(), body.end());
  }

  static Bytes header_body(std::uint64_t partitions, std::uint64_t generation) {
    Bytes b;
    b.reserve(1 + sizeof kMagic + 20);  // (also keeps GCC 12's -Warray-bounds quiet about the growing vector)
    ByteWriter w(b);
    w.u8(kRecHeader);
    w.bytes(std::string_view(kMagic, sizeof kMagic));
    w.u32(kVersion);
    w.u64(partitions);
    w.u64(generation);
    return b;
  }

  std::string data_path_for(std::uint64_t generation) const {
    return generation == 0 ? dir + "/data" : dir + "/data." + std::to_string(generation);
  }

  static Bytes part_body(std::uint64_t p, const Digest& leaf, const Content& c) {
    Bytes b;
    ByteWriter w(b);
    w.u8(kRecPart);
    w.u64(p);
    w.bytes(leaf.bytes);
    w.u32(static_cast<std::uint32_t>(c.size()));
    for (const auto& [k, e] : c) {
      fs::encode_key(k, b);
      w.u64(e.offset);
      w.u32(e.len);
      w.u32(e.crc);
    }
    return b;
  }

  Bytes commit_body(std::uint64_t seq, const Digest& root) const {
    Bytes b;
    ByteWriter w(b);
    w.u8(kRecCommit);
    w.u64(seq);
    w.u64(data_end);
    w.u64(options.partitions);
    w.bytes(root.bytes);
    return b;
  }

  void append_to_index(const Bytes& records) {
    if (pwrite_all(index_fd.get(), records.data(), records.size(), index_end) != 0) die("cannot write", index_path);
    index_end += records.size();
  }

  // Makes the current objects checkpoint `seq` with the given new leaf digests of the dirty partitions.
  CheckpointId commit_checkpoint(std::uint64_t seq, const std::map<std::uint64_t, Digest>& leaves) {
    BFT_ASSERT(leaves.size() == dirty.size());
    PartitionTree next = has_checkpoint ? versions.rbegin()->second.tree : empty_tree();
    Bytes records;
    for (const auto& [p, leaf] : leaves) {
      BFT_ASSERT(dirty.count(p) == 1);
      next.set_leaf(p, leaf);
      const std::size_t before = records.size();
      append_record(records, part_body(p, leaf, content_of(p)));
      live_index_bytes -= part_record_bytes[p];
      part_record_bytes[p] = records.size() - before;
      live_index_bytes += part_record_bytes[p];
    }
    const Digest root = next.root();
    append_record(records, commit_body(seq, root));
    // Values first, then the index that names them: after a crash the index never names a lost value.
    if (::fdatasync(data_fd.get()) != 0) die("cannot fdatasync", data_path);
    append_to_index(records);
    if (::fdatasync(index_fd.get()) != 0) die("cannot fdatasync", index_path);
    BFT_ASSERT(!has_checkpoint || seq >= latest_seq);
    if (has_checkpoint && seq == latest_seq) {
      // An install at the latest checkpoint's own seq replaces it (protocol/service.h). What it held for the
      // partitions changing now is also the content of the older versions that did not change them since: it
      // goes to the version before it (its own frozen copies, of changes made after it, win).
      auto replaced = versions.find(seq);
      BFT_ASSERT(replaced != versions.end());
      if (replaced != versions.begin()) {
        auto& older = std::prev(replaced)->second.frozen;
        for (auto& [p, c] : frozen) older.emplace(p, std::move(c));
      }
    } else if (has_checkpoint) {
      versions.rbegin()->second.frozen = std::move(frozen);
    }
    frozen.clear();
    dirty.clear();
    versions.insert_or_assign(seq, Version{std::move(next), {}});
    latest_seq = seq;
    has_checkpoint = true;
    stats.checkpoints++;
    maybe_compact_data();  // (rewrites the journal when it runs)
    maybe_compact_index();
    return CheckpointId{seq, root};
  }

  PartitionTree empty_tree() const {
    PartitionTree t(options.partitions, Digest{});
    const Bytes empty = fs::empty_partition_bytes();
    for (std::uint64_t p = 0; p < options.partitions; ++p) t.set_leaf(p, PartitionTree::leaf_digest(p, empty));
    return t;
  }

  // Rewrites the journal as one PART per non-empty partition and one COMMIT, when it has grown past twice
  // that size: amortized O(1) per PART appended. Called right after a checkpoint (current = latest).
  void maybe_compact_index() {
    if (index_end < options.index_compact_bytes_min || index_end < 2 * live_index_bytes + 4096) return;
    rewrite_index(data_generation);
    stats.index_compactions++;
  }

  // Atomically replaces the journal by one naming data file `generation` (written to a temporary file, fsynced,
  // renamed, directory fsynced). Precondition: current = latest (right after a checkpoint).
  void rewrite_index(std::uint64_t generation) {
    BFT_ASSERT(dirty.empty());
    const PartitionTree& t = versions.rbegin()->second.tree;
    Bytes records;
    append_record(records, header_body(options.partitions, generation));
    for (std::uint64_t p = 0; p < options.partitions; ++p) {
      if (part_record_bytes[p] == 0) continue;
      const std::size_t before = records.size();
      append_record(records, part_body(p, t.leaf(p), content_of(p)));
      part_record_bytes[p] = records.size() - before;
    }
    append_record(records, commit_body(latest_seq, t.root()));
    const std::string tmp = index_path + ".tmp";
    UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) die("cannot create", tmp);
    if (pwrite_all(fd.get(), records.data(), records.size(), 0) != 0) die("cannot write", tmp);
    if (::fsync(fd.get()) != 0) die("cannot fsync", tmp);
    if (::rename(tmp.c_str(), index_path.c_str()) != 0) die("cannot rename", tmp);
    if (::fsync(dir_fd.get()) != 0) die("cannot fsync directory", dir);
    index_fd = std::move(fd);
    index_end = records.size();
    live_index_bytes = 0;
    for (std::uint64_t b : part_record_bytes) live_index_bytes += b;
  }

  // Reclaims dead extents (overwritten or erased values no retained checkpoint names) once the data file is
  // more than twice what is still referenced: the referenced extents are copied, in offset order, to the next
  // generation's file, which a rewritten journal then names (the rename of the journal is the switch; a crash
  // before it leaves the old pair in force, and open removes the orphan). Amortized O(1) per byte written;
  // a pause of O(live bytes) at the checkpoint that triggers it. Called right after a checkpoint.
  void maybe_compact_data() {
    if (data_end < options.data_compact_bytes_min || data_end < 2 * live_value_bytes + 4096) return;
    // Every extent named by the current objects or a retained checkpoint's frozen content.
    // Keyed by (offset, length): an empty value has the offset of the value appended after it.
    std::set<std::pair<std::uint64_t, std::uint32_t>> referenced;
    for (const auto& [k, slot] : index) referenced.emplace(slot.ext.offset, slot.ext.len);
    for (const auto& [seq, v] : versions) {
      for (const auto& [p, c] : v.frozen) {
        for (const auto& [k, e] : c) referenced.emplace(e.offset, e.len);
      }
    }
    std::uint64_t referenced_bytes = 0;
    for (const auto& [off, len] : referenced) referenced_bytes += len;
    if (data_end < 2 * referenced_bytes + 4096) return;
    const std::uint64_t next_gen = data_generation + 1;
    const std::string next_path = data_path_for(next_gen);
    UniqueFd next(::open(next_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!next.valid()) die("cannot create", next_path);
    std::map<std::pair<std::uint64_t, std::uint32_t>, std::uint64_t> moved;  // old (offset, length) -> new offset
    std::uint64_t end = 0;
    Bytes buf;
    for (const auto& [off, len] : referenced) {
      buf.resize(len);
      // Copied as they are: a corrupt extent stays corrupt (its checksum is in the index) and is found when read.
      if (pread_all(data_fd.get(), buf.data(), len, off) != static_cast<ssize_t>(len)) die("cannot read", data_path);
      if (pwrite_all(next.get(), buf.data(), len, end) != 0) die("cannot write", next_path);
      moved.emplace(std::make_pair(off, len), end);
      end += len;
    }
    if (::fdatasync(next.get()) != 0) die("cannot fdatasync", next_path);
    const auto remap = [&](Extent& e) { e.offset = moved.at({e.offset, e.len}); };
    for (auto& [k, slot] : index) remap(slot.ext);
    for (auto& [seq, v] : versions) {
      for (auto& [p, c] : v.frozen) {
        for (auto& [k, e] : c) remap(e);
      }
    }
    const std::string old_path = data_path;
    data_fd = std::move(next);
    data_path = next_path;
    data_generation = next_gen;
    data_end = end;
    writeback_start = end;  // the new file was fdatasynced whole
    rewrite_index(next_gen);  // the switch
    if (::unlink(old_path.c_str()) != 0) die("cannot remove", old_path);
    stats.data_compactions++;
  }

  // ---- open ----

  // Opens data file `generation` and removes every other generation's (an orphan of a compaction that
  // crashed before its switch, or the old file of one that crashed after it).
  std::string open_data(std::uint64_t generation) {
    data_path = data_path_for(generation);
    data_fd.reset(::open(data_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!data_fd.valid()) return errno_text("cannot open", data_path);
    for (std::uint64_t g = 0; g <= generation + 1; ++g) {
      if (g == generation) continue;
      const std::string other = data_path_for(g);
      if (::unlink(other.c_str()) != 0 && errno != ENOENT) return errno_text("cannot remove", other);
    }
    return "";
  }

  // What replaying the index journal found: the partitions of the last complete checkpoint (PART records
  // followed by their COMMIT), and where the journal's valid prefix ends.
  struct JournalReplay {
    bool header = false;
    std::map<std::uint64_t, std::pair<Digest, Content>> committed;
    std::map<std::uint64_t, std::pair<Digest, Content>> pending;  // PARTs not yet followed by a COMMIT
    bool any_commit = false;
    std::uint64_t commit_seq = 0;
    std::uint64_t commit_data_end = 0;
    Digest commit_root;
    std::size_t good_end = 0;  // end of the last record that completes something (the header or a COMMIT)
  };

  // Opens the store: a new one if the index is empty, else the last complete checkpoint of the journal, with
  // the index and the data file cut back to it.
  std::string load() {
    Bytes file;
    if (std::string e = read_index(file); !e.empty()) return e;
    part_bytes.assign(options.partitions, fs::empty_partition_bytes().size());
    part_record_bytes.assign(options.partitions, 0);
    if (file.empty()) return create_new();
    JournalReplay replay;
    if (std::string e = replay_journal(file, replay); !e.empty()) return e;
    if (!replay.header) return "index has no valid header";
    if (std::string e = open_data(data_generation); !e.empty()) return e;
    if (std::string e = cut_index_after(file.size(), replay.good_end); !e.empty()) return e;
    for (std::uint64_t p = 0; p < options.partitions; ++p) {
      if (replay.committed.count(p) == 0) part_record_bytes[p] = 0;  // only pending (discarded) records named it
    }
    live_index_bytes = 0;
    for (std::uint64_t b : part_record_bytes) live_index_bytes += b;
    if (!replay.any_commit) {
      if (::ftruncate(data_fd.get(), 0) != 0) return errno_text("cannot truncate", data_path);
      return "";
    }
    if (std::string e = cut_data_to(replay); !e.empty()) return e;
    return install_committed(replay);
  }

  std::string read_index(Bytes& file) {
    struct stat sb{};
    if (::fstat(index_fd.get(), &sb) != 0) return errno_text("cannot stat", index_path);
    file.resize(static_cast<std::size_t>(sb.st_size));
    if (pread_all(index_fd.get(), file.data(), file.size(), 0) != static_cast<ssize_t>(file.size())) {
      return errno_text("cannot read", index_path);
    }
    return "";
  }

  // A new store: the header, durable with its directory entry.
  std::string create_new() {
    Bytes rec;
    append_record(rec, header_body(options.partitions, 0));
    append_to_index(rec);
    if (::fsync(index_fd.get()) != 0) return errno_text("cannot fsync", index_path);
    if (std::string e = open_data(0); !e.empty()) return e;
    if (::ftruncate(data_fd.get(), 0) != 0) return errno_text("cannot truncate", data_path);
    if (::fsync(dir_fd.get()) != 0) return errno_text("cannot fsync", dir);
    return "";
  }

  // Reads the journal's records in order until the first that is torn (a bad length or checksum: nothing
  // after it is trusted). A record that is whole but malformed is an error.
  std::string replay_journal(const Bytes& file, JournalReplay& replay) {
    std::size_t pos = 0;
    while (file.size() - pos >= 8) {
      const std::uint32_t len = load_u32_le(file.data() + pos);
      const std::uint32_t crc = load_u32_le(file.data() + pos + 4);
      if (len > kRecordBytesMax || len > file.size() - pos - 8) break;  // torn tail
      const std::span<const std::uint8_t> body(file.data() + pos + 8, len);
      if (crc32c(0, body) != crc) break;  // torn tail (or a damaged journal: nothing after it is trusted)
      ByteReader r(body);
      std::uint8_t type = 0;
      if (!r.u8(type)) return "index record at " + std::to_string(pos) + " is empty";
      std::string e;
      if (!replay.header) {
        e = read_header_record(type, r);
        replay.header = e.empty();
        replay.good_end = pos + 8 + len;  // a header alone is a valid, empty store
      } else if (type == kRecPart) {
        e = read_part_record(r, pos, len, replay);
      } else if (type == kRecCommit) {
        e = read_commit_record(r, pos, len, replay);
      } else {
        e = "unknown index record type " + std::to_string(type);
      }
      if (!e.empty()) return e;
      pos += 8 + len;
    }
    return "";
  }

  // The first record: magic, format version, the partition count the store was made for, the data generation.
  std::string read_header_record(std::uint8_t type, ByteReader& r) {
    Bytes m;
    std::uint32_t version = 0;
    std::uint64_t partitions = 0;
    if (type != kRecHeader || !r.bytes(sizeof kMagic, m) || std::memcmp(m.data(), kMagic, sizeof kMagic) != 0) {
      return "index does not start with a bftfs index header";
    }
    if (!r.u32(version) || version != kVersion) return "index version " + std::to_string(version) + " unknown";
    if (!r.u64(partitions) || partitions != options.partitions) {
      return "index made for " + std::to_string(partitions) + " partitions, the service has " +
             std::to_string(options.partitions);
    }
    if (!r.u64(data_generation) || !r.done()) return "malformed index header";
    return "";
  }

  // A PART record: one partition's leaf digest and content, pending until the COMMIT that follows it.
  std::string read_part_record(ByteReader& r, std::size_t pos, std::uint32_t len, JournalReplay& replay) {
    std::uint64_t p = 0;
    Bytes leaf;
    std::uint32_t n = 0;
    if (!r.u64(p) || p >= options.partitions || !r.bytes(kDigestBytes, leaf) || !r.u32(n)) {
      return "malformed PART record at " + std::to_string(pos);
    }
    if (n > r.remaining() / 27) return "PART record at " + std::to_string(pos) + " claims too many objects";
    std::pair<Digest, Content> part;
    std::memcpy(part.first.bytes.data(), leaf.data(), kDigestBytes);
    part.second.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      ObjectKey k;
      Extent e;
      if (!fs::read_key(r, k) || !r.u64(e.offset) || !r.u32(e.len) || !r.u32(e.crc)) {
        return "malformed object in PART record at " + std::to_string(pos);
      }
      if (fs::partition_of(k, options.partitions) != p) return "PART record at " + std::to_string(pos) + ": foreign key";
      if (!part.second.empty() && !(part.second.back().first < k)) return "PART keys not increasing";
      part.second.emplace_back(std::move(k), e);
    }
    if (!r.done()) return "trailing bytes in PART record at " + std::to_string(pos);
    replay.pending.insert_or_assign(p, std::move(part));
    part_record_bytes[p] = 8 + len;
    return "";
  }

  // A COMMIT record: the pending PARTs become the checkpoint's, which names the data file's end and its root.
  std::string read_commit_record(ByteReader& r, std::size_t pos, std::uint32_t len, JournalReplay& replay) {
    std::uint64_t seq = 0;
    std::uint64_t end = 0;
    std::uint64_t partitions = 0;
    Bytes root;
    if (!r.u64(seq) || !r.u64(end) || !r.u64(partitions) || !r.bytes(kDigestBytes, root) || !r.done()) {
      return "malformed COMMIT record at " + std::to_string(pos);
    }
    if (partitions != options.partitions) return "COMMIT for another partition count";
    if (replay.any_commit && (seq < replay.commit_seq || end < replay.commit_data_end)) {
      return "COMMIT records out of order";
    }
    for (auto& [p, part] : replay.pending) {
      for (const auto& [k, e] : part.second) {
        if (e.offset + e.len > end) return "PART names bytes beyond its COMMIT's data end";
      }
      replay.committed.insert_or_assign(p, std::move(part));
    }
    replay.pending.clear();
    replay.commit_seq = seq;
    replay.commit_data_end = end;
    std::memcpy(replay.commit_root.bytes.data(), root.data(), kDigestBytes);
    replay.any_commit = true;
    replay.good_end = pos + 8 + len;
    return "";
  }

  // Cuts the journal back to `good_end` (records after the last complete checkpoint: a crash mid-write),
  // durably, before anything is appended to it.
  std::string cut_index_after(std::size_t file_size, std::size_t good_end) {
    if (good_end < file_size) {
      LOG_WARN("", "fs store: discarding %zu bytes of index after the last complete checkpoint (a crash mid-write)",
               file_size - good_end);
      if (::ftruncate(index_fd.get(), static_cast<off_t>(good_end)) != 0) return errno_text("cannot truncate", index_path);
      if (::fsync(index_fd.get()) != 0) return errno_text("cannot fsync", index_path);
    }
    index_end = good_end;
    return "";
  }

  // The data file must hold every byte the checkpoint names (values were made durable before the index named
  // them); bytes after that end are cut off.
  std::string cut_data_to(const JournalReplay& replay) {
    struct stat ds{};
    if (::fstat(data_fd.get(), &ds) != 0) return errno_text("cannot stat", data_path);
    if (static_cast<std::uint64_t>(ds.st_size) < replay.commit_data_end) {
      return "data file is " + std::to_string(ds.st_size) + " bytes but checkpoint " +
             std::to_string(replay.commit_seq) + " names " + std::to_string(replay.commit_data_end) + " (lost writes)";
    }
    // Values appended after the checkpoint belong to executions the engine replays: drop them.
    if (static_cast<std::uint64_t>(ds.st_size) > replay.commit_data_end) {
      if (::ftruncate(data_fd.get(), static_cast<off_t>(replay.commit_data_end)) != 0) {
        return errno_text("cannot truncate", data_path);
      }
    }
    data_end = replay.commit_data_end;
    writeback_start = replay.commit_data_end;
    return "";
  }

  // Makes the committed partitions the current objects and the one retained checkpoint, once their leaves
  // give the root the COMMIT recorded.
  std::string install_committed(const JournalReplay& replay) {
    PartitionTree t = empty_tree();
    for (const auto& [p, part] : replay.committed) {
      t.set_leaf(p, part.first);
      for (const auto& [k, e] : part.second) index_put(k, e, p);
    }
    if (t.root() != replay.commit_root) return "index root differs from its COMMIT record (damaged index)";
    versions.emplace(replay.commit_seq, Version{std::move(t), {}});
    latest_seq = replay.commit_seq;
    has_checkpoint = true;
    return "";
  }
};

std::string DiskObjectStore::open(const std::string& dir, const DiskStoreOptions& options,
                                  std::unique_ptr<DiskObjectStore>& out) {
  out.reset();
  BFT_ASSERT(options.partitions > 0);
  auto m = std::make_unique<Impl>();
  m->options = options;
  m->dir = dir;
  m->index_path = dir + "/index";
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_text("cannot create directory", dir);
  m->dir_fd.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!m->dir_fd.valid()) return errno_text("cannot open directory", dir);
  m->index_fd.reset(::open(m->index_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!m->index_fd.valid()) return errno_text("cannot open", m->index_path);
  if (std::string why = m->load(); !why.empty()) return dir + ": " + why;
  out.reset(new DiskObjectStore(std::move(m)));
  return "";
}

DiskObjectStore::DiskObjectStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskObjectStore::~DiskObjectStore() = default;

std::uint64_t DiskObjectStore::partition_count() const { return impl_->options.partitions; }

Value DiskObjectStore::get(const ObjectKey& key) const {
  auto it = impl_->index.find(key);
  if (it == impl_->index.end()) return nullptr;
  Bytes v;
  if (!impl_->read_value(key, it->second.ext, it->second.partition, v)) return nullptr;
  return fs::make_value(std::move(v));
}

std::uint64_t DiskObjectStore::put(const ObjectKey& key, Value value) {
  BFT_ASSERT(value != nullptr);
  BFT_ASSERT(!impl_->staged.has_value());
  auto it = impl_->index.find(key);
  const std::uint64_t p = it != impl_->index.end() ? it->second.partition : fs::partition_of(key, partition_count());
  impl_->touch(p);
  const Extent e = impl_->write_value(key, *value);
  impl_->index_put(key, e, p);
  impl_->changed(p);
  return impl_->part_bytes[p];
}

void DiskObjectStore::erase(const ObjectKey& key) {
  BFT_ASSERT(!impl_->staged.has_value());
  auto it = impl_->index.find(key);
  if (it == impl_->index.end()) return;
  const std::uint64_t p = it->second.partition;
  impl_->touch(p);
  impl_->index_erase(key);
  impl_->changed(p);
}

std::optional<ObjectKey> DiskObjectStore::first_at_or_after(const ObjectKey& from) const {
  auto it = impl_->index.lower_bound(from);
  if (it == impl_->index.end()) return std::nullopt;
  return it->first;
}

void DiskObjectStore::for_each_in_partition(std::uint64_t p,
                                            const std::function<void(const ObjectKey&, const Value&)>& fn) const {
  BFT_ASSERT(p < partition_count());
  for (const auto& [k, e] : impl_->content_of(p)) {
    Bytes v;
    impl_->read_value(k, e, p, v);  // a failure is counted; the bytes passed on have the right size
    fn(k, fs::make_value(std::move(v)));
  }
}

std::uint64_t DiskObjectStore::partition_bytes(std::uint64_t p) const { return impl_->part_bytes[p]; }
std::uint64_t DiskObjectStore::object_count() const { return impl_->index.size(); }
std::uint64_t DiskObjectStore::corrupt_reads() const { return impl_->corrupt_read_count; }
const std::set<std::uint64_t>& DiskObjectStore::corrupt_partitions() const { return impl_->corrupt; }
bool DiskObjectStore::has_checkpoint() const { return impl_->has_checkpoint; }

CheckpointId DiskObjectStore::latest() const {
  BFT_ASSERT(impl_->has_checkpoint);
  return CheckpointId{impl_->latest_seq, impl_->versions.rbegin()->second.tree.root()};
}

std::optional<CheckpointId> DiskObjectStore::checkpoint(std::uint64_t seq) {
  Impl& m = *impl_;
  BFT_ASSERT(!m.staged.has_value());
  BFT_ASSERT(m.has_checkpoint ? seq > m.latest_seq : seq == 0);
  const std::uint64_t before = m.corrupt_read_count;
  const std::uint64_t t0 = mono_ns();
  std::map<std::uint64_t, Digest> leaves;
  for (std::uint64_t p : m.dirty) leaves.emplace(p, m.current_leaf(p));
  if (m.corrupt_read_count != before) return std::nullopt;  // a digest of bad bytes is never claimed
  m.forget_cached_leaves();
  const std::uint64_t t1 = mono_ns();
  const std::size_t partitions = leaves.size();
  CheckpointId id = m.commit_checkpoint(seq, leaves);
  const std::uint64_t t2 = mono_ns();
  // The checkpoint runs on the replica's event loop: a slow one delays everything (and peers' timers run).
  if (t2 - t0 > 500'000'000) {
    LOG_WARN("", "store: checkpoint s%llu took %.2f s (digests of %zu partitions %.2f s, durable %.2f s)",
             static_cast<unsigned long long>(seq), static_cast<double>(t2 - t0) / 1e9, partitions, static_cast<double>(t1 - t0) / 1e9,
             static_cast<double>(t2 - t1) / 1e9);
  }
  return id;
}

void DiskObjectStore::discard_below(std::uint64_t seq) {
  Impl& m = *impl_;
  for (auto it = m.versions.begin(); it != m.versions.end() && it->first < seq && it->first != m.latest_seq;) {
    it = m.versions.erase(it);
  }
}

const PartitionTree& DiskObjectStore::tree(std::uint64_t seq) const {
  auto it = impl_->versions.find(seq);
  BFT_ASSERT(it != impl_->versions.end());  // precondition: retained
  return it->second.tree;
}

Bytes DiskObjectStore::read_partition(std::uint64_t seq, std::uint64_t p) const {
  BFT_ASSERT(p < partition_count());
  return impl_->encode_content(p, impl_->content_at(seq, p));
}

void DiskObjectStore::begin_install() {
  BFT_ASSERT(impl_->has_checkpoint);
  BFT_ASSERT(!impl_->staged.has_value());
  impl_->staged.emplace();
  impl_->staged_leaves.clear();
}

void DiskObjectStore::stage_partition(std::uint64_t p, std::vector<std::pair<ObjectKey, Value>> objects) {
  Impl& m = *impl_;
  BFT_ASSERT(m.staged.has_value());
  BFT_ASSERT(p < partition_count());
  // The values go to the data file now (only their extents stay in memory); the leaf digest is computed from
  // the bytes in hand, which the engine verified against the fetched tree.
  m.staged_leaves.insert_or_assign(p, PartitionTree::leaf_digest(p, fs::encode_objects(objects)));
  Content c;
  c.reserve(objects.size());
  for (const auto& [k, v] : objects) {
    BFT_ASSERT(fs::partition_of(k, partition_count()) == p);
    c.emplace_back(k, m.write_value(k, *v));
  }
  m.staged->insert_or_assign(p, std::move(c));
}

CheckpointId DiskObjectStore::finish_install(std::uint64_t seq) {
  Impl& m = *impl_;
  BFT_ASSERT(m.staged.has_value());
  BFT_ASSERT(seq >= m.latest_seq);  // equal: it replaces the latest checkpoint (protocol/service.h)
  // Undo every change since the latest checkpoint (the install's base), then put the fetched partitions over it.
  for (auto& [p, c] : m.frozen) m.set_content(p, c);
  m.frozen.clear();
  m.dirty.clear();
  std::map<std::uint64_t, Content> staged = std::move(*m.staged);
  m.staged.reset();
  for (const auto& [p, c] : staged) {
    m.touch(p);
    m.set_content(p, c);
    m.corrupt.erase(p);
  }
  std::map<std::uint64_t, Digest> leaves = std::move(m.staged_leaves);
  m.staged_leaves.clear();
  m.forget_cached_leaves();
  return m.commit_checkpoint(seq, leaves);
}

void DiskObjectStore::abort_install() {
  BFT_ASSERT(impl_->staged.has_value());
  impl_->staged.reset();  // the values written for it are dead bytes in the data file
  impl_->staged_leaves.clear();
}

std::uint64_t DiskObjectStore::scrub() {
  std::uint64_t bad = 0;
  Bytes v;
  for (const auto& [k, slot] : impl_->index) {
    if (!impl_->read_value(k, slot.ext, slot.partition, v)) ++bad;
  }
  return bad;
}

DiskStoreStats DiskObjectStore::stats() const {
  DiskStoreStats s = impl_->stats;
  s.data_file_bytes = impl_->data_end;
  s.live_value_bytes = impl_->live_value_bytes;
  s.index_file_bytes = impl_->index_end;
  return s;
}

std::optional<std::pair<std::uint64_t, std::uint32_t>> DiskObjectStore::extent_of(const ObjectKey& key) const {
  auto it = impl_->index.find(key);
  if (it == impl_->index.end()) return std::nullopt;
  return std::make_pair(it->second.ext.offset, it->second.ext.len);
}

const std::string& DiskObjectStore::data_path() const { return impl_->data_path; }

}  // namespace bftfs
