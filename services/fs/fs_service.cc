// The file service: see fs_service.h for the contract and docs/FILESERVICE.md for the design.
//
// Structure: every op is a member function that first checks everything it can (handles, types, names,
// permissions, limits) and only then mutates, through put()/erase(), which record undo. Partition overflow is
// the one failure found while mutating; it is handled like any failure: the op's changes are undone.
#include "services/fs/fs_service.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/codec.h"
#include "common/log.h"
#include "protocol/messages.h"
#include "services/fs/checkpointed_store.h"
#include "services/fs/object_store.h"

namespace bftfs::fs {

namespace {

constexpr std::uint32_t kModeSuid = 04000;
constexpr std::uint32_t kModeSgid = 02000;
constexpr std::uint32_t kModeSticky = 01000;
constexpr std::uint32_t kModeBits = 07777;
constexpr std::uint32_t kWantR = 4;
constexpr std::uint32_t kWantW = 2;
constexpr std::uint32_t kWantX = 1;
constexpr std::uint64_t kFirstCookie = 3;  // 1 is '.', 2 is '..'

// ---- object values (internal formats; validated on install by value_ok) ----

struct Super {
  std::uint64_t next_ino = 0;     // smallest inode number never used
  std::uint64_t used_inodes = 0;
  std::uint64_t used_blocks = 0;
};

Bytes encode_super(const Super& s) {
  Bytes out;
  ByteWriter w(out);
  w.u64(s.next_ino);
  w.u64(s.used_inodes);
  w.u64(s.used_blocks);
  return out;
}

bool decode_super(std::span<const std::uint8_t> b, Super& s) {
  ByteReader r(b);
  return r.u64(s.next_ino) && r.u64(s.used_inodes) && r.u64(s.used_blocks) && r.done();
}

struct Inode {
  std::uint64_t ino = 0;  // the key's, not encoded
  std::uint64_t generation = 0;
  FileType type = FileType::kRegular;
  std::uint32_t mode = 0;
  std::uint32_t nlink = 0;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t size = 0;  // regular files and symlinks
  std::uint64_t atime_ns = 0;
  std::uint64_t mtime_ns = 0;
  std::uint64_t ctime_ns = 0;
  std::uint64_t stored_blocks = 0;  // regular files: data objects (what capacity counts)
  std::uint64_t stored_bytes = 0;   // regular files: bytes in those objects (what st_blocks reports)
  std::uint64_t parent = 0;         // directories
  std::uint64_t next_cookie = 0;    // directories
  std::uint64_t entries = 0;        // directories (without '.' and '..')
  std::string target;               // symlinks
  std::uint64_t rdev = 0;           // device nodes
};

Bytes encode_inode(const Inode& n) {
  Bytes out;
  ByteWriter w(out);
  w.u64(n.generation);
  w.u8(static_cast<std::uint8_t>(n.type));
  w.u32(n.mode);
  w.u32(n.nlink);
  w.u32(n.uid);
  w.u32(n.gid);
  w.u64(n.size);
  w.u64(n.atime_ns);
  w.u64(n.mtime_ns);
  w.u64(n.ctime_ns);
  w.u64(n.stored_blocks);
  w.u64(n.stored_bytes);
  w.u64(n.parent);
  w.u64(n.next_cookie);
  w.u64(n.entries);
  w.u16(static_cast<std::uint16_t>(n.target.size()));
  w.bytes(n.target);
  w.u64(n.rdev);
  return out;
}

bool decode_file_type(std::uint8_t v, FileType& t) {
  if (v < 1 || v > kFileTypeMax) return false;
  t = static_cast<FileType>(v);
  return true;
}

bool decode_inode(std::span<const std::uint8_t> b, Inode& n) {
  ByteReader r(b);
  std::uint8_t type = 0;
  std::uint16_t target_len = 0;
  Bytes target;
  if (!r.u64(n.generation) || !r.u8(type)) return false;
  if (!decode_file_type(type, n.type)) return false;
  if (!r.u32(n.mode) || !r.u32(n.nlink) || !r.u32(n.uid) || !r.u32(n.gid) || !r.u64(n.size)) return false;
  if (!r.u64(n.atime_ns) || !r.u64(n.mtime_ns) || !r.u64(n.ctime_ns) || !r.u64(n.stored_blocks)) return false;
  if (!r.u64(n.stored_bytes)) return false;
  if (!r.u64(n.parent) || !r.u64(n.next_cookie) || !r.u64(n.entries)) return false;
  if (!r.u16(target_len)) return false;
  if (target_len > kSymlinkBytesMax) return false;
  if (!r.bytes(target_len, target)) return false;
  if (!r.u64(n.rdev)) return false;
  if (n.mode > kModeBits) return false;
  n.target.assign(target.begin(), target.end());
  return r.done();
}

struct NameRec {
  std::uint64_t cookie = 0;
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
};

Bytes encode_name_rec(const NameRec& n) {
  Bytes out;
  ByteWriter w(out);
  w.u64(n.cookie);
  w.u64(n.ino);
  w.u8(static_cast<std::uint8_t>(n.type));
  return out;
}

bool decode_name_rec(std::span<const std::uint8_t> b, NameRec& n) {
  ByteReader r(b);
  std::uint8_t type = 0;
  return r.u64(n.cookie) && r.u64(n.ino) && r.u8(type) && decode_file_type(type, n.type) && r.done();
}

struct EntryRec {
  std::uint64_t ino = 0;
  FileType type = FileType::kRegular;
  std::string name;
};

Bytes encode_entry_rec(const EntryRec& e) {
  Bytes out;
  ByteWriter w(out);
  w.u64(e.ino);
  w.u8(static_cast<std::uint8_t>(e.type));
  w.u16(static_cast<std::uint16_t>(e.name.size()));
  w.bytes(e.name);
  return out;
}

bool decode_entry_rec(std::span<const std::uint8_t> b, EntryRec& e) {
  ByteReader r(b);
  std::uint8_t type = 0;
  std::uint16_t len = 0;
  Bytes name;
  if (!r.u64(e.ino) || !r.u8(type) || !decode_file_type(type, e.type) || !r.u16(len)) return false;
  if (len == 0 || len > kNameBytesMax) return false;
  if (!r.bytes(len, name)) return false;
  e.name.assign(name.begin(), name.end());
  return r.done();
}

Bytes encode_u64(std::uint64_t v) {
  Bytes out;
  ByteWriter w(out);
  w.u64(v);
  return out;
}

bool decode_u64(std::span<const std::uint8_t> b, std::uint64_t& v) {
  ByteReader r(b);
  return r.u64(v) && r.done();
}

// Whether `v` is a well-formed value for `k` (install validation: the service never meets a value it cannot
// decode).
bool value_ok(const ObjectKey& k, const Bytes& v) {
  Super s;
  Inode n;
  NameRec nr;
  EntryRec er;
  std::uint64_t u = 0;
  switch (k.kind) {
    case Kind::kSuper: return k.ino == 0 && k.index == 0 && decode_super(v, s);
    case Kind::kFree: return k.ino == 0 && k.index > kRootIno && decode_u64(v, u);
    case Kind::kInode: return k.ino != 0 && k.index == 0 && decode_inode(v, n);
    case Kind::kName:
      return k.ino != 0 && !k.name.empty() && k.name.size() <= kNameBytesMax && decode_name_rec(v, nr);
    case Kind::kEntry: return k.ino != 0 && k.index >= kFirstCookie && decode_entry_rec(v, er);
    case Kind::kData: return k.ino != 0 && !v.empty() && v.size() <= kBlockBytes;
  }
  return false;
}

bool in_group(const Cred& c, std::uint32_t gid) {
  if (c.gid == gid) return true;
  return std::find(c.groups.begin(), c.groups.end(), gid) != c.groups.end();
}

// POSIX permission check for `want` (r=4, w=2, x=1 bits) with Linux's root bypass: root may do anything but
// execute a non-directory with no execute bit at all.
bool may(const Cred& c, const Inode& n, std::uint32_t want) {
  if (c.uid == 0) {
    if ((want & kWantX) != 0 && n.type != FileType::kDirectory && (n.mode & 0111) == 0) return false;
    return true;
  }
  std::uint32_t bits = 0;
  if (c.uid == n.uid) {
    bits = (n.mode >> 6) & 7;
  } else if (in_group(c, n.gid)) {
    bits = (n.mode >> 3) & 7;
  } else {
    bits = n.mode & 7;
  }
  return (bits & want) == want;
}

// Sticky directories: only the owner of the entry, of the directory, or root may remove or replace it.
bool sticky_denies(const Cred& c, const Inode& dir, const Inode& child) {
  return (dir.mode & kModeSticky) != 0 && c.uid != 0 && c.uid != dir.uid && c.uid != child.uid;
}

// What Linux does to a file chowned (the set-gid bit without group-exec marks mandatory locking: kept).
void kill_suid(Inode& n) {
  n.mode &= ~kModeSuid;
  if ((n.mode & 010) != 0) n.mode &= ~kModeSgid;
}

// What Linux (>= 6.2, setattr_should_drop_sgid) does to a file written or truncated by caller `c` without
// CAP_FSETID: S_ISUID goes; S_ISGID goes if the file is group-executable, or if the caller is not in the
// file's group (then the bit could be used to gain that group).
void kill_setid_on_write(Inode& n, const Cred& c) {
  BFT_ASSERT(c.uid != 0);
  n.mode &= ~kModeSuid;
  if ((n.mode & 010) != 0 || !in_group(c, n.gid)) n.mode &= ~kModeSgid;
}

std::uint32_t check_name(const std::string& name) {
  if (name.empty()) return err::kNoEnt;
  if (name.size() > kNameBytesMax) return err::kNameTooLong;
  if (name.find('/') != std::string::npos) return err::kInval;
  if (name.find('\0') != std::string::npos) return err::kInval;
  return err::kOk;
}

bool is_dot(const std::string& name) { return name == "." || name == ".."; }

Attr attr_of(const Inode& n) {
  Attr a;
  a.ino = n.ino;
  a.generation = n.generation;
  a.type = n.type;
  a.mode = n.mode;
  a.nlink = n.nlink;
  a.uid = n.uid;
  a.gid = n.gid;
  a.size = n.type == FileType::kDirectory ? n.entries : n.size;
  a.blocks = n.stored_bytes / 512 + (n.stored_bytes % 512 != 0 ? 1 : 0);
  a.atime_ns = n.atime_ns;
  a.mtime_ns = n.mtime_ns;
  a.ctime_ns = n.ctime_ns;
  a.rdev = n.rdev;
  return a;
}

bool predicate_matches(const Expect& e, const OpResult& r) {
  switch (e.kind) {
    case ExpectKind::kNone: return true;
    case ExpectKind::kErrno: return r.err == e.err;
    case ExpectKind::kDigest: return op_result_digest(r) == e.digest;
  }
  return false;
}

}  // namespace

struct FsService::Impl {
  struct UndoRec {
    std::uint64_t seq = 0;
    ObjectKey key;
    Value old;  // null: the key was absent
  };

