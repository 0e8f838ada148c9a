// The wire codec (wire.h): frame header, per-type bodies, authentication, and strict validation of input.
//
// Encoding reserves the exact frame size up front (one allocation per frame). Decoding reads through a
// ByteReader; every count or length is compared with its limit and with the bytes that remain before anything
// is allocated for it, and the first failed check names the reject reason.
#include "protocol/wire.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/assert.h"
#include "common/codec.h"
#include "common/config.h"

namespace bftfs {

namespace {

// ---- header layout (offsets of wire.h) ----
constexpr std::size_t kOffMagic = 0;
constexpr std::size_t kOffVersion = 4;
constexpr std::size_t kOffType = 5;
constexpr std::size_t kOffReserved1 = 6;
constexpr std::size_t kOffSender = 8;
constexpr std::size_t kOffReceiver = 12;
constexpr std::size_t kOffView = 16;
constexpr std::size_t kOffSeq = 24;
constexpr std::size_t kOffBodyBytes = 32;
constexpr std::size_t kOffReserved2 = 36;
constexpr std::size_t kOffDigest = 40;
static_assert(kOffDigest + kDigestBytes == kHeaderBytes, "the header layout must fill exactly kHeaderBytes");
static_assert(kFrameOverheadBytes == 88);
static_assert(kClusterReplicasMax == kReplicasMax, "a configuration must fit the wire limit on replicas");

constexpr std::size_t kBodyBytesMax = kFrameBytesMax - kFrameOverheadBytes;
constexpr std::uint8_t kTypeMin = static_cast<std::uint8_t>(MsgType::kRequest);
constexpr std::uint8_t kTypeMax = static_cast<std::uint8_t>(MsgType::kStateLeaf);

// ---- encoded sizes (kept next to the writers below; the writers assert they match) ----
constexpr std::size_t kRequestFixedBytes = 4 + 8 + 8 + 1 + 4 + 4 + 4;  // client id prev flags replier |op| |auth|
constexpr std::size_t kBatchFixedBytes = 8 + 4;                   // timestamp |requests|
constexpr std::size_t kCheckpointClaimBytes = 8 + kDigestBytes;
constexpr std::size_t kPreparedClaimBytes = 8 + kDigestBytes + 8;
constexpr std::size_t kViewChangeFixedBytes = 8 + 4 + 8 + 4 + 4 + 4 + kSignatureBytes;

std::uint32_t u32_of(std::size_t n) {
  BFT_ASSERT(n <= 0xFFFFFFFFu);
  return static_cast<std::uint32_t>(n);
}

std::size_t request_size(const Request& r) {
  return kRequestFixedBytes + r.op.size() + r.authenticator.size() * kMacBytes;
}

std::size_t view_change_size(const ViewChange& vc) {
  return kViewChangeFixedBytes + vc.checkpoints.size() * kCheckpointClaimBytes +
         (vc.prepared.size() + vc.pre_prepared.size()) * kPreparedClaimBytes;
}

std::size_t body_size(const Request& m) { return request_size(m); }
std::size_t body_size(const PrePrepare& m) { return 8 + 8 + batch_encoded_size(m.batch); }
std::size_t body_size(const Prepare&) { return 8 + 8 + kDigestBytes; }
std::size_t body_size(const Commit&) { return 8 + 8 + kDigestBytes; }
std::size_t body_size(const Reply& m) { return 8 + 4 + 8 + 1 + kDigestBytes + 4 + m.result.size(); }
std::size_t body_size(const Checkpoint&) { return 8 + kDigestBytes; }
std::size_t body_size(const ViewChange& m) { return view_change_size(m); }
std::size_t body_size(const NewView& m) {
  std::size_t n = 8 + 4 + kSignatureBytes;
  for (const auto& vc : m.view_changes) n += view_change_size(vc);
  return n;
}
std::size_t body_size(const Status&) { return 8 + 1 + 8 + 8 + 8; }
std::size_t body_size(const FetchBatch&) { return 8 + kDigestBytes; }
std::size_t body_size(const BatchData& m) { return 8 + batch_encoded_size(m.batch); }
std::size_t body_size(const FetchState&) { return 8 + 4 + 8; }
std::size_t body_size(const StateNode& m) { return 8 + 4 + 8 + 4 + m.children.size() * kDigestBytes; }
std::size_t body_size(const StateLeaf& m) { return 8 + 8 + 4 + m.data.size(); }

// ---- writers. They assert the limits of messages.h: the core never builds a message past them. ----
void write_request(ByteWriter& w, const Request& r) {
  BFT_ASSERT(r.op.size() <= kOpBytesMax);
  BFT_ASSERT(r.authenticator.size() <= kReplicasMax);
  w.u32(r.client);
  w.u64(r.request_id);
  w.u64(r.prev_request_id);
  w.u8(r.flags);
  w.u32(r.replier);
  w.blob(r.op);
  w.u32(u32_of(r.authenticator.size()));
  for (const auto& m : r.authenticator) w.mac(m);
}

void write_claims(ByteWriter& w, const std::vector<PreparedClaim>& claims) {
  BFT_ASSERT(claims.size() <= kViewChangeEntriesMax);
  w.u32(u32_of(claims.size()));
  for (const auto& c : claims) {
    w.u64(c.seq);
    w.digest(c.digest);
    w.u64(c.view);
  }
}

void write_view_change(ByteWriter& w, const ViewChange& vc) {
  BFT_ASSERT(vc.checkpoints.size() <= kViewChangeEntriesMax);
  w.u64(vc.new_view);
  w.u32(vc.replica);
  w.u64(vc.stable_seq);
  w.u32(u32_of(vc.checkpoints.size()));
  for (const auto& c : vc.checkpoints) {
    w.u64(c.seq);
    w.digest(c.digest);
  }
  write_claims(w, vc.prepared);
  write_claims(w, vc.pre_prepared);
  w.signature(vc.signature);
}

void write_body(ByteWriter& w, const Request& m) { write_request(w, m); }
void write_body(ByteWriter& w, const PrePrepare& m) {
  w.u64(m.view);
  w.u64(m.seq);
  write_batch(w, m.batch);
}
void write_body(ByteWriter& w, const Prepare& m) {
  w.u64(m.view);
  w.u64(m.seq);
  w.digest(m.digest);
}
void write_body(ByteWriter& w, const Commit& m) {
  w.u64(m.view);
  w.u64(m.seq);
  w.digest(m.digest);
}
void write_body(ByteWriter& w, const Reply& m) {
  BFT_ASSERT(m.result.size() <= kResultBytesMax);
  w.u64(m.view);
  w.u32(m.client);
  w.u64(m.request_id);
  w.u8(m.flags);
  w.digest(m.result_digest);
  w.blob(m.result);
}
void write_body(ByteWriter& w, const Checkpoint& m) {
  w.u64(m.seq);
  w.digest(m.state_digest);
}
void write_body(ByteWriter& w, const ViewChange& m) { write_view_change(w, m); }
void write_body(ByteWriter& w, const NewView& m) {
  BFT_ASSERT(m.view_changes.size() <= kReplicasMax);
  w.u64(m.view);
  w.u32(u32_of(m.view_changes.size()));
  for (const auto& vc : m.view_changes) write_view_change(w, vc);
  w.signature(m.signature);
}
void write_body(ByteWriter& w, const Status& m) {
  w.u64(m.view);
  w.boolean(m.in_view_change);
  w.u64(m.stable_seq);
  w.u64(m.last_executed);
  w.u64(m.last_committed);
}
void write_body(ByteWriter& w, const FetchBatch& m) {
  w.u64(m.seq);
  w.digest(m.digest);
}
void write_body(ByteWriter& w, const BatchData& m) {
  w.u64(m.seq);
  write_batch(w, m.batch);
}
void write_body(ByteWriter& w, const FetchState& m) {
  w.u64(m.checkpoint_seq);
  w.u32(m.level);
  w.u64(m.index);
}
void write_body(ByteWriter& w, const StateNode& m) {
  BFT_ASSERT(m.children.size() <= kStateChildrenMax);
  w.u64(m.checkpoint_seq);
  w.u32(m.level);
  w.u64(m.index);
  w.u32(u32_of(m.children.size()));
  for (const auto& d : m.children) w.digest(d);
}
void write_body(ByteWriter& w, const StateLeaf& m) {
  BFT_ASSERT(m.data.size() <= kPartitionBytesMax);
  w.u64(m.checkpoint_seq);
  w.u64(m.index);
  w.blob(m.data);
}

// ---- header fields per type (wire.h): the message's view, seq (or request id) and main digest ----
struct HeaderFields {
  std::uint64_t view = 0;
  std::uint64_t seq = 0;
  Digest digest;
  friend bool operator==(const HeaderFields&, const HeaderFields&) = default;
};

HeaderFields header_fields(const Request& m) { return {0, m.request_id, m.digest()}; }
HeaderFields header_fields(const PrePrepare& m) { return {m.view, m.seq, m.batch.digest()}; }
HeaderFields header_fields(const Prepare& m) { return {m.view, m.seq, m.digest}; }
HeaderFields header_fields(const Commit& m) { return {m.view, m.seq, m.digest}; }
HeaderFields header_fields(const Reply& m) { return {m.view, m.request_id, m.result_digest}; }
HeaderFields header_fields(const Checkpoint& m) { return {0, m.seq, m.state_digest}; }
HeaderFields header_fields(const ViewChange& m) { return {m.new_view, 0, Digest{}}; }
HeaderFields header_fields(const NewView& m) { return {m.view, 0, Digest{}}; }
HeaderFields header_fields(const Status& m) { return {m.view, 0, Digest{}}; }
HeaderFields header_fields(const FetchBatch& m) { return {0, m.seq, m.digest}; }
HeaderFields header_fields(const BatchData& m) { return {0, m.seq, m.batch.digest()}; }
HeaderFields header_fields(const FetchState& m) { return {0, m.checkpoint_seq, Digest{}}; }
HeaderFields header_fields(const StateNode& m) { return {0, m.checkpoint_seq, Digest{}}; }
HeaderFields header_fields(const StateLeaf& m) { return {0, m.checkpoint_seq, Digest{}}; }

HeaderFields header_fields_of(const Message& m) {
  return std::visit([](const auto& x) { return header_fields(x); }, m);
}

// ---- readers ----

// A ByteReader that remembers why it failed. Every read names the reason it fails with; the first failure
// wins and every later read fails too (the ByteReader's error is sticky).
class BodyReader {
 public:
  BodyReader(ByteReader& r, std::uint32_t replicas) : r_(r), replicas_(replicas) {}

