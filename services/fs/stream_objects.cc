// The speculation streams' keys and value formats: see stream_objects.h.
#include "services/fs/stream_objects.h"

#include <string>
#include <utility>

#include "common/assert.h"
#include "common/codec.h"
#include "services/fs/fs_service.h"

namespace bftfs::fs {

namespace {

void put_be(std::string& out, std::uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

std::uint64_t get_be(const std::string& s, std::size_t at, int bytes) {
  BFT_ASSERT(at + static_cast<std::size_t>(bytes) <= s.size());
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<std::uint8_t>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

std::string stream_name(const StreamId& id) {
  std::string n;
  put_be(n, id.client, 4);
  put_be(n, id.stream, 8);
  return n;
}

}  // namespace

ObjectKey stream_key(const StreamId& id) { return {0, Kind::kStream, 0, stream_name(id)}; }
ObjectKey pool_head_key(const StreamId& id) { return {0, Kind::kPoolHead, 0, stream_name(id)}; }
ObjectKey pool_key(const StreamId& id, std::uint64_t index) {
  std::string n = stream_name(id);
  put_be(n, index, 8);
  return {0, Kind::kPool, 0, std::move(n)};
}
ObjectKey staged_key(const StreamId& id, std::uint32_t part, std::uint32_t chunk) {
  std::string n = stream_name(id);
  put_be(n, part, 4);
  put_be(n, chunk, 4);
  return {0, Kind::kStaged, 0, std::move(n)};
}
ObjectKey first_stream_key(NodeId client) {
  std::string n;
  put_be(n, client, 4);
  return {0, Kind::kStream, 0, std::move(n)};
}
ObjectKey first_staged_key(const StreamId& id) { return {0, Kind::kStaged, 0, stream_name(id)}; }
ObjectKey first_chunk_key(const StreamId& id, std::uint32_t part) {
  std::string n = stream_name(id);
  put_be(n, part, 4);
  return {0, Kind::kStaged, 0, std::move(n)};
}

bool has_prefix(const ObjectKey& k, const ObjectKey& like) {
  return k.ino == like.ino && k.kind == like.kind && k.name.compare(0, like.name.size(), like.name) == 0;
}

StreamId stream_of(const ObjectKey& k) {
  return StreamId{static_cast<NodeId>(get_be(k.name, 0, 4)), get_be(k.name, 4, 8)};
}
std::uint32_t part_of(const ObjectKey& k) { return static_cast<std::uint32_t>(get_be(k.name, 12, 4)); }
std::uint32_t chunk_of(const ObjectKey& k) { return static_cast<std::uint32_t>(get_be(k.name, 16, 4)); }
std::uint64_t pool_index_of(const ObjectKey& k) { return get_be(k.name, 12, 8); }

Bytes encode_stream(const StreamRec& s) {
  Bytes out;
  ByteWriter w(out);
  w.u64(s.last);
  w.u64(s.staging_epoch);
  w.u32(s.parts_present);
  w.u64(s.staged_bytes);
  w.u64(s.pool_tail);
  w.u64(s.last_seq);
  return out;
}

bool decode_stream(std::span<const std::uint8_t> b, StreamRec& s) {
  ByteReader r(b);
  return r.u64(s.last) && r.u64(s.staging_epoch) && r.u32(s.parts_present) && r.u64(s.staged_bytes) &&
         r.u64(s.pool_tail) && r.u64(s.last_seq) && r.done();
}

Bytes encode_reserved(const ReservedInode& ri) {
  Bytes out;
  ByteWriter w(out);
  w.u64(ri.ino);
  w.u64(ri.generation);
  return out;
}

bool decode_reserved(std::span<const std::uint8_t> b, ReservedInode& ri) {
  ByteReader r(b);
  return r.u64(ri.ino) && ri.ino > kRootIno && r.u64(ri.generation) && ri.generation >= 1 && r.done();
}

}  // namespace bftfs::fs
