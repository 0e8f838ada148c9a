// Encoding of the write-ahead log's records (effects.h): a one-byte type tag, then the fields little-endian.
//
// The log's own framing and checksums catch torn and corrupt tails; this decoder is still as strict as the
// wire decoder (limits before allocation, no trailing bytes, booleans 0 or 1), because a record that decodes
// to something the replica never wrote would make recovery act on a promise it never made.
#include <type_traits>

#include "common/assert.h"
#include "common/codec.h"
#include "protocol/effects.h"
#include "protocol/wire.h"

namespace bftfs {

namespace {

// The tag is the variant index + 1, so 0 is never a valid record (a zeroed region does not decode). The tags
// are part of the on-disk format: new record types are appended to PersistRecord, never inserted.
static_assert(std::is_same_v<std::variant_alternative_t<0, PersistRecord>, ViewRecord>);
static_assert(std::is_same_v<std::variant_alternative_t<1, PersistRecord>, PrePrepareRecord>);
static_assert(std::is_same_v<std::variant_alternative_t<2, PersistRecord>, PreparedRecord>);
static_assert(std::is_same_v<std::variant_alternative_t<3, PersistRecord>, CommittedRecord>);
static_assert(std::is_same_v<std::variant_alternative_t<4, PersistRecord>, CheckpointRecord>);
static_assert(std::is_same_v<std::variant_alternative_t<5, PersistRecord>, StableRecord>);

std::size_t size_of(const ViewRecord&) { return 8 + 1; }
std::size_t size_of(const PrePrepareRecord& r) { return 8 + 8 + batch_encoded_size(r.batch); }
std::size_t size_of(const PreparedRecord&) { return 8 + 8 + kDigestBytes; }
std::size_t size_of(const CommittedRecord&) { return 8 + kDigestBytes; }
std::size_t size_of(const CheckpointRecord& r) { return 8 + kDigestBytes + kBlobLengthBytes + r.client_table.size(); }
std::size_t size_of(const StableRecord&) { return 8 + kDigestBytes; }

void write(ByteWriter& w, const ViewRecord& r) {
  w.u64(r.view);
  w.boolean(r.in_view_change);
}
void write(ByteWriter& w, const PrePrepareRecord& r) {
  w.u64(r.view);
  w.u64(r.seq);
  write_batch(w, r.batch);
}
void write(ByteWriter& w, const PreparedRecord& r) {
  w.u64(r.view);
  w.u64(r.seq);
  w.digest(r.digest);
}
void write(ByteWriter& w, const CommittedRecord& r) {
  w.u64(r.seq);
  w.digest(r.digest);
}
void write(ByteWriter& w, const CheckpointRecord& r) {
  // The client table travels as a StateLeaf in state transfer, so it has the same bound.
  BFT_ASSERT(r.client_table.size() <= kPartitionBytesMax);
  w.u64(r.seq);
  w.digest(r.digest);
  w.blob(r.client_table);
}
void write(ByteWriter& w, const StableRecord& r) {
  w.u64(r.seq);
  w.digest(r.digest);
}

bool read(ByteReader& in, ViewRecord& r) { return in.u64(r.view) && in.boolean(r.in_view_change); }
bool read(ByteReader& in, PrePrepareRecord& r) {
  if (!in.u64(r.view)) return false;
  if (!in.u64(r.seq)) return false;
  // The log does not know n; read_batch then bounds authenticators by kReplicasMax.
  return read_batch(in, 0, r.batch) == Reject::kNone;
}
bool read(ByteReader& in, PreparedRecord& r) { return in.u64(r.view) && in.u64(r.seq) && in.digest(r.digest); }
bool read(ByteReader& in, CommittedRecord& r) { return in.u64(r.seq) && in.digest(r.digest); }
bool read(ByteReader& in, CheckpointRecord& r) {
  return in.u64(r.seq) && in.digest(r.digest) && in.blob(r.client_table, kPartitionBytesMax);
}
bool read(ByteReader& in, StableRecord& r) { return in.u64(r.seq) && in.digest(r.digest); }

template <std::size_t I>
bool decode_as(ByteReader& in, PersistRecord& out) {
  return read(in, out.emplace<I>());
}

using DecodeFn = bool (*)(ByteReader&, PersistRecord&);
template <std::size_t... I>
constexpr std::array<DecodeFn, sizeof...(I)> make_decoders(std::index_sequence<I...>) {
  return {&decode_as<I>...};
}
constexpr auto kDecoders = make_decoders(std::make_index_sequence<std::variant_size_v<PersistRecord>>{});

}  // namespace

Bytes encode_record(const PersistRecord& r) {
  BFT_ASSERT(!r.valueless_by_exception());
  Bytes out;
  const std::size_t size = 1 + std::visit([](const auto& x) { return size_of(x); }, r);
  out.reserve(size);
  ByteWriter w(out);
  w.u8(static_cast<std::uint8_t>(r.index() + 1));
  std::visit([&w](const auto& x) { write(w, x); }, r);
  BFT_ASSERT(out.size() == size);
  return out;
}

bool decode_record(std::span<const std::uint8_t> data, PersistRecord& out) {
  ByteReader in(data);
  std::uint8_t tag = 0;
  if (!in.u8(tag)) return false;
  if (tag == 0 || tag > kDecoders.size()) return false;
  if (!kDecoders[tag - 1](in, out)) return false;
  return in.done();
}

}  // namespace bftfs
