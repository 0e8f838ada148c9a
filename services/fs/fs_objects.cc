// The objects under the file service's ops (see fs_service_impl.h): inodes, entries, handles, allocation.
#include "services/fs/fs_service_impl.h"

#include <optional>

#include "common/assert.h"
#include "services/fs/fs_permissions.h"

namespace bftfs::fs {

Value FsService::Impl::get(const ObjectKey& k) const {
  const std::uint64_t before = store.corrupt_reads();
  Value v = store.get(k);
  if (store.corrupt_reads() != before) throw CorruptRead{};
  return v;
}

Super FsService::Impl::load_super() const {
  Super s;
  const Value v = get(ObjectKey::super());
  BFT_ASSERT(v != nullptr);  // present from the start; installs are checked for it
  const bool decoded = decode_super(*v, s);
  BFT_ASSERT(decoded);  // every value was validated when it entered the store
  return s;
}

void FsService::Impl::save_super(const Super& s) { put(ObjectKey::super(), encode_super(s)); }

std::uint32_t FsService::Impl::load_inode(std::uint64_t ino, Inode& n) const {
  const Value v = get(ObjectKey::inode(ino));
  if (v == nullptr) return err::kStale;
  if (!decode_inode(*v, n)) return err::kIo;
  n.ino = ino;
  return err::kOk;
}

std::uint32_t FsService::Impl::load_linked(std::uint64_t ino, Inode& n) const {
  const std::uint32_t e = load_inode(ino, n);
  return e == err::kStale ? err::kIo : e;
}

void FsService::Impl::save_inode(const Inode& n) { put(ObjectKey::inode(n.ino), encode_inode(n)); }

std::uint32_t FsService::Impl::resolve(const Handle& h, const std::vector<OpResult>& earlier, Inode& n) const {
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

std::uint32_t FsService::Impl::find_entry(std::uint64_t dir, const std::string& name, NameRec& out) const {
  const Value v = get(ObjectKey::dir_name(dir, name));
  if (v == nullptr) return err::kNoEnt;
  if (!decode_name_rec(*v, out)) return err::kIo;
  return err::kOk;
}

std::uint32_t FsService::Impl::check_room(const Inode& dir, std::uint64_t leaving) const {
  BFT_ASSERT(dir.entries >= leaving);
  return dir.entries - leaving < opt.dir_positions ? err::kOk : err::kNoSpc;
}

// Linear probing from the name's home. Positions are never moved once given (removal leaves a hole and does
// not pull later entries of the probe chain back), because a position is what a reader holds as its cursor:
// moving an entry a reader has not reached behind its cursor would make the listing skip it, and moving one it
// has passed ahead would return it twice. A hole in the middle of a chain hides nothing either, because no
// lookup walks chains: a name is found through its kName object, which records where the entry is. So an
// insertion takes the first free position, which may be a hole an earlier removal left.
std::uint64_t FsService::Impl::free_position(const Inode& dir, const std::string& name) const {
  std::uint64_t pos = dir_position_home(dir.ino, dir.generation, name, opt.dir_positions);
  // At most entries + 1 probes: check_room left a free position, and each occupied one holds an entry.
  for (std::uint64_t probes = 0; probes <= dir.entries; ++probes) {
    if (get(ObjectKey::entry(dir.ino, pos)) == nullptr) return pos;
    pos = dir_position_next(pos, opt.dir_positions);
  }
  BFT_UNREACHABLE();  // more kEntry objects than dir.entries: the invariant walk would have caught it
}

void FsService::Impl::add_entry(Inode& dir, const std::string& name, std::uint64_t ino, FileType type) {
  BFT_ASSERT(check_room(dir, 0) == err::kOk);
  const std::uint64_t cookie = free_position(dir, name);
  put(ObjectKey::dir_name(dir.ino, name), encode_name_rec(NameRec{cookie, ino, type}));
  put(ObjectKey::entry(dir.ino, cookie), encode_entry_rec(EntryRec{ino, type, name}));
  ++dir.entries;
  dir.mtime_ns = now;
  dir.ctime_ns = now;
}

void FsService::Impl::remove_entry(Inode& dir, const std::string& name, std::uint64_t cookie) {
  BFT_ASSERT(dir.entries > 0);
  erase(ObjectKey::dir_name(dir.ino, name));
  erase(ObjectKey::entry(dir.ino, cookie));
  --dir.entries;
  dir.mtime_ns = now;
  dir.ctime_ns = now;
}

std::uint32_t FsService::Impl::alloc_inode(Super& s, std::uint64_t& ino, std::uint64_t& gen) {
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

Inode FsService::Impl::new_inode(std::uint64_t ino, std::uint64_t gen, FileType type, std::uint32_t mode,
                                 const Cred& c, const Inode& dir) const {
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
  if (type == FileType::kDirectory) n.parent = dir.ino;
  return n;
}

void FsService::Impl::erase_blocks_from(Inode& n, Super& s, std::uint64_t first) {
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

void FsService::Impl::free_inode(Inode& n, Super& s) {
  erase_blocks_from(n, s, 0);
  erase(ObjectKey::inode(n.ino));
  put(ObjectKey::free_ino(n.ino), encode_u64(n.generation));
  BFT_ASSERT(s.used_inodes > 0);
  --s.used_inodes;
}

void FsService::Impl::unlink_inode(Inode& n, Super& s) {
  BFT_ASSERT(n.nlink > 0);
  --n.nlink;
  if (n.nlink == 0) {
    free_inode(n, s);
    return;
  }
  n.ctime_ns = now;
  save_inode(n);
}

}  // namespace bftfs::fs