  Impl(std::unique_ptr<CheckpointedStore> owned, FsOptions o) : opt(o), owned_store(std::move(owned)),
                                                                 store(*owned_store) {
    BFT_ASSERT(opt.partitions > 0);
    BFT_ASSERT(opt.inodes_max >= 1);
    BFT_ASSERT(opt.file_bytes_max <= (1ull << 62));  // offsets plus lengths never overflow
    BFT_ASSERT(store.partition_count() == opt.partitions);
    if (!store.has_checkpoint()) {
      // A fresh store: the initial state (same on every replica) is checkpoint 0.
      BFT_ASSERT(store.object_count() == 0);
      put_initial_objects();
      const std::optional<CheckpointId> id = store.checkpoint(0);
      BFT_ASSERT(id.has_value());  // values written a moment ago by this process
    }
    recovered = store.latest();
    // Every state has these two objects. Bytes that fail their checksum are not a reason to stop: the service
    // starts damaged (damaged_partitions()) and the engine repairs it; an object that is simply absent is a bug.
    const std::uint64_t corrupt_before = store.corrupt_reads();
    const bool has_super = store.get(ObjectKey::super()) != nullptr;
    const bool has_root = store.get(ObjectKey::inode(kRootIno)) != nullptr;
    BFT_ASSERT((has_super && has_root) || store.corrupt_reads() != corrupt_before);
    committed = recovered.seq;
    last_executed = committed;
  }

  void put_initial_objects() {
    Super sup{kRootIno + 1, 1, 0};
    store.put(ObjectKey::super(), make_value(encode_super(sup)));
    Inode root;
    root.ino = kRootIno;
    root.generation = 1;
    root.type = FileType::kDirectory;
    root.mode = opt.root_mode & kModeBits;
    root.nlink = 2;
    root.uid = opt.root_uid;
    root.gid = opt.root_gid;
    root.parent = kRootIno;
    root.next_cookie = kFirstCookie;
    store.put(ObjectKey::inode(kRootIno), make_value(encode_inode(root)));
  }

  // ---- reads (verified by the store) ----

  // Thrown by get() when the store's bytes failed their checksum: the request stops at once (its changes are
  // undone) and nothing computed from the bad bytes is used; the engine learns of the damage through
  // damaged_partitions() and never sends this replica's result. An exception because a corrupt read can happen
  // under any of the dozens of reads of an op, and every one of them would otherwise need an error path that
  // correct execution never takes.
  struct CorruptRead {};
  Value get(const ObjectKey& k) const {
    const std::uint64_t before = store.corrupt_reads();
    Value v = store.get(k);
    if (store.corrupt_reads() != before) throw CorruptRead{};
    return v;
  }

  // ---- mutation with undo ----

