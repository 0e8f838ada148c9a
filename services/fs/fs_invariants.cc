// The file service's invariants (see fs_service_impl.h): cheap checks after every request, the full walk for
// tests.
#include "services/fs/fs_service_impl.h"

#include <map>
#include <string>

#include "common/assert.h"

namespace bftfs::fs {

namespace {

using Objects = std::map<ObjectKey, Value>;
using Inodes = std::map<std::uint64_t, Inode>;

// What the walk counts, per inode number, to compare with what each inode and the superblock say.
struct Tally {
  std::map<std::uint64_t, std::uint64_t> links;    // ino -> entries naming it
  std::map<std::uint64_t, std::uint64_t> subdirs;  // dir -> directory entries in it
  std::map<std::uint64_t, std::uint64_t> entries;  // dir -> entries
  std::map<std::uint64_t, std::uint64_t> blocks;   // ino -> data objects
  std::map<std::uint64_t, std::uint64_t> bytes;    // ino -> bytes in them
  std::uint64_t data_objects = 0;
};

// "" and every inode in `inodes`, or the first object that is not a well-formed value of its key.
std::string decode_all(const Objects& all, Inodes& inodes) {
  for (const auto& [k, v] : all) {
    if (!value_ok(k, *v)) return "undecodable object";
    if (k.kind == Kind::kInode) {
      Inode n;
      decode_inode(*v, n);
      n.ino = k.ino;
      inodes.emplace(k.ino, n);
    }
  }
  return "";
}

// A kName object: its kEntry twin agrees, its position is one of the directory's (`positions` of them), and it
// names an inode of its type (a directory's parent is its directory). Counts the link.
std::string check_name_object(const Objects& all, const Inodes& inodes, const ObjectKey& k, const Value& v,
                              std::uint64_t positions, Tally& t) {
  NameRec nr;
  decode_name_rec(*v, nr);
  const auto owner = inodes.find(k.ino);
  if (owner == inodes.end() || owner->second.type != FileType::kDirectory) return "name in a non-directory";
  auto e = all.find(ObjectKey::entry(k.ino, nr.cookie));
  EntryRec er;
  if (e == all.end() || !decode_entry_rec(*e->second, er)) return "name without its entry: " + k.name;
  if (er.name != k.name || er.ino != nr.ino || er.type != nr.type) return "name and entry differ: " + k.name;
  if (nr.cookie < kFirstCookie || nr.cookie - kFirstCookie >= positions) return "position out of range: " + k.name;
  auto child = inodes.find(nr.ino);
  if (child == inodes.end()) return "entry names a missing inode: " + k.name;
  if (child->second.type != nr.type) return "entry type differs from the inode's: " + k.name;
  ++t.links[nr.ino];
  ++t.entries[k.ino];
  if (nr.type == FileType::kDirectory) {
    ++t.subdirs[k.ino];
    if (child->second.parent != k.ino) return "directory's parent is not the directory naming it";
  }
  return "";
}

// One object against the others (its kind's rules), counting what the inodes are checked against later.
std::string check_object(const Objects& all, const Inodes& inodes, const Super& s, const ObjectKey& k,
                         const Value& v, std::uint64_t positions, Tally& t) {
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
    case Kind::kName:
      return check_name_object(all, inodes, k, v, positions, t);
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
      ++t.blocks[k.ino];
      t.bytes[k.ino] += v->size();
      ++t.data_objects;
      break;
  }
  return "";
}

// Every inode's counters (entries, links, stored blocks and bytes) against what the walk counted.
std::string check_inode_counts(const Inodes& inodes, Tally& t) {
  for (const auto& [ino, n] : inodes) {
    if (n.type == FileType::kDirectory) {
      if (n.entries != t.entries[ino]) return "directory entry count wrong for ino " + std::to_string(ino);
      if (n.nlink != 2 + t.subdirs[ino]) return "directory nlink wrong for ino " + std::to_string(ino);
      if (ino != kRootIno && t.links[ino] != 1) return "directory with other than one name";
    } else if (n.nlink != t.links[ino]) {
      return "nlink " + std::to_string(n.nlink) + " but " + std::to_string(t.links[ino]) + " names for ino " +
             std::to_string(ino);
    }
    if (n.stored_blocks != t.blocks[ino]) return "stored block count wrong for ino " + std::to_string(ino);
    if (n.stored_bytes != t.bytes[ino]) return "stored byte count wrong for ino " + std::to_string(ino);
  }
  return "";
}

}  // namespace

void FsService::Impl::check_cheap_invariants() const {
  BFT_ASSERT(!overflow);
  BFT_ASSERT(touched.empty());
  BFT_ASSERT(undo.empty() || undo.back().seq <= last_executed);
  BFT_ASSERT(store.partition_count() == opt.partitions);
}

std::string FsService::Impl::check_invariants() const {
  Objects all;
  for (std::uint64_t p = 0; p < opt.partitions; ++p) {
    store.for_each_in_partition(p, [&](const ObjectKey& k, const Value& v) { all.emplace(k, v); });
  }
  Super s;
  auto sit = all.find(ObjectKey::super());
  if (sit == all.end() || !decode_super(*sit->second, s)) return "superblock missing or corrupt";
  Inodes inodes;
  std::string e = decode_all(all, inodes);
  if (!e.empty()) return e;
  Tally t;
  for (const auto& [k, v] : all) {
    e = check_object(all, inodes, s, k, v, opt.dir_positions, t);
    if (!e.empty()) return e;
  }
  e = check_inode_counts(inodes, t);
  if (!e.empty()) return e;
  if (inodes.count(kRootIno) == 0) return "no root";
  if (s.used_inodes != inodes.size()) return "used_inodes wrong";
  if (s.used_blocks != t.data_objects) return "used_blocks wrong";
  return "";
}

}  // namespace bftfs::fs
