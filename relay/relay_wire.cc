#include "relay/relay_wire.h"

#include <type_traits>

#include "common/assert.h"
#include "common/codec.h"

namespace bftfs::relay {

std::string_view to_string(RelayWireError e) {
  switch (e) {
    case RelayWireError::kOk: return "ok";
    case RelayWireError::kFrameEmpty: return "frame-empty";
    case RelayWireError::kFrameTooLarge: return "frame-too-large";
    case RelayWireError::kUnknownType: return "unknown-type";
    case RelayWireError::kTruncated: return "truncated";
    case RelayWireError::kTrailingBytes: return "trailing-bytes";
    case RelayWireError::kBadVersion: return "bad-version";
    case RelayWireError::kBadFlags: return "bad-flags";
    case RelayWireError::kTooManyDeps: return "too-many-deps";
    case RelayWireError::kRequestTooLarge: return "request-too-large";
    case RelayWireError::kEmptyRequest: return "empty-request";
    case RelayWireError::kResultTooLarge: return "result-too-large";
    case RelayWireError::kBadStatus: return "bad-status";
    case RelayWireError::kBadUtf8: return "bad-utf8";
    case RelayWireError::kStatusTooLarge: return "status-too-large";
    case RelayWireError::kBadReplicaCount: return "bad-replica-count";
  }
  return "unknown";
}

FrameType frame_type(const MountMsg& m) {
  return std::visit(
      [](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Hello>) return FrameType::kHello;
        if constexpr (std::is_same_v<T, Submit>) return FrameType::kSubmit;
        if constexpr (std::is_same_v<T, Cancel>) return FrameType::kCancel;
        if constexpr (std::is_same_v<T, StatusQuery>) return FrameType::kStatus;
      },
      m);
}

FrameType frame_type(const RelayMsg& m) {
  return std::visit(
      [](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, HelloOk>) return FrameType::kHelloOk;
        if constexpr (std::is_same_v<T, First>) return FrameType::kFirst;
        if constexpr (std::is_same_v<T, Final>) return FrameType::kFinal;
        if constexpr (std::is_same_v<T, StatusReply>) return FrameType::kStatusReply;
      },
      m);
}

RelayWireError check_frame_length(std::uint32_t body_len) {
  if (body_len == 0) return RelayWireError::kFrameEmpty;
  if (body_len > kFrameBodyBytesMax) return RelayWireError::kFrameTooLarge;
  return RelayWireError::kOk;
}

namespace {

// Starts a frame: a length placeholder (patched by finish_frame) and the type byte.
ByteWriter start_frame(Bytes& out, FrameType type, std::size_t body_hint) {
  out.reserve(kFrameLengthBytes + 1 + body_hint);
  ByteWriter w(out);
  w.u32(0);
  w.u8(static_cast<std::uint8_t>(type));
  return w;
}

void finish_frame(Bytes& out) {
  const std::size_t body = out.size() - kFrameLengthBytes;
  BFT_ASSERT(body >= 1);
  BFT_ASSERT(body <= kFrameBodyBytesMax);
  store_u32_le(out.data(), static_cast<std::uint32_t>(body));
}

// The reader's failure as a reason: a failed read means the body ended inside a field.
RelayWireError finish_read(const ByteReader& r) {
  if (!r.ok()) return RelayWireError::kTruncated;
  if (!r.done()) return RelayWireError::kTrailingBytes;
  return RelayWireError::kOk;
}

}  // namespace