  void record(const ObjectKey& k) {
    BFT_ASSERT(mutating);  // read-only execution never mutates
    if (touched.insert(k).second) undo.push_back(UndoRec{cur_seq, k, get(k)});
  }
  void put(const ObjectKey& k, Value v) {
    record(k);
    if (store.put(k, std::move(v)) > kPartitionBytesMax) overflow = true;
  }
  void put(const ObjectKey& k, Bytes v) { put(k, make_value(std::move(v))); }
  void erase(const ObjectKey& k) {
    record(k);
    store.erase(k);
  }
  void restore_to(std::size_t mark) {
    while (undo.size() > mark) {
      UndoRec& u = undo.back();
      if (u.old != nullptr) {
        store.put(u.key, std::move(u.old));
      } else {
        store.erase(u.key);
      }
      undo.pop_back();
    }
  }

  // ---- loading ----

  Super load_super() const {
    Super s;
    const Value v = get(ObjectKey::super());
    BFT_ASSERT(v != nullptr);  // present from the start; installs are checked for it
    const bool decoded = decode_super(*v, s);
    BFT_ASSERT(decoded);  // every value was validated when it entered the store
    return s;
  }
  void save_super(const Super& s) { put(ObjectKey::super(), encode_super(s)); }

  // ESTALE when there is no such inode; EIO if its value does not decode (cannot happen: installs validate).
  std::uint32_t load_inode(std::uint64_t ino, Inode& n) const {
    const Value v = get(ObjectKey::inode(ino));
    if (v == nullptr) return err::kStale;
    if (!decode_inode(*v, n)) return err::kIo;
    n.ino = ino;
    return err::kOk;
  }
  // An inode that an entry or a parent pointer names: its absence is an inconsistency (EIO), not a stale handle.
  std::uint32_t load_linked(std::uint64_t ino, Inode& n) const {
    const std::uint32_t e = load_inode(ino, n);
    return e == err::kStale ? err::kIo : e;
  }
  void save_inode(const Inode& n) { put(ObjectKey::inode(n.ino), encode_inode(n)); }

  std::uint32_t resolve(const Handle& h, const std::vector<OpResult>& earlier, Inode& n) const {
    std::uint64_t ino = h.ino;
    std::uint64_t gen = h.generation;
    if (h.is_ref) {
      BFT_ASSERT(h.ref < earlier.size());  // the decoder checked it
      const OpResult& r = earlier[h.ref];
      if (r.err != err::kOk) return err::kStale;  // it failed (with a matching errno predicate): names nothing
      ino = r.attr.ino;
      gen = r.attr.generation;
    }
    if (ino == 0) return err::kStale;
    const std::uint32_t e = load_inode(ino, n);
    if (e != err::kOk) return e;
    if (n.generation != gen) return err::kStale;
    return err::kOk;
  }

  // kOk and the record, kNoEnt, or kIo.
  std::uint32_t find_entry(std::uint64_t dir, const std::string& name, NameRec& out) const {
    const Value v = get(ObjectKey::dir_name(dir, name));
    if (v == nullptr) return err::kNoEnt;
    if (!decode_name_rec(*v, out)) return err::kIo;
    return err::kOk;
  }

  void add_entry(Inode& dir, const std::string& name, std::uint64_t ino, FileType type) {
    const std::uint64_t cookie = dir.next_cookie++;
    put(ObjectKey::dir_name(dir.ino, name), encode_name_rec(NameRec{cookie, ino, type}));
    put(ObjectKey::entry(dir.ino, cookie), encode_entry_rec(EntryRec{ino, type, name}));
    ++dir.entries;
    dir.mtime_ns = now;
    dir.ctime_ns = now;
  }

  void remove_entry(Inode& dir, const std::string& name, std::uint64_t cookie) {
    BFT_ASSERT(dir.entries > 0);
    erase(ObjectKey::dir_name(dir.ino, name));
    erase(ObjectKey::entry(dir.ino, cookie));
    --dir.entries;
    dir.mtime_ns = now;
    dir.ctime_ns = now;
  }

  std::uint64_t capacity_blocks() const { return opt.capacity_bytes / kBlockBytes; }

  std::uint32_t alloc_inode(Super& s, std::uint64_t& ino, std::uint64_t& gen) {
    if (s.used_inodes >= opt.inodes_max) return err::kNoSpc;
    const std::optional<ObjectKey> k = store.first_at_or_after(ObjectKey::free_ino(0));
    if (k.has_value() && k->ino == 0 && k->kind == Kind::kFree) {
      std::uint64_t last = 0;
      const bool decoded = decode_u64(*get(*k), last);
      BFT_ASSERT(decoded);
      ino = k->index;
      gen = last + 1;
      erase(*k);
    } else {
      ino = s.next_ino++;
      gen = 1;
    }
    ++s.used_inodes;
    return err::kOk;
  }

  Inode new_inode(std::uint64_t ino, std::uint64_t gen, FileType type, std::uint32_t mode, const Cred& c,
                  const Inode& dir) const {
    Inode n;
    n.ino = ino;
    n.generation = gen;
    n.type = type;
    n.mode = mode & kModeBits;
    // Linux ignores set-user-id and set-group-id in mkdir's mode; a directory gets S_ISGID from its parent.
    if (type == FileType::kDirectory) n.mode &= ~(kModeSuid | kModeSgid);
    n.uid = c.uid;
    n.gid = (dir.mode & kModeSgid) != 0 ? dir.gid : c.gid;
    if (type == FileType::kDirectory && (dir.mode & kModeSgid) != 0) n.mode |= kModeSgid;
    if (type != FileType::kDirectory && (n.mode & kModeSgid) != 0 && c.uid != 0 && !in_group(c, n.gid)) {
      n.mode &= ~kModeSgid;
    }
    n.nlink = type == FileType::kDirectory ? 2 : 1;
    n.atime_ns = n.mtime_ns = n.ctime_ns = now;
    if (type == FileType::kDirectory) {
      n.parent = dir.ino;
      n.next_cookie = kFirstCookie;
    }
    return n;
  }

  // Erases the data blocks of `n` with index >= `first` and counts them off.
  void erase_blocks_from(Inode& n, Super& s, std::uint64_t first) {
    for (;;) {
      const std::optional<ObjectKey> k = store.first_at_or_after(ObjectKey::data(n.ino, first));
      if (!k.has_value() || k->ino != n.ino || k->kind != Kind::kData) break;
      const std::uint64_t bytes = get(*k)->size();
      BFT_ASSERT(n.stored_bytes >= bytes);
      n.stored_bytes -= bytes;
      erase(*k);
      BFT_ASSERT(n.stored_blocks > 0);
      BFT_ASSERT(s.used_blocks > 0);
      --n.stored_blocks;
      --s.used_blocks;
      first = k->index;
    }
  }

  void free_inode(Inode& n, Super& s) {
    erase_blocks_from(n, s, 0);
    erase(ObjectKey::inode(n.ino));
    put(ObjectKey::free_ino(n.ino), encode_u64(n.generation));
    BFT_ASSERT(s.used_inodes > 0);
    --s.used_inodes;
  }

  // One name of a non-directory is gone.
  void unlink_inode(Inode& n, Super& s) {
    BFT_ASSERT(n.nlink > 0);
    --n.nlink;
    if (n.nlink == 0) {
      free_inode(n, s);
      return;
    }
    n.ctime_ns = now;
    save_inode(n);
  }