  std::uint32_t replicas() const { return replicas_; }
  Reject reject() const { return reject_; }
  bool ok() const { return reject_ == Reject::kNone; }

  bool fail(Reject why) {
    BFT_ASSERT(why != Reject::kNone);
    if (reject_ == Reject::kNone) reject_ = why;
    r_.fail();
    return false;
  }
  bool u8(std::uint8_t& v) { return r_.u8(v) || fail(Reject::kTruncatedBody); }
  bool u32(std::uint32_t& v) { return r_.u32(v) || fail(Reject::kTruncatedBody); }
  bool u64(std::uint64_t& v) { return r_.u64(v) || fail(Reject::kTruncatedBody); }
  bool digest(Digest& d) { return r_.digest(d) || fail(Reject::kTruncatedBody); }
  bool mac(Mac& m) { return r_.mac(m) || fail(Reject::kTruncatedBody); }
  bool signature(Signature& s) { return r_.signature(s) || fail(Reject::kTruncatedBody); }
  bool boolean(bool& v) {
    std::uint8_t b = 0;
    v = false;
    if (!u8(b)) return false;
    if (b > 1) return fail(Reject::kBadField);
    v = b == 1;
    return true;
  }
  // A u32 count of elements of at least `element_bytes` each: over `max` is kLimitExceeded, more than the
  // remaining bytes can hold is kTruncatedBody. Both are checked before the caller allocates.
  bool count(std::uint32_t& n, std::uint32_t max, std::size_t element_bytes) {
    if (!u32(n)) return false;
    if (n > max) return fail(Reject::kLimitExceeded);
    if (static_cast<std::uint64_t>(n) * element_bytes > r_.remaining()) return fail(Reject::kTruncatedBody);
    return true;
  }
  // u32 length and bytes: the length is checked against `max` and the remaining bytes before allocating.
  bool blob(Bytes& out, std::uint32_t max) {
    std::uint32_t n = 0;
    if (!count(n, max, 1)) return false;
    return r_.bytes(n, out) || fail(Reject::kTruncatedBody);
  }
  // The body must be consumed exactly.
  bool finish() {
    if (!ok()) return false;
    if (r_.remaining() != 0) return fail(Reject::kTrailingBytes);
    return true;
  }

