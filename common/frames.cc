#include "common/frames.h"

#include "common/codec.h"

namespace bftfs {

bool is_utf8(std::span<const std::uint8_t> s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::uint8_t b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    std::uint32_t min = 0;
    if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1Fu, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0Fu, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07u, min = 0x10000;
    } else {
      return false;  // a continuation byte where a character starts, or 0xF8..0xFF
    }
    if (len > s.size() - i) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3Fu);
    }
    if (cp < min) return false;                      // overlong
    if (cp > 0x10FFFF) return false;                 // beyond Unicode
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;  // a UTF-16 surrogate
    i += len;
  }
  return true;
}

bool is_utf8(std::string_view s) {
  return is_utf8(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

void LengthFrameSplitter::append(std::span<const std::uint8_t> bytes) {
  if (broken_ != Next::kNeedMore) return;  // nothing after a bad length can be framed
  // Compact before growing, so the buffer holds at most one partial frame plus the new bytes.
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > buf_.size() / 2) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

LengthFrameSplitter::Next LengthFrameSplitter::next(Bytes& body) {
  if (broken_ != Next::kNeedMore) return broken_;
  const std::size_t avail = buf_.size() - pos_;
  if (avail < kLengthBytes) return Next::kNeedMore;
  const std::uint32_t len = load_u32_le(buf_.data() + pos_);
  if (len == 0 || len > body_max_) {
    broken_ = len == 0 ? Next::kEmpty : Next::kTooLarge;
    buf_.clear();
    pos_ = 0;
    return broken_;
  }
  if (avail - kLengthBytes < len) return Next::kNeedMore;
  const auto* start = buf_.data() + pos_ + kLengthBytes;
  body.assign(start, start + len);
  pos_ += kLengthBytes + len;
  return Next::kFrame;
}

}  // namespace bftfs
