// The file service's invariants (see fs_service_impl.h): cheap checks after every request, the full walk for
// tests.
#include "services/fs/fs_service_impl.h"

#include <map>
#include <string>

#include "common/assert.h"

namespace bftfs::fs {

void FsService::Impl::check_cheap_invariants() const {
  BFT_ASSERT(!overflow);
  BFT_ASSERT(touched.empty());
  BFT_ASSERT(undo.empty() || undo.back().seq <= last_executed);
  BFT_ASSERT(store.partition_count() == opt.partitions);
}

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

}  // namespace bftfs::fs