  // Data beyond `size` never stays stored (so a later extension reads zeros).
  void truncate(Inode& n, Super& s, std::uint64_t size) {
    if (size < n.size) {
      erase_blocks_from(n, s, size / kBlockBytes + (size % kBlockBytes != 0 ? 1 : 0));
      const std::uint64_t keep = size % kBlockBytes;
      if (keep != 0) {
        const ObjectKey k = ObjectKey::data(n.ino, size / kBlockBytes);
        const Value v = get(k);
        if (v != nullptr && v->size() > keep) {
          n.stored_bytes -= v->size() - keep;
          put(k, Bytes(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(keep)));
        }
      }
    }
    n.size = size;
  }

  // ---- the ops ----

  std::uint32_t op_lookup(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode dir;
    Inode child;
    std::uint32_t e = resolve(op.handle, earlier, dir);
    if (e != err::kOk) return e;
    if (dir.type != FileType::kDirectory) return err::kNotDir;
    if (!may(op.cred, dir, kWantX)) return err::kAccess;
    if (op.name == ".") {
      child = dir;
    } else if (op.name == "..") {
      e = load_linked(dir.parent, child);
      if (e != err::kOk) return e;
    } else {
      e = check_name(op.name);
      if (e != err::kOk) return e;
      NameRec nr;
      e = find_entry(dir.ino, op.name, nr);
      if (e != err::kOk) return e;
      e = load_linked(nr.ino, child);
      if (e != err::kOk) return e;
    }
    out.attr = attr_of(child);
    return err::kOk;
  }

  std::uint32_t op_getattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    out.attr = attr_of(n);
    return err::kOk;
  }