Bytes encode_relay_frame(const MountMsg& m) {
  Bytes out;
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Hello>) {
          ByteWriter w = start_frame(out, FrameType::kHello, 2);
          w.u16(v.version);
        } else if constexpr (std::is_same_v<T, Submit>) {
          BFT_ASSERT((v.flags & ~kFlagsKnown) == 0);
          BFT_ASSERT(v.deps.size() <= kDepsMax);
          BFT_ASSERT(!v.request.empty());
          BFT_ASSERT(v.request.size() <= kSubmitRequestBytesMax);
          ByteWriter w = start_frame(out, FrameType::kSubmit, 8 + 1 + 2 + 8 * v.deps.size() + 4 + v.request.size());
          w.u64(v.tag);
          w.u8(v.flags);
          w.u16(static_cast<std::uint16_t>(v.deps.size()));
          for (std::uint64_t d : v.deps) w.u64(d);
          w.blob(v.request);
        } else if constexpr (std::is_same_v<T, Cancel>) {
          ByteWriter w = start_frame(out, FrameType::kCancel, 8);
          w.u64(v.tag);
        } else {
          static_assert(std::is_same_v<T, StatusQuery>);
          start_frame(out, FrameType::kStatus, 0);
        }
      },
      m);
  finish_frame(out);
  return out;
}

Bytes encode_relay_frame(const RelayMsg& m) {
  Bytes out;
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, HelloOk>) {
          BFT_ASSERT(v.n >= 1);
          BFT_ASSERT(v.n >= 3 * static_cast<std::uint64_t>(v.f) + 1);
          ByteWriter w = start_frame(out, FrameType::kHelloOk, 14);
          w.u16(v.version);
          w.u32(v.client_id);
          w.u32(v.n);
          w.u32(v.f);
        } else if constexpr (std::is_same_v<T, First>) {
          BFT_ASSERT(v.result.size() <= kResultBytesMax);
          ByteWriter w = start_frame(out, FrameType::kFirst, 16 + v.result.size());
          w.u64(v.tag);
          w.u32(v.replica);
          w.blob(v.result);
        } else if constexpr (std::is_same_v<T, Final>) {
          BFT_ASSERT(v.result.size() <= kResultBytesMax);
          BFT_ASSERT(v.status != FinalStatus::kRefused || is_utf8(v.result));
          ByteWriter w = start_frame(out, FrameType::kFinal, 13 + v.result.size());
          w.u64(v.tag);
          w.u8(static_cast<std::uint8_t>(v.status));
          w.blob(v.result);
        } else {
          static_assert(std::is_same_v<T, StatusReply>);
          BFT_ASSERT(v.text.size() <= kStatusTextBytesMax);
          ByteWriter w = start_frame(out, FrameType::kStatusReply, 4 + v.text.size());
          w.u32(static_cast<std::uint32_t>(v.text.size()));
          w.bytes(v.text);
        }
      },
      m);
  finish_frame(out);
  return out;
}

RelayWireError decode_mount_body(std::span<const std::uint8_t> body, MountMsg& out) {
  if (body.empty()) return RelayWireError::kFrameEmpty;
  if (body.size() > kFrameBodyBytesMax) return RelayWireError::kFrameTooLarge;
  ByteReader r(body.subspan(1));
  switch (body[0]) {
    case static_cast<std::uint8_t>(FrameType::kHello): {
      Hello h;
      if (!r.u16(h.version)) return RelayWireError::kTruncated;
      if (h.version != kRelayWireVersion) return RelayWireError::kBadVersion;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = h;
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kSubmit): {
      Submit s;
      std::uint16_t ndeps = 0;
      std::uint32_t len = 0;
      if (!r.u64(s.tag)) return RelayWireError::kTruncated;
      if (!r.u8(s.flags)) return RelayWireError::kTruncated;
      if ((s.flags & ~kFlagsKnown) != 0) return RelayWireError::kBadFlags;
      if (!r.u16(ndeps)) return RelayWireError::kTruncated;
      if (ndeps > kDepsMax) return RelayWireError::kTooManyDeps;
      s.deps.resize(ndeps);
      for (std::uint64_t& d : s.deps) {
        if (!r.u64(d)) return RelayWireError::kTruncated;
      }
      if (!r.u32(len)) return RelayWireError::kTruncated;
      if (len == 0) return RelayWireError::kEmptyRequest;
      if (len > kSubmitRequestBytesMax) return RelayWireError::kRequestTooLarge;
      if (!r.bytes(len, s.request)) return RelayWireError::kTruncated;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = std::move(s);
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kCancel): {
      Cancel c;
      if (!r.u64(c.tag)) return RelayWireError::kTruncated;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = c;
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kStatus): {
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = StatusQuery{};
      return RelayWireError::kOk;
    }
    default:
      return RelayWireError::kUnknownType;
  }
}

