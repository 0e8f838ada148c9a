// Digests and canonical signing bytes of protocol messages (messages.h).
#include "protocol/messages.h"

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"

namespace bftfs {

namespace {

std::span<const std::uint8_t> tag(std::string_view t) {
  return {reinterpret_cast<const std::uint8_t*>(t.data()), t.size()};
}

std::uint32_t count32(std::size_t n) {
  BFT_ASSERT(n <= 0xFFFFFFFFu);
  return static_cast<std::uint32_t>(n);
}

// The signed content of a view change, without a domain tag (shared by both signing encodings).
void write_view_change_fields(ByteWriter& w, const ViewChange& vc) {
  w.u64(vc.new_view);
  w.u32(vc.replica);
  w.u64(vc.stable_seq);
  w.u32(count32(vc.checkpoints.size()));
  for (const auto& c : vc.checkpoints) {
    w.u64(c.seq);
    w.digest(c.digest);
  }
  for (const auto* claims : {&vc.prepared, &vc.pre_prepared}) {
    w.u32(count32(claims->size()));
    for (const auto& p : *claims) {
      w.u64(p.seq);
      w.digest(p.digest);
      w.u64(p.view);
    }
  }
}

std::size_t view_change_fields_size(const ViewChange& vc) {
  return 8 + 4 + 8 + 4 + vc.checkpoints.size() * (8 + kDigestBytes) +
         2 * 4 + (vc.prepared.size() + vc.pre_prepared.size()) * (8 + kDigestBytes + 8);
}

}  // namespace

std::string_view to_string(MsgType t) {
  switch (t) {
    case MsgType::kRequest:
      return "REQUEST";
    case MsgType::kPrePrepare:
      return "PRE-PREPARE";
    case MsgType::kPrepare:
      return "PREPARE";
    case MsgType::kCommit:
      return "COMMIT";
    case MsgType::kReply:
      return "REPLY";
    case MsgType::kCheckpoint:
      return "CHECKPOINT";
    case MsgType::kViewChange:
      return "VIEW-CHANGE";
    case MsgType::kNewView:
      return "NEW-VIEW";
    case MsgType::kStatus:
      return "STATUS";
    case MsgType::kFetchBatch:
      return "FETCH-BATCH";
    case MsgType::kBatchData:
      return "BATCH-DATA";
    case MsgType::kFetchState:
      return "FETCH-STATE";
    case MsgType::kStateNode:
      return "STATE-NODE";
    case MsgType::kStateLeaf:
      return "STATE-LEAF";
  }
  return "UNKNOWN";
}

Digest Request::digest() const {
  // Every field before `op` has a fixed size, so the concatenation is unambiguous without a length for op.
  DigestBuilder b;
  const std::uint8_t f[1] = {flags};
  b.add(tag("req")).add_u32(client).add_u64(request_id).add_u64(prev_request_id).add(f).add(op);
  return b.finish();
}

Digest Batch::digest() const {
  DigestBuilder b;
  b.add(tag("batch")).add_u64(timestamp_ns).add_u32(count32(requests.size()));
  for (const auto& r : requests) b.add_digest(r.digest());
  return b.finish();
}

Digest null_batch_digest() {
  static const Digest d = Batch{}.digest();
  return d;
}

MsgType type_of(const Message& m) {
  // The variant's alternatives are declared in MsgType order, starting at 1.
  static_assert(std::variant_size_v<Message> == 14);
  static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Request>);
  static_assert(std::is_same_v<std::variant_alternative_t<13, Message>, StateLeaf>);
  BFT_ASSERT(!m.valueless_by_exception());
  return static_cast<MsgType>(m.index() + 1);
}

Bytes view_change_signing_bytes(const ViewChange& vc) {
  Bytes out;
  ByteWriter w(out);
  w.reserve(2 + view_change_fields_size(vc));
  w.bytes(std::string_view("vc"));
  write_view_change_fields(w, vc);
  return out;
}

Bytes new_view_signing_bytes(const NewView& nv) {
  // The new primary signs the whole set S, each view change with its own signature, so a verifier of the
  // new-view signature knows exactly which signed view changes the primary based its decision on.
  std::size_t size = 2 + 8 + 4;
  for (const auto& vc : nv.view_changes) size += view_change_fields_size(vc) + kSignatureBytes;
  Bytes out;
  ByteWriter w(out);
  w.reserve(size);
  w.bytes(std::string_view("nv"));
  w.u64(nv.view);
  w.u32(count32(nv.view_changes.size()));
  for (const auto& vc : nv.view_changes) {
    write_view_change_fields(w, vc);
    w.signature(vc.signature);
  }
  return out;
}

}  // namespace bftfs