  std::uint32_t op_setattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    const Cred& c = op.cred;
    const bool root = c.uid == 0;
    const bool owner = root || c.uid == n.uid;
    const std::uint8_t m = op.mask;
    // A non-owner may change the mode only to drop S_ISUID/S_ISGID, and only with write permission: that is the
    // kernel clearing the set-id bits before a non-owner's write or truncate (Linux ATTR_KILL_SUID/SGID, which
    // reaches a FUSE file system as a plain SETATTR of the mode with the writer's credentials).
    const bool kills_setid_only = (op.mode & kModeBits) == (n.mode & ~(kModeSuid | kModeSgid)) &&
                                  (n.mode & (kModeSuid | kModeSgid)) != 0;
    if ((m & setattr::kMode) != 0 && !owner && !(kills_setid_only && may(c, n, kWantW))) return err::kPerm;
    if ((m & setattr::kUid) != 0 && !root && !(c.uid == n.uid && op.uid == n.uid)) return err::kPerm;
    if ((m & setattr::kGid) != 0 && !root && !(c.uid == n.uid && in_group(c, op.gid))) return err::kPerm;
    if ((m & setattr::kSize) != 0) {
      if (n.type == FileType::kDirectory) return err::kIsDir;
      if (n.type != FileType::kRegular) return err::kInval;
      if (!owner && !may(c, n, kWantW)) return err::kAccess;
      if (op.size > opt.file_bytes_max) return err::kFBig;
    }
    if ((m & (setattr::kAtime | setattr::kMtime)) != 0 && !owner) return err::kPerm;
    if ((m & (setattr::kAtimeNow | setattr::kMtimeNow)) != 0 && !owner && !may(c, n, kWantW)) {
      return err::kAccess;
    }
    if ((m & setattr::kSize) != 0) {
      Super s = load_super();
      truncate(n, s, op.size);
      save_super(s);
      if (!root) kill_setid_on_write(n, c);
      n.mtime_ns = now;
    }
    if ((m & setattr::kMode) != 0) {
      n.mode = op.mode & kModeBits;
      if (!root && !in_group(c, n.gid)) n.mode &= ~kModeSgid;
    }
    if ((m & (setattr::kUid | setattr::kGid)) != 0) {
      if ((m & setattr::kUid) != 0) n.uid = op.uid;
      if ((m & setattr::kGid) != 0) n.gid = op.gid;
      if (n.type != FileType::kDirectory) kill_suid(n);
    }
    if ((m & setattr::kAtime) != 0) n.atime_ns = op.atime_ns;
    if ((m & setattr::kAtimeNow) != 0) n.atime_ns = now;
    if ((m & setattr::kMtime) != 0) n.mtime_ns = op.mtime_ns;
    if ((m & setattr::kMtimeNow) != 0) n.mtime_ns = now;
    n.ctime_ns = now;
    save_inode(n);
    out.attr = attr_of(n);
    return err::kOk;
  }

  std::uint32_t op_read(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    if (n.type == FileType::kDirectory) return err::kIsDir;
    if (n.type != FileType::kRegular) return err::kInval;
    if (!may(op.cred, n, kWantR)) return err::kAccess;
    std::uint64_t len = 0;
    if (op.offset < n.size) len = std::min<std::uint64_t>(op.count, n.size - op.offset);
    out.data.assign(len, 0);
    const std::uint64_t end = op.offset + len;
    for (std::uint64_t pos = op.offset; pos < end;) {
      const std::uint64_t block = pos / kBlockBytes;
      const std::uint64_t in = pos % kBlockBytes;
      const std::uint64_t chunk = std::min<std::uint64_t>(kBlockBytes - in, end - pos);
      const Value v = get(ObjectKey::data(n.ino, block));
      if (v != nullptr && v->size() > in) {
        const std::uint64_t have = std::min<std::uint64_t>(chunk, v->size() - in);
        std::memcpy(out.data.data() + (pos - op.offset), v->data() + in, have);
      }
      pos += chunk;
    }
    out.eof = end >= n.size;
    out.attr = attr_of(n);
    return err::kOk;
  }

  std::uint32_t op_write(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    if (n.type == FileType::kDirectory) return err::kIsDir;
    if (n.type != FileType::kRegular) return err::kInval;
    if (!may(op.cred, n, kWantW)) return err::kAccess;
    const std::uint64_t len = op.data.size();
    const std::uint64_t offset = op.append ? n.size : op.offset;  // append: atomic at the size agreed now
    if (len == 0) {
      out.attr = attr_of(n);
      return err::kOk;
    }
    if (offset > opt.file_bytes_max || len > opt.file_bytes_max - offset) return err::kFBig;
    const std::uint64_t end = offset + len;
    const std::uint64_t first = offset / kBlockBytes;
    const std::uint64_t last = (end - 1) / kBlockBytes;
    std::uint64_t fresh = 0;
    for (std::uint64_t b = first; b <= last; ++b) {
      if (get(ObjectKey::data(n.ino, b)) == nullptr) ++fresh;
    }
    Super s = load_super();
    if (s.used_blocks + fresh > capacity_blocks()) return err::kNoSpc;
    for (std::uint64_t b = first; b <= last; ++b) {
      const ObjectKey k = ObjectKey::data(n.ino, b);
      const Value old = get(k);
      Bytes block = old != nullptr ? *old : Bytes{};
      const std::uint64_t base = b * kBlockBytes;
      const std::uint64_t from = std::max(offset, base) - base;
      const std::uint64_t to = std::min(end, base + kBlockBytes) - base;
      if (block.size() < to) {
        n.stored_bytes += to - block.size();
        block.resize(to, 0);
      }
      std::memcpy(block.data() + from, op.data.data() + (base + from - offset), to - from);
      put(k, std::move(block));
    }
    n.stored_blocks += fresh;
    s.used_blocks += fresh;
    n.size = std::max(n.size, end);
    n.mtime_ns = now;
    n.ctime_ns = now;
    if (op.cred.uid != 0) kill_setid_on_write(n, op.cred);
    save_inode(n);
    save_super(s);
    out.count = static_cast<std::uint32_t>(len);
    out.attr = attr_of(n);
    return err::kOk;
  }

  // CREATE, MKDIR and SYMLINK: a new inode under a new name.
  std::uint32_t make_node(const Op& op, const std::vector<OpResult>& earlier, FileType type, std::uint32_t mode,
                          OpResult& out) {
    Inode dir;
    std::uint32_t e = resolve(op.handle, earlier, dir);
    if (e != err::kOk) return e;
    if (dir.type != FileType::kDirectory) return err::kNotDir;
    e = check_name(op.name);
    if (e != err::kOk) return e;
    if (!may(op.cred, dir, kWantX)) return err::kAccess;
    if (is_dot(op.name)) return type == FileType::kRegular && !op.exclusive ? err::kIsDir : err::kExist;
    NameRec nr;
    e = find_entry(dir.ino, op.name, nr);
    if (e == err::kOk) {
      if (type != FileType::kRegular || op.exclusive) return err::kExist;
      Inode existing;
      e = load_linked(nr.ino, existing);
      if (e != err::kOk) return e;
      if (existing.type == FileType::kDirectory) return err::kIsDir;
      out.attr = attr_of(existing);
      return err::kOk;
    }
    if (e != err::kNoEnt) return e;
    if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
    if (type == FileType::kDirectory && dir.nlink >= kLinkMax) return err::kMLink;
    const bool device = type == FileType::kCharDevice || type == FileType::kBlockDevice;
    if (device && op.cred.uid != 0) return err::kPerm;  // CAP_MKNOD
    if (type == FileType::kSymlink) {
      if (op.target.empty()) return err::kNoEnt;
      if (op.target.size() > kSymlinkBytesMax) return err::kNameTooLong;
      if (op.target.find('\0') != std::string::npos) return err::kInval;
    }
    Super s = load_super();
    std::uint64_t ino = 0;
    std::uint64_t gen = 0;
    e = alloc_inode(s, ino, gen);
    if (e != err::kOk) return e;
    Inode n = new_inode(ino, gen, type, mode, op.cred, dir);
    if (type == FileType::kSymlink) {
      n.target = op.target;
      n.size = op.target.size();
    }
    if (device) n.rdev = op.rdev;
    add_entry(dir, op.name, ino, type);
    if (type == FileType::kDirectory) ++dir.nlink;
    save_inode(n);
    save_inode(dir);
    save_super(s);
    out.attr = attr_of(n);
    return err::kOk;
  }

  std::uint32_t op_remove(const Op& op, const std::vector<OpResult>& earlier, bool rmdir) {
    Inode dir;
    std::uint32_t e = resolve(op.handle, earlier, dir);
    if (e != err::kOk) return e;
    if (dir.type != FileType::kDirectory) return err::kNotDir;
    if (rmdir && op.name == ".") return err::kInval;
    if (rmdir && op.name == "..") return err::kNotEmpty;
    e = check_name(op.name);
    if (e != err::kOk) return e;
    if (is_dot(op.name)) return err::kIsDir;  // unlink(".") and unlink("..")
    if (!may(op.cred, dir, kWantX)) return err::kAccess;
    NameRec nr;
    e = find_entry(dir.ino, op.name, nr);
    if (e != err::kOk) return e;
    if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
    Inode child;
    e = load_linked(nr.ino, child);
    if (e != err::kOk) return e;
    if (sticky_denies(op.cred, dir, child)) return err::kPerm;
    if (!rmdir && child.type == FileType::kDirectory) return err::kIsDir;
    if (rmdir && child.type != FileType::kDirectory) return err::kNotDir;
    if (rmdir && child.entries > 0) return err::kNotEmpty;
    Super s = load_super();
    remove_entry(dir, op.name, nr.cookie);
    if (rmdir) {
      --dir.nlink;
      free_inode(child, s);
    } else {
      unlink_inode(child, s);
    }
    save_inode(dir);
    save_super(s);
    return err::kOk;
  }

  std::uint32_t op_rename(const Op& op, const std::vector<OpResult>& earlier) {
    Inode fdir;
    Inode tdir;
    std::uint32_t e = resolve(op.handle, earlier, fdir);
    if (e != err::kOk) return e;
    e = resolve(op.handle2, earlier, tdir);
    if (e != err::kOk) return e;
    if (fdir.type != FileType::kDirectory) return err::kNotDir;
    if (tdir.type != FileType::kDirectory) return err::kNotDir;
    e = check_name(op.name);
    if (e != err::kOk) return e;
    e = check_name(op.name2);
    if (e != err::kOk) return e;
    if (is_dot(op.name) || is_dot(op.name2)) return err::kInval;
    if (!may(op.cred, fdir, kWantX) || !may(op.cred, tdir, kWantX)) return err::kAccess;
    NameRec src;
    e = find_entry(fdir.ino, op.name, src);
    if (e != err::kOk) return e;
    NameRec dst;
    e = find_entry(tdir.ino, op.name2, dst);
    if (e != err::kOk && e != err::kNoEnt) return e;
    const bool replaces = e == err::kOk;
    if (replaces && dst.ino == src.ino) return err::kOk;  // POSIX: the same file, do nothing
    if (!may(op.cred, fdir, kWantW | kWantX) || !may(op.cred, tdir, kWantW | kWantX)) return err::kAccess;
    Inode sn;
    e = load_linked(src.ino, sn);
    if (e != err::kOk) return e;
    if (sticky_denies(op.cred, fdir, sn)) return err::kPerm;
    const bool is_dir = sn.type == FileType::kDirectory;
    const bool moves = fdir.ino != tdir.ino;
    if (is_dir && moves) {
      if (!may(op.cred, sn, kWantW)) return err::kAccess;  // its '..' changes
      // A directory may not move into its own subtree: walk up from the target directory.
      std::uint64_t cur = tdir.ino;
      for (std::uint64_t steps = 0;; ++steps) {
        if (cur == sn.ino) return err::kInval;
        if (cur == kRootIno) break;
        if (steps > opt.inodes_max) return err::kIo;  // a cycle: inconsistent state
        Inode up;
        e = load_linked(cur, up);
        if (e != err::kOk) return e;
        cur = up.parent;
      }
    }
    Inode dn;
    if (replaces) {
      e = load_linked(dst.ino, dn);
      if (e != err::kOk) return e;
      if (sticky_denies(op.cred, tdir, dn)) return err::kPerm;
      if (is_dir && dn.type != FileType::kDirectory) return err::kNotDir;
      if (!is_dir && dn.type == FileType::kDirectory) return err::kIsDir;
      if (dn.type == FileType::kDirectory && dn.entries > 0) return err::kNotEmpty;
    }
    if (is_dir && moves && !replaces && tdir.nlink >= kLinkMax) return err::kMLink;

    Inode& from = fdir;
    Inode& to = moves ? tdir : fdir;
    Super s = load_super();
    if (replaces) {
      remove_entry(to, op.name2, dst.cookie);
      if (dn.type == FileType::kDirectory) {
        --to.nlink;
        free_inode(dn, s);
      } else {
        unlink_inode(dn, s);
      }
    }
    remove_entry(from, op.name, src.cookie);
    add_entry(to, op.name2, sn.ino, sn.type);
    if (is_dir && moves) {
      --from.nlink;
      ++to.nlink;
      sn.parent = to.ino;
    }
    sn.ctime_ns = now;
    save_inode(sn);
    save_inode(from);
    if (moves) save_inode(to);
    save_super(s);
    return err::kOk;
  }

  std::uint32_t op_link(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
    Inode target;
    Inode dir;
    std::uint32_t e = resolve(op.handle, earlier, target);
    if (e != err::kOk) return e;
    e = resolve(op.handle2, earlier, dir);
    if (e != err::kOk) return e;
    if (target.type == FileType::kDirectory) return err::kPerm;
    if (dir.type != FileType::kDirectory) return err::kNotDir;
    e = check_name(op.name);
    if (e != err::kOk) return e;
    if (!may(op.cred, dir, kWantX)) return err::kAccess;
    if (is_dot(op.name)) return err::kExist;
    NameRec nr;
    e = find_entry(dir.ino, op.name, nr);
    if (e == err::kOk) return err::kExist;
    if (e != err::kNoEnt) return e;
    if (!may(op.cred, dir, kWantW | kWantX)) return err::kAccess;
    if (target.nlink >= kLinkMax) return err::kMLink;
    add_entry(dir, op.name, target.ino, target.type);
    ++target.nlink;
    target.ctime_ns = now;
    save_inode(target);
    save_inode(dir);
    out.attr = attr_of(target);
    return err::kOk;
  }

  std::uint32_t op_readlink(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    if (n.type != FileType::kSymlink) return err::kInval;
    out.target = n.target;
    return err::kOk;
  }

  std::uint32_t op_readdir(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode dir;
    const std::uint32_t e = resolve(op.handle, earlier, dir);
    if (e != err::kOk) return e;
    if (dir.type != FileType::kDirectory) return err::kNotDir;
    if (!may(op.cred, dir, kWantR)) return err::kAccess;
    if (op.cookie < 1) out.entries.push_back(DirEntry{1, dir.ino, FileType::kDirectory, ".", Attr{}});
    if (op.cookie < 2 && out.entries.size() < op.count) {
      out.entries.push_back(DirEntry{2, dir.parent, FileType::kDirectory, "..", Attr{}});
    }
    std::uint64_t from = std::max<std::uint64_t>(op.cookie, 2);
    out.eof = true;
    if (from == UINT64_MAX) return err::kOk;
    ++from;
    for (;;) {
      const std::optional<ObjectKey> k = store.first_at_or_after(ObjectKey::entry(dir.ino, from));
      if (!k.has_value() || k->ino != dir.ino || k->kind != Kind::kEntry) break;
      if (out.entries.size() >= op.count) {
        out.eof = false;
        break;
      }
      EntryRec er;
      if (!decode_entry_rec(*get(*k), er)) return err::kIo;
      out.entries.push_back(DirEntry{k->index, er.ino, er.type, std::move(er.name), Attr{}});
      from = k->index + 1;
    }
    if (op.code == OpCode::kReaddirPlus) {
      for (DirEntry& d : out.entries) {
        Inode n;
        const std::uint32_t le = load_linked(d.ino, n);
        if (le != err::kOk) return le;
        d.attr = attr_of(n);
      }
    }
    return err::kOk;
  }

  std::uint32_t op_access(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    for (std::uint32_t bit : {kWantR, kWantW, kWantX}) {
      if ((op.access & bit) != 0 && may(op.cred, n, bit)) out.granted = static_cast<std::uint8_t>(out.granted | bit);
    }
    out.attr = attr_of(n);
    return err::kOk;
  }

  std::uint32_t op_statfs(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const {
    Inode n;
    const std::uint32_t e = resolve(op.handle, earlier, n);
    if (e != err::kOk) return e;
    const Super s = load_super();
    out.statfs.bsize = kBlockBytes;
    out.statfs.blocks = capacity_blocks();
    out.statfs.bfree = capacity_blocks() - std::min(s.used_blocks, capacity_blocks());
    out.statfs.bavail = out.statfs.bfree;
    out.statfs.files = opt.inodes_max;
    out.statfs.ffree = opt.inodes_max - std::min(s.used_inodes, opt.inodes_max);
    out.statfs.namemax = kNameBytesMax;
    return err::kOk;
  }

  std::uint32_t run_op(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) {
    switch (op.code) {
      case OpCode::kLookup: return op_lookup(op, earlier, out);
      case OpCode::kGetattr: return op_getattr(op, earlier, out);
      case OpCode::kSetattr: return op_setattr(op, earlier, out);
      case OpCode::kRead: return op_read(op, earlier, out);
      case OpCode::kWrite: return op_write(op, earlier, out);
      case OpCode::kCreate: return make_node(op, earlier, FileType::kRegular, op.mode, out);
      case OpCode::kRemove: return op_remove(op, earlier, false);
      case OpCode::kMkdir: return make_node(op, earlier, FileType::kDirectory, op.mode, out);
      case OpCode::kRmdir: return op_remove(op, earlier, true);
      case OpCode::kRename: return op_rename(op, earlier);
      case OpCode::kLink: return op_link(op, earlier, out);
      case OpCode::kSymlink: return make_node(op, earlier, FileType::kSymlink, 0777, out);
      case OpCode::kMknod: return make_node(op, earlier, op.node_type, op.mode, out);
      case OpCode::kReadlink: return op_readlink(op, earlier, out);
      case OpCode::kReaddir:
      case OpCode::kReaddirPlus: return op_readdir(op, earlier, out);
      case OpCode::kStatfs: return op_statfs(op, earlier, out);
      case OpCode::kAccess: return op_access(op, earlier, out);
      case OpCode::kFsync: return op_getattr(op, earlier, out);  // the replicated state is durable by checkpoints
    }
    BFT_UNREACHABLE();
  }

  // Runs a decoded request all or nothing (docs/FILESERVICE.md §1, §4).
  Result run_request(const Request& req) {
    const std::size_t request_mark = undo.size();
    try {
      return run_ops(req, request_mark);
    } catch (const CorruptRead&) {
      // Never returned (the engine checks damaged_partitions() after every execution), but defined: EIO.
      restore_to(request_mark);
      touched.clear();
      overflow = false;
      Result res;
      res.outcome = Outcome::kOpFailed;
      res.stop = 0;
      OpResult r;
      r.code = req.ops.front().code;
      r.err = err::kIo;
      res.results.push_back(std::move(r));
      return res;
    }
  }

  Result run_ops(const Request& req, std::size_t request_mark) {
    Result res;
    for (std::size_t i = 0; i < req.ops.size(); ++i) {
      const Op& op = req.ops[i];
      OpResult r;
      r.code = op.code;
      const std::size_t op_mark = undo.size();
      touched.clear();
      r.err = run_op(op, res.results, r);
      if (overflow) {
        overflow = false;
        r.err = err::kNoSpc;  // a partition would exceed kPartitionBytesMax
      }
      if (r.err != err::kOk) {
        restore_to(op_mark);  // a failed op leaves no trace, even when its predicate expected the failure
        const std::uint32_t failed = r.err;
        r = OpResult{};
        r.code = op.code;
        r.err = failed;
      }
      const bool passes = op.expect.kind == ExpectKind::kNone ? r.err == err::kOk : predicate_matches(op.expect, r);
      res.results.push_back(std::move(r));
      if (!passes) {
        res.outcome = op.expect.kind == ExpectKind::kNone ? Outcome::kOpFailed : Outcome::kPredicateFailed;
        res.stop = static_cast<std::uint8_t>(i);
        restore_to(request_mark);
        break;
      }
    }
    touched.clear();
    return res;
  }

  Bytes encode_checked(const Result& res) const {
    Bytes out = encode_result(res);
    BFT_ASSERT(out.size() <= kFsResultBytesMax);
    return out;
  }

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> bytes) {
    BFT_ASSERT(!installing);
    BFT_ASSERT(ctx.seq >= last_executed);  // batches execute in order (several requests share a seq)
    last_executed = ctx.seq;
    Request req;
    const FsDecodeError de = decode_request(bytes, req);
    if (de != FsDecodeError::kOk) {
      Result res;
      res.outcome = Outcome::kMalformed;
      res.stop = static_cast<std::uint8_t>(de);
      return encode_checked(res);
    }
    cur_seq = ctx.seq;
    now = ctx.timestamp_ns;
    mutating = true;
    const Result res = run_request(req);
    mutating = false;
    check_cheap_invariants();
    return encode_checked(res);
  }

  bool execute_read_only(std::span<const std::uint8_t> bytes, Bytes& result) {
    BFT_ASSERT(!installing);
    if (!store.corrupt_partitions().empty()) return false;  // nothing is answered from a damaged store
    Request req;
    if (decode_request(bytes, req) != FsDecodeError::kOk) return false;
    for (const Op& op : req.ops) {
      if (!is_read_only(op.code)) return false;
    }
    BFT_ASSERT(!mutating);
    const std::uint64_t corrupt_before = store.corrupt_reads();
    result = encode_checked(run_request(req));
    return store.corrupt_reads() == corrupt_before;
  }

  // O(1) checks after every request (the full walk is check_invariants(), for tests).
  void check_cheap_invariants() const {
    BFT_ASSERT(!overflow);
    BFT_ASSERT(touched.empty());
    BFT_ASSERT(undo.empty() || undo.back().seq <= last_executed);
    BFT_ASSERT(store.partition_count() == opt.partitions);
  }

  void commit_through(std::uint64_t seq) {
    if (seq <= committed) return;
    committed = seq;
    std::size_t drop = 0;
    while (drop < undo.size() && undo[drop].seq <= seq) ++drop;
    undo.erase(undo.begin(), undo.begin() + static_cast<std::ptrdiff_t>(drop));
  }

  void rollback_to(std::uint64_t seq) {
    BFT_ASSERT(!installing);
    BFT_ASSERT(seq >= committed);
    std::size_t keep = undo.size();
    while (keep > 0 && undo[keep - 1].seq > seq) --keep;
    restore_to(keep);
    last_executed = std::min(last_executed, seq);
  }

  CheckpointId checkpoint(std::uint64_t seq) {
    BFT_ASSERT(!installing);
    BFT_ASSERT(last_executed <= seq);
    commit_through(seq);
    // Damage found earlier (say, by a peer's fetch) and not yet repaired: take nothing either, so that the
    // store's newest checkpoint stays the engine's newest (the base its repair diffs against).
    if (!store.corrupt_partitions().empty()) return CheckpointId{seq, Digest{}};
    const std::optional<CheckpointId> id = store.checkpoint(seq);
    if (!id.has_value()) return CheckpointId{seq, Digest{}};  // damaged (protocol/service.h): nothing taken
    return *id;
  }

  void begin_install() {
    BFT_ASSERT(!installing);
    installing = true;
    install_error.clear();
    staged_super = staged_root = std::nullopt;
    store.begin_install();
  }

  // Decodes and validates one fetched partition (the digest only proves a peer had these bytes, not that they
  // are file-service state) and stages it. The first error is the one reported by finish_install.
  void install_partition(std::uint64_t p, std::span<const std::uint8_t> data) {
    BFT_ASSERT(installing);
    if (!install_error.empty()) return;
    if (p >= opt.partitions) {
      install_error = "partition index " + std::to_string(p) + " out of range";
      return;
    }
    if (data.size() > kPartitionBytesMax) {
      install_error = "partition " + std::to_string(p) + " over kPartitionBytesMax";
      return;
    }
    std::vector<std::pair<ObjectKey, Value>> objects;
    const std::string e = decode_partition(data, p, opt.partitions, value_ok, objects);
    if (!e.empty()) {
      install_error = "partition " + std::to_string(p) + ": " + e;
      return;
    }
    const auto has = [&](const ObjectKey& k) {
      return std::any_of(objects.begin(), objects.end(), [&](const auto& kv) { return kv.first == k; });
    };
    if (p == partition_of(ObjectKey::super(), opt.partitions)) staged_super = has(ObjectKey::super());
    if (p == partition_of(ObjectKey::inode(kRootIno), opt.partitions)) staged_root = has(ObjectKey::inode(kRootIno));
    store.stage_partition(p, std::move(objects));
  }

  CheckpointId finish_install(std::uint64_t target_seq) {
    BFT_ASSERT(installing);
    installing = false;
    // A partition not fetched is the base checkpoint's, which has both (every state has them).
    if (install_error.empty() && (staged_super == false || staged_root == false)) {
      install_error = "the superblock or the root directory is missing";
    }
    if (!install_error.empty()) {
      LOG_WARN("", "fs install of checkpoint %llu rejected: %s", static_cast<unsigned long long>(target_seq),
               install_error.c_str());
      store.abort_install();
      return CheckpointId{target_seq, Digest{}};
    }
    const CheckpointId id = store.finish_install(target_seq);  // this replica's changes since the base are gone
    undo.clear();
    touched.clear();
    committed = target_seq;
    last_executed = target_seq;
    return id;
  }

  std::string check_invariants() const;

  FsOptions opt;
  std::unique_ptr<CheckpointedStore> owned_store;
  CheckpointedStore& store;
  CheckpointId recovered;
  std::vector<UndoRec> undo;       // changes after `committed`, in execution order
  std::set<ObjectKey> touched;     // keys with an undo record in the current op
  bool installing = false;
  std::string install_error;
  // Whether a staged partition holding the superblock (root inode) holds it; nullopt if not staged.
  std::optional<bool> staged_super;
  std::optional<bool> staged_root;
  bool mutating = false;
  bool overflow = false;
  std::uint64_t cur_seq = 0;
  std::uint64_t now = 0;
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;
};

