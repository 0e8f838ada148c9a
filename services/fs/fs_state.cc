// The file service's value formats: see fs_state.h.
#include "services/fs/fs_state.h"

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"

namespace bftfs::fs {

namespace {

bool decode_file_type(std::uint8_t v, FileType& t) {
  if (v < 1 || v > kFileTypeMax) return false;
  t = static_cast<FileType>(v);
  return true;
}

}  // namespace

std::uint64_t dir_position_home(std::uint64_t dir_ino, std::uint64_t dir_generation, std::string_view name,
                                std::uint64_t positions) {
  BFT_ASSERT(positions >= 1);
  BFT_ASSERT(positions <= kDirPositionsMax);
  static constexpr char kTag[] = "bftfs dir position";
  const Digest d = DigestBuilder()
                       .add({reinterpret_cast<const std::uint8_t*>(kTag), sizeof(kTag) - 1})
                       .add_u64(dir_ino)
                       .add_u64(dir_generation)
                       .add({reinterpret_cast<const std::uint8_t*>(name.data()), name.size()})
                       .finish();
  return kFirstCookie + load_u64_le(d.bytes.data()) % positions;
}

std::uint64_t dir_position_next(std::uint64_t pos, std::uint64_t positions) {
  BFT_ASSERT(pos >= kFirstCookie);
  BFT_ASSERT(pos - kFirstCookie < positions);
  return pos - kFirstCookie + 1 == positions ? kFirstCookie : pos + 1;
}

Bytes encode_super(const Super& s) {
  Bytes out;
  ByteWriter w(out);
  w.u32(s.format);
  w.u64(s.next_ino);
  w.u64(s.used_inodes);
  w.u64(s.used_blocks);
  return out;
}

bool decode_super(std::span<const std::uint8_t> b, Super& s) {
  ByteReader r(b);
  return r.u32(s.format) && s.format == kStateFormat && r.u64(s.next_ino) && r.u64(s.used_inodes) &&
         r.u64(s.used_blocks) && r.done();
}

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
  w.u64(n.entries);
  w.u16(static_cast<std::uint16_t>(n.target.size()));
  w.bytes(n.target);
  w.u64(n.rdev);
  return out;
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
  if (!r.u64(n.parent) || !r.u64(n.entries)) return false;
  if (!r.u16(target_len)) return false;
  if (target_len > kSymlinkBytesMax) return false;
  if (!r.bytes(target_len, target)) return false;
  if (!r.u64(n.rdev)) return false;
  if (n.mode > kModeBits) return false;
  n.target.assign(target.begin(), target.end());
  return r.done();
}

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
  return r.u64(n.cookie) && n.cookie >= kFirstCookie && n.cookie <= kCookieMax && r.u64(n.ino) && r.u8(type) &&
         decode_file_type(type, n.type) && r.done();
}

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
    case Kind::kEntry:
      return k.ino != 0 && k.index >= kFirstCookie && k.index <= kCookieMax && decode_entry_rec(v, er);
    case Kind::kData: return k.ino != 0 && !v.empty() && v.size() <= kBlockBytes;
  }
  return false;
}

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

}  // namespace bftfs::fs