RelayWireError decode_relay_body(std::span<const std::uint8_t> body, RelayMsg& out) {
  if (body.empty()) return RelayWireError::kFrameEmpty;
  if (body.size() > kFrameBodyBytesMax) return RelayWireError::kFrameTooLarge;
  ByteReader r(body.subspan(1));
  switch (body[0]) {
    case static_cast<std::uint8_t>(FrameType::kHelloOk): {
      HelloOk h;
      if (!r.u16(h.version)) return RelayWireError::kTruncated;
      if (h.version != kRelayWireVersion) return RelayWireError::kBadVersion;
      if (!r.u32(h.client_id)) return RelayWireError::kTruncated;
      if (!r.u32(h.n)) return RelayWireError::kTruncated;
      if (!r.u32(h.f)) return RelayWireError::kTruncated;
      if (h.n == 0) return RelayWireError::kBadReplicaCount;
      if (h.n < 3 * static_cast<std::uint64_t>(h.f) + 1) return RelayWireError::kBadReplicaCount;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = h;
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kFirst): {
      First f;
      std::uint32_t len = 0;
      if (!r.u64(f.tag)) return RelayWireError::kTruncated;
      if (!r.u32(f.replica)) return RelayWireError::kTruncated;
      if (!r.u32(len)) return RelayWireError::kTruncated;
      if (len > kResultBytesMax) return RelayWireError::kResultTooLarge;
      if (!r.bytes(len, f.result)) return RelayWireError::kTruncated;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = std::move(f);
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kFinal): {
      Final f;
      std::uint8_t status = 0;
      std::uint32_t len = 0;
      if (!r.u64(f.tag)) return RelayWireError::kTruncated;
      if (!r.u8(status)) return RelayWireError::kTruncated;
      if (status > kFinalStatusMax) return RelayWireError::kBadStatus;
      f.status = static_cast<FinalStatus>(status);
      if (!r.u32(len)) return RelayWireError::kTruncated;
      if (len > kResultBytesMax) return RelayWireError::kResultTooLarge;
      if (!r.bytes(len, f.result)) return RelayWireError::kTruncated;
      if (f.status == FinalStatus::kRefused && !is_utf8(f.result)) return RelayWireError::kBadUtf8;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      out = std::move(f);
      return RelayWireError::kOk;
    }
    case static_cast<std::uint8_t>(FrameType::kStatusReply): {
      StatusReply s;
      std::uint32_t len = 0;
      std::span<const std::uint8_t> text;
      if (!r.u32(len)) return RelayWireError::kTruncated;
      if (len > kStatusTextBytesMax) return RelayWireError::kStatusTooLarge;
      if (!r.view(len, text)) return RelayWireError::kTruncated;
      if (!is_utf8(text)) return RelayWireError::kBadUtf8;
      if (const auto e = finish_read(r); e != RelayWireError::kOk) return e;
      s.text.assign(reinterpret_cast<const char*>(text.data()), text.size());
      out = std::move(s);
      return RelayWireError::kOk;
    }
    default:
      return RelayWireError::kUnknownType;
  }
}

void FrameSplitter::append(std::span<const std::uint8_t> bytes) { frames_.append(bytes); }

FrameSplitter::Next FrameSplitter::next(Bytes& body, RelayWireError& why) {
  switch (frames_.next(body)) {
    case LengthFrameSplitter::Next::kNeedMore: return Next::kNeedMore;
    case LengthFrameSplitter::Next::kFrame: why = RelayWireError::kOk; return Next::kFrame;
    case LengthFrameSplitter::Next::kEmpty: why = RelayWireError::kFrameEmpty; return Next::kBroken;
    case LengthFrameSplitter::Next::kTooLarge: why = RelayWireError::kFrameTooLarge; return Next::kBroken;
  }
  BFT_ASSERT(false);
  return Next::kBroken;
}

}  // namespace bftfs::relay