std::string FsService::Impl::check_invariants() const {
  std::map<ObjectKey, Value> all;
  for (std::uint64_t p = 0; p < opt.partitions; ++p) {
    store.for_each_in_partition(p, [&](const ObjectKey& k, const Value& v) { all.emplace(k, v); });
  }
  Super s;
  auto sit = all.find(ObjectKey::super());
  if (sit == all.end() || !decode_super(*sit->second, s)) return "superblock missing or corrupt";
  std::map<std::uint64_t, Inode> inodes;
  std::map<std::uint64_t, std::uint64_t> links;       // ino -> entries naming it
  std::map<std::uint64_t, std::uint64_t> subdirs;     // dir -> directory entries in it
  std::map<std::uint64_t, std::uint64_t> entries;     // dir -> entries
  std::map<std::uint64_t, std::uint64_t> blocks;      // ino -> data objects
  std::map<std::uint64_t, std::uint64_t> bytes;       // ino -> bytes in them
  std::uint64_t data_objects = 0;
  for (const auto& [k, v] : all) {
    if (!value_ok(k, *v)) return "undecodable object";
    if (k.kind == Kind::kInode) {
      Inode n;
      decode_inode(*v, n);
      n.ino = k.ino;
      inodes.emplace(k.ino, n);
    }
  }
  for (const auto& [k, v] : all) {
    const auto owner = inodes.find(k.ino);
    switch (k.kind) {
      case Kind::kSuper:
        break;
      case Kind::kFree:
        if (inodes.count(k.index) != 0) return "free inode number " + std::to_string(k.index) + " is in use";
        if (k.index >= s.next_ino) return "free inode number beyond next_ino";
        break;
      case Kind::kInode:
        if (k.ino >= s.next_ino) return "inode beyond next_ino";
        break;
      case Kind::kName: {
        NameRec nr;
        decode_name_rec(*v, nr);
        if (owner == inodes.end() || owner->second.type != FileType::kDirectory) return "name in a non-directory";
        auto e = all.find(ObjectKey::entry(k.ino, nr.cookie));
        EntryRec er;
        if (e == all.end() || !decode_entry_rec(*e->second, er)) return "name without its entry: " + k.name;
        if (er.name != k.name || er.ino != nr.ino || er.type != nr.type) return "name and entry differ: " + k.name;
        if (nr.cookie >= owner->second.next_cookie) return "cookie not below next_cookie";
        auto child = inodes.find(nr.ino);
        if (child == inodes.end()) return "entry names a missing inode: " + k.name;
        if (child->second.type != nr.type) return "entry type differs from the inode's: " + k.name;
        ++links[nr.ino];
        ++entries[k.ino];
        if (nr.type == FileType::kDirectory) {
          ++subdirs[k.ino];
          if (child->second.parent != k.ino) return "directory's parent is not the directory naming it";
        }
        break;
      }
      case Kind::kEntry: {
        EntryRec er;
        decode_entry_rec(*v, er);
        auto nm = all.find(ObjectKey::dir_name(k.ino, er.name));
        NameRec nr;
        if (nm == all.end() || !decode_name_rec(*nm->second, nr) || nr.cookie != k.index) return "entry without name";
        break;
      }
      case Kind::kData:
        if (owner == inodes.end() || owner->second.type != FileType::kRegular) return "data of a non-file";
        if (k.index * kBlockBytes + v->size() > owner->second.size) return "data beyond the file size";
        ++blocks[k.ino];
        bytes[k.ino] += v->size();
        ++data_objects;
        break;
    }
  }
  for (const auto& [ino, n] : inodes) {
    if (n.type == FileType::kDirectory) {
      if (n.entries != entries[ino]) return "directory entry count wrong for ino " + std::to_string(ino);
      if (n.nlink != 2 + subdirs[ino]) return "directory nlink wrong for ino " + std::to_string(ino);
      if (ino != kRootIno && links[ino] != 1) return "directory with other than one name";
    } else if (n.nlink != links[ino]) {
      return "nlink " + std::to_string(n.nlink) + " but " + std::to_string(links[ino]) + " names for ino " +
             std::to_string(ino);
    }
    if (n.stored_blocks != blocks[ino]) return "stored block count wrong for ino " + std::to_string(ino);
    if (n.stored_bytes != bytes[ino]) return "stored byte count wrong for ino " + std::to_string(ino);
  }
  if (inodes.count(kRootIno) == 0) return "no root";
  if (s.used_inodes != inodes.size()) return "used_inodes wrong";
  if (s.used_blocks != data_objects) return "used_blocks wrong";
  return "";
}