 private:
  ByteReader& r_;
  std::uint32_t replicas_;  // n, or 0 when unknown (write-ahead log)
  Reject reject_ = Reject::kNone;
};

// Client ids are >= n (config.h); with n unknown nothing can be said.
bool valid_client(const BodyReader& in, NodeId client) { return client >= in.replicas(); }
bool valid_replica(const BodyReader& in, NodeId id) {
  return id < (in.replicas() == 0 ? kReplicasMax : in.replicas());
}

bool read_request(BodyReader& in, Request& r) {
  if (!in.u32(r.client)) return false;
  if (!valid_client(in, r.client)) return in.fail(Reject::kBadField);
  if (!in.u64(r.request_id)) return false;
  if (!in.u64(r.prev_request_id)) return false;
  // The predecessor was issued before this request (messages.h), so its id is lower; 0 means none.
  if (r.prev_request_id >= r.request_id && r.prev_request_id != 0) return in.fail(Reject::kBadPredecessor);
  if (!in.u8(r.flags)) return false;
  if ((r.flags & ~kRequestFlagsKnown) != 0) return in.fail(Reject::kBadFlags);
  if (!in.u32(r.replier)) return false;
  if (r.replier != kReplierAll && !valid_replica(in, r.replier)) return in.fail(Reject::kBadField);
  if (!in.blob(r.op, kOpBytesMax)) return false;
  std::uint32_t macs = 0;
  if (!in.count(macs, kReplicasMax, kMacBytes)) return false;
  if (in.replicas() != 0 && macs != in.replicas()) return in.fail(Reject::kBadAuthenticator);
  if (macs == 0) return in.fail(Reject::kBadAuthenticator);
  r.authenticator.resize(macs);
  for (auto& m : r.authenticator) {
    if (!in.mac(m)) return false;
  }
  return true;
}

bool read_batch_fields(BodyReader& in, Batch& b) {
  if (!in.u64(b.timestamp_ns)) return false;
  std::uint32_t n = 0;
  if (!in.count(n, kBatchRequestsMax, kRequestFixedBytes)) return false;
  b.requests.clear();
  b.requests.resize(n);
  for (auto& r : b.requests) {
    if (!read_request(in, r)) return false;
  }
  return true;
}

bool read_claims(BodyReader& in, std::vector<PreparedClaim>& claims) {
  std::uint32_t n = 0;
  if (!in.count(n, kViewChangeEntriesMax, kPreparedClaimBytes)) return false;
  claims.resize(n);
  for (auto& c : claims) {
    if (!in.u64(c.seq)) return false;
    if (!in.digest(c.digest)) return false;
    if (!in.u64(c.view)) return false;
  }
  return true;
}

bool read_view_change(BodyReader& in, ViewChange& vc) {
  if (!in.u64(vc.new_view)) return false;
  if (!in.u32(vc.replica)) return false;
  if (!valid_replica(in, vc.replica)) return in.fail(Reject::kBadField);
  if (!in.u64(vc.stable_seq)) return false;
  std::uint32_t n = 0;
  if (!in.count(n, kViewChangeEntriesMax, kCheckpointClaimBytes)) return false;
  vc.checkpoints.resize(n);
  for (auto& c : vc.checkpoints) {
    if (!in.u64(c.seq)) return false;
    if (!in.digest(c.digest)) return false;
  }
  if (!read_claims(in, vc.prepared)) return false;
  if (!read_claims(in, vc.pre_prepared)) return false;
  return in.signature(vc.signature);
}

bool read_body(BodyReader& in, Request& m) { return read_request(in, m); }
bool read_body(BodyReader& in, PrePrepare& m) {
  return in.u64(m.view) && in.u64(m.seq) && read_batch_fields(in, m.batch);
}
bool read_body(BodyReader& in, Prepare& m) { return in.u64(m.view) && in.u64(m.seq) && in.digest(m.digest); }
bool read_body(BodyReader& in, Commit& m) { return in.u64(m.view) && in.u64(m.seq) && in.digest(m.digest); }
bool read_body(BodyReader& in, Reply& m) {
  if (!in.u64(m.view)) return false;
  if (!in.u32(m.client)) return false;
  if (!valid_client(in, m.client)) return in.fail(Reject::kBadField);
  if (!in.u64(m.request_id)) return false;
  if (!in.u8(m.flags)) return false;
  if ((m.flags & ~kReplyFlagsKnown) != 0) return in.fail(Reject::kBadFlags);
  if (!in.digest(m.result_digest)) return false;
  if (!in.blob(m.result, kResultBytesMax)) return false;
  if ((m.flags & kReplyHasResult) == 0 && !m.result.empty()) return in.fail(Reject::kBadField);
  return true;
}
bool read_body(BodyReader& in, Checkpoint& m) { return in.u64(m.seq) && in.digest(m.state_digest); }
bool read_body(BodyReader& in, ViewChange& m) { return read_view_change(in, m); }
bool read_body(BodyReader& in, NewView& m) {
  if (!in.u64(m.view)) return false;
  std::uint32_t n = 0;
  if (!in.count(n, kReplicasMax, kViewChangeFixedBytes)) return false;
  m.view_changes.resize(n);
  for (auto& vc : m.view_changes) {
    if (!read_view_change(in, vc)) return false;
    if (vc.new_view != m.view) return in.fail(Reject::kBadField);
  }
  return in.signature(m.signature);
}
bool read_body(BodyReader& in, Status& m) {
  return in.u64(m.view) && in.boolean(m.in_view_change) && in.u64(m.stable_seq) && in.u64(m.last_executed) &&
         in.u64(m.last_committed);
}
bool read_body(BodyReader& in, FetchBatch& m) { return in.u64(m.seq) && in.digest(m.digest); }
bool read_body(BodyReader& in, BatchData& m) { return in.u64(m.seq) && read_batch_fields(in, m.batch); }
bool read_body(BodyReader& in, FetchState& m) {
  return in.u64(m.checkpoint_seq) && in.u32(m.level) && in.u64(m.index);
}
bool read_body(BodyReader& in, StateNode& m) {
  if (!in.u64(m.checkpoint_seq)) return false;
  if (!in.u32(m.level)) return false;
  if (!in.u64(m.index)) return false;
  std::uint32_t n = 0;
  if (!in.count(n, kStateChildrenMax, kDigestBytes)) return false;
  // Every node of a partition tree has at least one child (PartitionTree needs leaves > 0).
  if (n == 0) return in.fail(Reject::kBadField);
  m.children.resize(n);
  for (auto& d : m.children) {
    if (!in.digest(d)) return false;
  }
  return true;
}
bool read_body(BodyReader& in, StateLeaf& m) {
  return in.u64(m.checkpoint_seq) && in.u64(m.index) && in.blob(m.data, kPartitionBytesMax);
}

// Checks that need the whole body and cost more than reading it (hashing), done after the trailing-bytes
// check so garbage is rejected cheaply first.
Reject check_body(const Message& m) {
  if (const auto* reply = std::get_if<Reply>(&m)) {
    if ((reply->flags & kReplyHasResult) != 0 && digest_of(reply->result) != reply->result_digest) {
      return Reject::kBadResultDigest;
    }
  }
  return Reject::kNone;
}

// Decodes a body of type index I (MsgType I + 1) into out.
template <std::size_t I>
Reject decode_body_as(std::span<const std::uint8_t> body, std::uint32_t replicas, Message& out) {
  ByteReader r(body);
  BodyReader in(r, replicas);
  auto& m = out.emplace<I>();
  if (!read_body(in, m)) return in.reject();
  if (!in.finish()) return in.reject();
  return check_body(out);
}

using DecodeFn = Reject (*)(std::span<const std::uint8_t>, std::uint32_t, Message&);

template <std::size_t... I>
constexpr std::array<DecodeFn, sizeof...(I)> make_decoders(std::index_sequence<I...>) {
  return {&decode_body_as<I>...};
}
constexpr auto kDecoders = make_decoders(std::make_index_sequence<std::variant_size_v<Message>>{});
static_assert(kDecoders.size() == kTypeMax - kTypeMin + 1, "one decoder per MsgType");

// Writes header || body into `out` (which must be empty), with `receiver` and no MAC. Returns nothing; the
// caller appends the MAC.
void encode_header_and_body(const Message& m, NodeId sender, NodeId receiver, Bytes& out) {
  BFT_ASSERT(out.empty());
  const std::size_t body = std::visit([](const auto& x) { return body_size(x); }, m);
  BFT_ASSERT(body <= kBodyBytesMax);
  const HeaderFields h = header_fields_of(m);
  out.reserve(kHeaderBytes + body + kMacBytes);
  ByteWriter w(out);
  w.u32(kWireMagic);
  w.u8(kWireVersion);
  w.u8(static_cast<std::uint8_t>(type_of(m)));
  w.u16(0);
  w.u32(sender);
  w.u32(receiver);
  w.u64(h.view);
  w.u64(h.seq);
  w.u32(static_cast<std::uint32_t>(body));
  w.u32(0);
  w.digest(h.digest);
  BFT_ASSERT(out.size() == kHeaderBytes);
  std::visit([&w](const auto& x) { write_body(w, x); }, m);
  BFT_ASSERT(out.size() == kHeaderBytes + body);
}

void append_mac(Bytes& frame, NodeId receiver, const Crypto& crypto) {
  const Mac mac = crypto.mac(receiver, frame);
  frame.insert(frame.end(), mac.bytes.begin(), mac.bytes.end());
}

// The header checks shared by decode_frame and frame_length, in the order of wire.h: magic, version,
// reserved fields, type. Precondition: at least kHeaderBytes.
Reject check_header_prefix(const std::uint8_t* h) {
  if (load_u32_le(h + kOffMagic) != kWireMagic) return Reject::kBadMagic;
  if (h[kOffVersion] != kWireVersion) return Reject::kBadVersion;
  if (load_u16_le(h + kOffReserved1) != 0) return Reject::kBadReserved;
  if (load_u32_le(h + kOffReserved2) != 0) return Reject::kBadReserved;
  if (h[kOffType] < kTypeMin || h[kOffType] > kTypeMax) return Reject::kBadType;
  return Reject::kNone;
}

}  // namespace

std::string_view to_string(Reject r) {
  switch (r) {
    case Reject::kNone:
      return "none";
    case Reject::kTooShort:
      return "too short";
    case Reject::kTooLong:
      return "too long";
    case Reject::kBadMagic:
      return "bad magic";
    case Reject::kBadVersion:
      return "bad version";
    case Reject::kBadReserved:
      return "bad reserved field";
    case Reject::kBadType:
      return "bad type";
    case Reject::kBadBodySize:
      return "bad body size";
    case Reject::kUnknownSender:
      return "unknown sender";
    case Reject::kWrongReceiver:
      return "wrong receiver";
    case Reject::kBadMac:
      return "bad MAC";
    case Reject::kBadPredecessor:
      return "bad predecessor request id";
    case Reject::kTruncatedBody:
      return "truncated body";
    case Reject::kTrailingBytes:
      return "trailing bytes";
    case Reject::kLimitExceeded:
      return "limit exceeded";
    case Reject::kBadFlags:
      return "bad flags";
    case Reject::kBadResultDigest:
      return "bad result digest";
    case Reject::kHeaderMismatch:
      return "header mismatch";
    case Reject::kBadAuthenticator:
      return "bad authenticator";
    case Reject::kBadSignature:
      return "bad signature";
    case Reject::kBadField:
      return "bad field";
  }
  return "unknown reject";
}

std::size_t batch_encoded_size(const Batch& b) {
  std::size_t n = kBatchFixedBytes;
  for (const auto& r : b.requests) n += request_size(r);
  return n;
}

void write_batch(ByteWriter& w, const Batch& b) {
  BFT_ASSERT(b.requests.size() <= kBatchRequestsMax);
  w.u64(b.timestamp_ns);
  w.u32(u32_of(b.requests.size()));
  for (const auto& r : b.requests) write_request(w, r);
}

Reject read_batch(ByteReader& r, std::uint32_t replicas, Batch& out) {
  BFT_ASSERT(replicas <= kReplicasMax);
  BodyReader in(r, replicas);
  read_batch_fields(in, out);
  return in.reject();
}

Bytes encode_frame(const Message& m, NodeId sender, NodeId receiver, const Crypto& crypto) {
  BFT_ASSERT(crypto.self() == sender);
  Bytes frame;
  encode_header_and_body(m, sender, receiver, frame);
  append_mac(frame, receiver, crypto);
  BFT_ASSERT(frame.size() <= kFrameBytesMax);
  return frame;
}

Bytes encode_unsealed(const Message& m, NodeId sender) {
  Bytes frame;
  encode_header_and_body(m, sender, 0, frame);
  return frame;
}

Bytes seal_for(const Bytes& unsealed, NodeId receiver, const Crypto& crypto) {
  BFT_ASSERT(unsealed.size() >= kHeaderBytes);
  BFT_ASSERT(unsealed.size() + kMacBytes <= kFrameBytesMax);
  BFT_ASSERT(load_u32_le(unsealed.data() + kOffSender) == crypto.self());
  BFT_ASSERT(load_u32_le(unsealed.data() + kOffBodyBytes) + kHeaderBytes == unsealed.size());
  Bytes frame;
  frame.reserve(unsealed.size() + kMacBytes);
  frame.assign(unsealed.begin(), unsealed.end());
  store_u32_le(frame.data() + kOffReceiver, receiver);
  append_mac(frame, receiver, crypto);
  return frame;
}

Bytes encode_body(const Message& m) {
  Bytes out;
  out.reserve(std::visit([](const auto& x) { return body_size(x); }, m));
  ByteWriter w(out);
  std::visit([&w](const auto& x) { write_body(w, x); }, m);
  return out;
}

Reject decode_body(MsgType t, std::span<const std::uint8_t> body, std::uint32_t replicas, Message& out) {
  BFT_ASSERT(replicas >= 1);
  BFT_ASSERT(replicas <= kReplicasMax);
  const auto type = static_cast<std::uint8_t>(t);
  if (type < kTypeMin || type > kTypeMax) return Reject::kBadType;
  if (body.size() > kBodyBytesMax) return Reject::kBadBodySize;
  return kDecoders[type - kTypeMin](body, replicas, out);
}

Decoded decode_frame(std::span<const std::uint8_t> frame, std::uint32_t replicas, const Crypto& crypto) {
  BFT_ASSERT(replicas >= 1);
  BFT_ASSERT(replicas <= kReplicasMax);
  Decoded d;
  auto reject = [&d](Reject why) {
    d.reject = why;
    return std::move(d);
  };
  if (frame.size() < kFrameOverheadBytes) return reject(Reject::kTooShort);
  if (frame.size() > kFrameBytesMax) return reject(Reject::kTooLong);
  const std::uint8_t* h = frame.data();
  if (Reject r = check_header_prefix(h); r != Reject::kNone) return reject(r);
  const std::size_t body_bytes = frame.size() - kFrameOverheadBytes;
  if (load_u32_le(h + kOffBodyBytes) != body_bytes) return reject(Reject::kBadBodySize);
  const NodeId sender = load_u32_le(h + kOffSender);
  d.sender = sender;
  if (!crypto.knows(sender)) return reject(Reject::kUnknownSender);
  if (load_u32_le(h + kOffReceiver) != crypto.self()) return reject(Reject::kWrongReceiver);
  Mac mac;
  std::memcpy(mac.bytes.data(), frame.data() + kHeaderBytes + body_bytes, kMacBytes);
  if (!crypto.verify_mac(sender, frame.first(kHeaderBytes + body_bytes), mac)) return reject(Reject::kBadMac);

  // The sender is authenticated from here on. Sender roles: only replicas send anything but requests. A request
  // comes from its client or is relayed by a backup to the primary (TOCS §2.4: a backup that got a request
  // directly forwards it and starts its view-change timer); either way the request's own authenticator, not
  // the frame sender, proves which client issued it.
  const auto type = static_cast<MsgType>(h[kOffType]);
  const bool sender_is_replica = sender < replicas;
  if (type != MsgType::kRequest && !sender_is_replica) return reject(Reject::kBadField);

  const Reject body = decode_body(type, frame.subspan(kHeaderBytes, body_bytes), replicas, d.message);
  if (body != Reject::kNone) return reject(body);

  HeaderFields header;
  header.view = load_u64_le(h + kOffView);
  header.seq = load_u64_le(h + kOffSeq);
  std::memcpy(header.digest.bytes.data(), h + kOffDigest, kDigestBytes);
  if (header != header_fields_of(d.message)) return reject(Reject::kHeaderMismatch);

  if (const auto* vc = std::get_if<ViewChange>(&d.message); vc != nullptr && vc->replica != sender) {
    return reject(Reject::kBadField);
  }
  return d;
}

Reject check_signatures(const Message& m, std::uint32_t replicas, const Crypto& crypto) {
  BFT_ASSERT(replicas >= 1);
  auto vc_ok = [&crypto](const ViewChange& vc) {
    return crypto.verify_signature(vc.replica, view_change_signing_bytes(vc), vc.signature);
  };
  if (const auto* vc = std::get_if<ViewChange>(&m)) return vc_ok(*vc) ? Reject::kNone : Reject::kBadSignature;
  if (const auto* nv = std::get_if<NewView>(&m)) {
    const auto primary = static_cast<NodeId>(nv->view % replicas);
    if (!crypto.verify_signature(primary, new_view_signing_bytes(*nv), nv->signature)) return Reject::kBadSignature;
    for (const auto& vc : nv->view_changes) {
      if (!vc_ok(vc)) return Reject::kBadSignature;
    }
  }
  return Reject::kNone;
}

std::size_t frame_length(std::span<const std::uint8_t> header, Reject& reject) {
  reject = Reject::kNone;
  if (header.size() < kHeaderBytes) {
    reject = Reject::kTooShort;
    return 0;
  }
  if (Reject r = check_header_prefix(header.data()); r != Reject::kNone) {
    reject = r;
    return 0;
  }
  const std::uint32_t body = load_u32_le(header.data() + kOffBodyBytes);
  if (body > kBodyBytesMax) {
    reject = Reject::kTooLong;
    return 0;
  }
  return kHeaderBytes + body + kMacBytes;
}

}  // namespace bftfs
