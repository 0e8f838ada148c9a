// The relay socket protocol (docs/RELAY.md): the frames a mount (client/) and the relay daemon exchange over a
// Unix stream socket. Pure: no I/O, clocks or threads, so the relay, the FUSE client, the unit tests and the
// fuzz target (fuzz/fuzz_relay_wire.cc) share one codec.
//
// A frame is `u32 body_len || body` (little-endian); the body's first byte is its type. Both directions are
// decoded like network input: every field is checked, and a rejection names its reason (RelayWireError). The
// encodings are canonical: a decoded message encodes back to the same bytes (round-trip tests, fuzzing).
//
// Decoding checks the frame's shape only. What a field means for the receiver (a HELLO that is not first, a
// SUBMIT whose fs request does not decode, a tag already in flight) is the receiver's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/frames.h"
#include "common/types.h"

namespace bftfs::relay {

inline constexpr std::uint16_t kRelayWireVersion = 1;
inline constexpr std::size_t kFrameLengthBytes = 4;
// The largest body: a SUBMIT of the largest fs request plus its header, with room to spare.
inline constexpr std::uint32_t kFrameBodyBytesMax = 2u * 1024 * 1024 + 64;
// The largest fs request a SUBMIT may carry (an fs::encode_request; the fs codec has its own tighter checks).
inline constexpr std::uint32_t kSubmitRequestBytesMax = 1024u * 1024 + 64 * 1024;
// The largest payload of FIRST and FINAL (an fs::encode_result is <= fs::kFsResultBytesMax = 1 MiB; a refusal
// reason is much shorter).
inline constexpr std::uint32_t kResultBytesMax = 1024u * 1024;
// Dependencies of one SUBMIT (the speculation layer's; the fs compound request allows 64 ops, so 64 earlier
// requests is the most one request can sensibly rely on).
inline constexpr std::uint16_t kDepsMax = 64;
// The STATUS_REPLY text.
inline constexpr std::uint32_t kStatusTextBytesMax = 64u * 1024;

// SUBMIT flags.
inline constexpr std::uint8_t kFlagReadOnly = 1u << 0;     // every op is read-only; use the read-only optimization
inline constexpr std::uint8_t kFlagReportFirst = 1u << 1;  // send FIRST before FINAL
inline constexpr std::uint8_t kFlagsKnown = kFlagReadOnly | kFlagReportFirst;

enum class FrameType : std::uint8_t {
  // mount -> relay
  kHello = 1,
  kSubmit = 2,
  kCancel = 3,
  kStatus = 4,
  // relay -> mount
  kHelloOk = 129,
  kFirst = 130,
  kFinal = 131,
  kStatusReply = 132,
};

// FINAL's status.
enum class FinalStatus : std::uint8_t {
  kCommitted = 0,   // bytes: the consensus fs result (equal to FIRST's if one was sent)
  kRolledBack = 1,  // bytes: the consensus fs result, which differs from the FIRST sent; or empty: the request
                    // did not execute, because a dependency's prediction was wrong (see Submit::deps)
  kRefused = 2,     // bytes: a UTF-8 reason; the request was never sent to the replicas
};
inline constexpr std::uint8_t kFinalStatusMax = 2;

enum class RelayWireError : std::uint8_t {
  kOk = 0,
  kFrameEmpty,        // body_len 0
  kFrameTooLarge,     // body_len > kFrameBodyBytesMax
  kUnknownType,       // a type byte this direction does not define
  kTruncated,         // the body ends inside a field
  kTrailingBytes,     // bytes after the last field
  kBadVersion,        // HELLO/HELLO_OK version is not kRelayWireVersion
  kBadFlags,          // SUBMIT flag bits outside kFlagsKnown
  kTooManyDeps,       // SUBMIT ndeps > kDepsMax
  kRequestTooLarge,   // SUBMIT len > kSubmitRequestBytesMax
  kEmptyRequest,      // SUBMIT len 0 (no fs request is empty)
  kResultTooLarge,    // FIRST/FINAL len > kResultBytesMax
  kBadStatus,         // FINAL status > kFinalStatusMax
  kBadUtf8,           // FINAL refusal reason or STATUS_REPLY text is not UTF-8
  kStatusTooLarge,    // STATUS_REPLY len > kStatusTextBytesMax
  kBadReplicaCount,   // HELLO_OK n or f inconsistent (n == 0, or n < 3f + 1)
};
std::string_view to_string(RelayWireError e);

// ---- mount -> relay ----
struct Hello {
  std::uint16_t version = kRelayWireVersion;
  friend bool operator==(const Hello&, const Hello&) = default;
};
struct Submit {
  std::uint64_t tag = 0;  // unique among the connection's requests in flight; may be reused after their FINAL
  std::uint8_t flags = 0;
  // Dependencies: "execute only if these earlier requests returned what the mount was shown". Each tag names
  // the latest earlier SUBMIT of this connection with that tag, and the mount's prediction for it is the
  // FIRST it was sent (or, with no FIRST, the FINAL, the only result it can know). The relay honours each
  // one whatever the state of the request it names when the SUBMIT arrives:
  //   - in flight: the prediction goes to the replicas as a predicate (the request must be ordered and must
  //     have had its FIRST sent, or the SUBMIT is refused); if it fails, the shim makes this request a no-op
  //     and its FINAL is kRolledBack with empty bytes;
  //   - final with kCommitted (the prediction was the consensus): satisfied, and dropped;
  //   - final with kRolledBack (the prediction was wrong, or it did not execute): this request is not sent;
  //     its FINAL is kRolledBack with empty bytes at once, as the shim's no-op would have been;
  //   - final with kRefused, or a tag the relay does not know (never submitted on this connection, cancelled
  //     before its FINAL, or more FINALs back than the relay remembers): FINAL kRefused with a reason.
  // So a request that relies on a wrong prediction never executes, however its SUBMIT raced with the FINAL
  // of what it relies on. In NO-REP mode a dependency in flight needs no predicate (FIRST = FINAL).
  std::vector<std::uint64_t> deps;
  Bytes request;  // an fs::encode_request
  friend bool operator==(const Submit&, const Submit&) = default;
};
struct Cancel {
  std::uint64_t tag = 0;
  friend bool operator==(const Cancel&, const Cancel&) = default;
};
struct StatusQuery {
  friend bool operator==(const StatusQuery&, const StatusQuery&) = default;
};
using MountMsg = std::variant<Hello, Submit, Cancel, StatusQuery>;

// ---- relay -> mount ----
struct HelloOk {
  std::uint16_t version = kRelayWireVersion;
  std::uint32_t client_id = 0;
  std::uint32_t n = 0;
  std::uint32_t f = 0;
  friend bool operator==(const HelloOk&, const HelloOk&) = default;
};
struct First {
  std::uint64_t tag = 0;
  std::uint32_t replica = 0;
  Bytes result;  // an fs::encode_result
  friend bool operator==(const First&, const First&) = default;
};
struct Final {
  std::uint64_t tag = 0;
  FinalStatus status = FinalStatus::kCommitted;
  Bytes result;  // kCommitted/kRolledBack: an fs::encode_result; kRefused: a UTF-8 reason
  friend bool operator==(const Final&, const Final&) = default;
};
struct StatusReply {
  std::string text;  // one `key value` line per fact
  friend bool operator==(const StatusReply&, const StatusReply&) = default;
};
using RelayMsg = std::variant<HelloOk, First, Final, StatusReply>;

// The frame type of a message.
FrameType frame_type(const MountMsg& m);
FrameType frame_type(const RelayMsg& m);

// Whole frames (length prefix included). Precondition: the message is one the decoder accepts (asserted).
Bytes encode_relay_frame(const MountMsg& m);
Bytes encode_relay_frame(const RelayMsg& m);

// Checks a frame's length prefix (kOk, kFrameEmpty or kFrameTooLarge).
RelayWireError check_frame_length(std::uint32_t body_len);

// Decodes a frame body (without its length prefix). On an error `out` is unspecified.
RelayWireError decode_mount_body(std::span<const std::uint8_t> body, MountMsg& out);
RelayWireError decode_relay_body(std::span<const std::uint8_t> body, RelayMsg& out);

// Splits a byte stream into frame bodies, for a reader that gets the stream in arbitrary pieces (the FUSE
// client's blocking reads; the tests). It buffers at most one frame's bytes plus whatever was appended after
// it. Once a length prefix is bad the stream is broken for good: the connection must be closed.
class FrameSplitter {
 public:
  void append(std::span<const std::uint8_t> bytes);
  enum class Next : std::uint8_t { kNeedMore, kFrame, kBroken };
  // kFrame: `body` holds the next body. kBroken: `why` says which length check failed (and stays so).
  Next next(Bytes& body, RelayWireError& why);
  std::size_t buffered_bytes() const { return frames_.buffered_bytes(); }

 private:
  LengthFrameSplitter frames_{kFrameBodyBytesMax};
};

}  // namespace bftfs::relay
