// Pieces every length-prefixed socket protocol here shares (the relay's, relay/relay_wire.h; the control
// protocol of bftfs run, spec/control_wire.h): splitting a byte stream into frames, and checking UTF-8 text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/types.h"

namespace bftfs {

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_utf8(std::span<const std::uint8_t> s);
bool is_utf8(std::string_view s);

// Splits a byte stream of frames, each `u32 length (little-endian) || body` with 1 <= length <= body_max, into
// bodies, for a reader that gets the stream in arbitrary pieces. It buffers at most one frame's bytes plus
// whatever was appended after it. Once a length prefix is out of range the stream is broken for good (the
// peer is not speaking the protocol, and nothing after a bad length can be framed): the connection must close.
class LengthFrameSplitter {
 public:
  static constexpr std::size_t kLengthBytes = 4;

  explicit LengthFrameSplitter(std::uint32_t body_max) : body_max_(body_max) {}

  void append(std::span<const std::uint8_t> bytes);

  enum class Next : std::uint8_t { kNeedMore, kFrame, kEmpty, kTooLarge };
  // kFrame: `body` holds the next body. kEmpty / kTooLarge: the length prefix that broke the stream (returned
  // again on every later call).
  Next next(Bytes& body);
  std::size_t buffered_bytes() const { return buf_.size() - pos_; }

 private:
  std::uint32_t body_max_;
  Bytes buf_;
  std::size_t pos_ = 0;  // bytes of buf_ already consumed (compacted lazily)
  Next broken_ = Next::kNeedMore;  // kEmpty or kTooLarge once broken
};

}  // namespace bftfs