FsService::FsService(SnapshotStore* store, FsOptions options)
    : FsService(std::make_unique<MemoryCheckpointedStore>(store, options.partitions), options) {}
FsService::FsService(std::unique_ptr<CheckpointedStore> store, FsOptions options)
    : impl_(std::make_unique<Impl>(std::move(store), options)) {}
FsService::~FsService() = default;

Bytes FsService::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) { return impl_->execute(ctx, op); }
bool FsService::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  (void)client;  // credentials travel in each op
  return impl_->execute_read_only(op, result);
}
void FsService::commit_through(std::uint64_t seq) { impl_->commit_through(seq); }
void FsService::rollback_to(std::uint64_t seq) { impl_->rollback_to(seq); }
CheckpointId FsService::checkpoint(std::uint64_t seq) { return impl_->checkpoint(seq); }
void FsService::discard_checkpoints_below(std::uint64_t seq) { impl_->store.discard_below(seq); }
CheckpointId FsService::recovered_checkpoint() const { return impl_->recovered; }
std::uint64_t FsService::partition_count() const { return impl_->opt.partitions; }
const PartitionTree& FsService::checkpoint_tree(std::uint64_t seq) const { return impl_->store.tree(seq); }
Bytes FsService::read_partition(std::uint64_t seq, std::uint64_t index) const {
  BFT_ASSERT(index < impl_->opt.partitions);
  return impl_->store.read_partition(seq, index);
}
void FsService::begin_install(std::uint64_t target_seq) {
  (void)target_seq;  // the base is the store's newest checkpoint
  impl_->begin_install();
}
void FsService::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  impl_->install_partition(index, data);
}
CheckpointId FsService::finish_install(std::uint64_t target_seq) { return impl_->finish_install(target_seq); }
std::vector<std::uint64_t> FsService::damaged_partitions() const {
  const auto& c = impl_->store.corrupt_partitions();
  return {c.begin(), c.end()};
}

std::string FsService::check_invariants() const { return impl_->check_invariants(); }
std::uint64_t FsService::undo_records() const { return impl_->undo.size(); }
std::uint64_t FsService::object_count() const { return impl_->store.object_count(); }
const FsOptions& FsService::options() const { return impl_->opt; }

}  // namespace bftfs::fs
