// The wire format: one frame per message.
//
//   frame = header (72 bytes, little-endian) || body (body_bytes) || MAC (16 bytes)
//
//   offset size field
//        0    4 magic        0x31544642 ("BFT1" read as little-endian bytes 'B','F','T','1')
//        4    1 version      kWireVersion
//        5    1 type         MsgType
//        6    2 reserved     must be 0
//        8    4 sender       NodeId
//       12    4 receiver     NodeId (the MAC binds it: a frame cannot be reflected or redirected)
//       16    8 view         the message's view (0 where the type has none)
//       24    8 seq          the message's sequence number or request id (0 where the type has none)
//       32    4 body_bytes   <= kFrameBytesMax - 88
//       36    4 reserved     must be 0
//       40   32 digest       the message's main digest (batch, request, result, state), zero where none
//
// The MAC is MAC(session key(sender, receiver), header || body). Decoding checks, one reason per check, in
// this order: length, magic, version, reserved fields, type, body size, sender known, receiver == self, MAC,
// the sender's role (see decode_frame), then the body field by field against the limits in messages.h, then
// cross-field consistency (no trailing bytes, result digest, header view/seq/digest equal the body's, a view
// change's signer is its sender). Nothing is allocated before the size it depends on is
// checked. A rejected frame is counted and dropped by the caller; decoding never throws or asserts on input.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "common/crypto.h"
#include "protocol/messages.h"

namespace bftfs {

inline constexpr std::uint32_t kWireMagic = 0x31544642u;
inline constexpr std::uint8_t kWireVersion = 2;  // 2: Request::prev_request_id
inline constexpr std::size_t kHeaderBytes = 72;
inline constexpr std::size_t kFrameOverheadBytes = kHeaderBytes + kMacBytes;

enum class Reject : std::uint8_t {
  kNone = 0,
  kTooShort,
  kTooLong,
  kBadMagic,
  kBadVersion,
  kBadReserved,
  kBadType,
  kBadBodySize,
  kUnknownSender,
  kWrongReceiver,
  kBadMac,
  kTruncatedBody,
  kTrailingBytes,
  kLimitExceeded,     // a count or size over a limit of messages.h
  kBadFlags,
  kBadResultDigest,   // Reply whose result does not hash to result_digest
  kHeaderMismatch,    // header view/seq/digest disagree with the body
  kBadAuthenticator,  // Request authenticator not exactly n entries
  kBadSignature,      // signature checks are done by the core, but wire helpers may report it
  kBadField,          // any other field out of its domain (e.g. sender a client where a replica is required)
  kBadPredecessor,    // Request whose prev_request_id is not below its request_id
};
std::string_view to_string(Reject r);

// Encodes `m` from `sender` to `receiver` and appends the MAC. Precondition: crypto.self() == sender and
// crypto knows the receiver. The frame length is at most kFrameBytesMax (asserted: the core never builds a
// message past the limits).
Bytes encode_frame(const Message& m, NodeId sender, NodeId receiver, const Crypto& crypto);

// Encodes the body once for many receivers: returns header+body with receiver 0 and no MAC. `seal_for`
// then patches the receiver and appends the MAC for one receiver, without re-encoding the body.
Bytes encode_unsealed(const Message& m, NodeId sender);
Bytes seal_for(const Bytes& unsealed, NodeId receiver, const Crypto& crypto);

struct Decoded {
  Reject reject = Reject::kNone;
  NodeId sender = 0;  // the header's sender once the header parsed; authenticated only when ok()
  Message message;
  bool ok() const { return reject == Reject::kNone; }
};

// Decodes and authenticates one whole frame addressed to crypto.self(). `replicas` is n: a Request's
// authenticator must have exactly n entries, and messages that only replicas send (everything but Request)
// are rejected with kBadField when the sender is not a replica (sender >= n). A Request may come from a client
// or from a replica relaying it (TOCS §2.4); its authenticator names the client.
Decoded decode_frame(std::span<const std::uint8_t> frame, std::uint32_t replicas, const Crypto& crypto);

// For stream transports: given at least kHeaderBytes of a stream, the total frame length, or 0 with `reject`
// set if the header is malformed (bad magic, version, or a length over kFrameBytesMax). Lets a TCP reader
// size its buffer before reading the body, and drop a connection that sends garbage.
std::size_t frame_length(std::span<const std::uint8_t> header, Reject& reject);

// Body-only codec, for fuzzing and round-trip tests: encode the body of m, and decode a body of type t
// (no header, no MAC). decode_body applies every body check of decode_frame. On a reject `out` is unspecified.
Bytes encode_body(const Message& m);
Reject decode_body(MsgType t, std::span<const std::uint8_t> body, std::uint32_t replicas, Message& out);

// What a successful decode guarantees beyond the limits of messages.h (the core may rely on it; everything
// else, such as watermarks, views of P/Q claims, or duplicate view changes in a NewView, is the core's check):
//   - Request: flags only known bits; client >= n; replier < n or kReplierAll; exactly n authenticator MACs.
//     The frame sender is NOT required to equal Request::client: the authenticator authenticates the client.
//   - Reply: flags only known bits; client >= n; with kReplyHasResult digest_of(result) == result_digest,
//     without it result is empty.
//   - ViewChange: replica < n, and replica == the frame sender when it arrives in its own frame.
//   - NewView: at most kReplicasMax view changes, each passing the ViewChange checks and naming view.
//   - StateNode: 1..kStateChildrenMax children.
//   - every message but Request comes from a replica (sender < n); a Request from anyone known;
//     header view/seq/digest equal the body's (digests recomputed), and no trailing bytes.

// Verifies the Ed25519 signatures a message carries (decode_frame does not: they cost ~50 us each, and the core
// decides when they are worth checking): a ViewChange's by its `replica`; a NewView's by the primary of its
// view (view mod `replicas`) and each of its view changes by its `replica`. kBadSignature if any fails, else
// kNone (also for every type that carries no signature).
Reject check_signatures(const Message& m, std::uint32_t replicas, const Crypto& crypto);

// ---- the batch codec, shared with the write-ahead log (protocol/records.cc) ----
class ByteWriter;
class ByteReader;
std::size_t batch_encoded_size(const Batch& b);
void write_batch(ByteWriter& w, const Batch& b);
// Reads a batch with the body checks of decode_body (Request checks above). `replicas` is n; 0 means unknown
// (the write-ahead log): then an authenticator may have any size from 1 to kReplicasMax, client ids are not
// checked and a replier must be < kReplicasMax or kReplierAll. On a reject the reader has failed and `out` is
// unspecified.
Reject read_batch(ByteReader& r, std::uint32_t replicas, Batch& out);

}  // namespace bftfs
