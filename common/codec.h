// Little-endian byte encoding for everything bftfs writes to the network, to disk, or into a digest.
//
// ByteWriter appends to a caller-owned Bytes; callers reserve the exact size first when they know it (the wire
// codec does), so encoding a message costs one allocation. ByteReader is the only way untrusted bytes are read:
// every read is bounds-checked, a failed read sets a sticky error (every later read fails too and yields zeros),
// and nothing is ever read past the end. A reader never allocates more than it has bytes left to copy, so a
// length field cannot make it allocate memory the input does not back.
//
// Pure computation, header-only (the wire hot path inlines it); no protocol knowledge.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "common/assert.h"
#include "common/types.h"

namespace bftfs {

class ByteWriter {
 public:
  // Appends to `out` (which may already hold bytes, e.g. a frame header). `out` must outlive the writer.
  explicit ByteWriter(Bytes& out) : out_(out) {}

  void reserve(std::size_t additional) { out_.reserve(out_.size() + additional); }
  std::size_t size() const { return out_.size(); }

  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { put_le(v); }
  void u32(std::uint32_t v) { put_le(v); }
  void u64(std::uint64_t v) { put_le(v); }
  void boolean(bool v) { out_.push_back(v ? 1 : 0); }
  // Raw bytes, no length: the reader must know the length from elsewhere.
  void bytes(std::span<const std::uint8_t> data) { out_.insert(out_.end(), data.begin(), data.end()); }
  void bytes(std::string_view data) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(data.data());
    out_.insert(out_.end(), p, p + data.size());
  }
  // u32 length then the bytes. Precondition: the length fits in u32 (our own data never comes close).
  void blob(std::span<const std::uint8_t> data) {
    BFT_ASSERT(data.size() <= 0xFFFFFFFFu);
    u32(static_cast<std::uint32_t>(data.size()));
    bytes(data);
  }
  void digest(const Digest& d) { bytes(d.bytes); }
  void mac(const Mac& m) { bytes(m.bytes); }
  void signature(const Signature& s) { bytes(s.bytes); }

  // Overwrites 4 bytes at `offset` (already written) with `v`: patching a length or an id after the fact.
  void patch_u32(std::size_t offset, std::uint32_t v) {
    BFT_ASSERT(offset + 4 <= out_.size());
    for (int i = 0; i < 4; ++i) out_[offset + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
  }

 private:
  template <typename T>
  void put_le(T v) {
    std::uint8_t buf[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) buf[i] = static_cast<std::uint8_t>(v >> (8 * i));
    out_.insert(out_.end(), buf, buf + sizeof(T));
  }

  Bytes& out_;
};

// Sizes of the encoded forms, for exact reservations.
inline constexpr std::size_t kBlobLengthBytes = 4;

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> data) : data_(data) {}

  // False once any read has failed; the reader then stays failed.
  bool ok() const { return ok_; }
  // Bytes not yet consumed (0 after a failure).
  std::size_t remaining() const { return ok_ ? data_.size() - pos_ : 0; }
  std::size_t position() const { return pos_; }
  // Everything was read and nothing failed.
  bool done() const { return ok_ && pos_ == data_.size(); }

  // Each read returns false (and stores zero/empty in `v`) when fewer bytes remain than it needs or an earlier
  // read failed.
  bool u8(std::uint8_t& v) { return get_le(v); }
  bool u16(std::uint16_t& v) { return get_le(v); }
  bool u32(std::uint32_t& v) { return get_le(v); }
  bool u64(std::uint64_t& v) { return get_le(v); }
  // A boolean is one byte that must be 0 or 1; any other value fails the reader.
  bool boolean(bool& v) {
    std::uint8_t b = 0;
    v = false;
    if (!u8(b)) return false;
    if (b > 1) return fail();
    v = b == 1;
    return true;
  }

  // Copies exactly `n` bytes into `out` (replacing its contents). Checks `n` against what remains before
  // allocating.
  bool bytes(std::size_t n, Bytes& out) {
    out.clear();
    if (!take(n)) return false;
    out.assign(data_.data() + pos_ - n, data_.data() + pos_);
    return true;
  }
  // A view of the next `n` bytes without copying; valid as long as the input is.
  bool view(std::size_t n, std::span<const std::uint8_t>& out) {
    out = {};
    if (!take(n)) return false;
    out = data_.subspan(pos_ - n, n);
    return true;
  }
  bool skip(std::size_t n) { return take(n); }

  // u32 length then bytes; the length must be <= max_bytes (else the reader fails without allocating).
  bool blob(Bytes& out, std::uint32_t max_bytes) {
    out.clear();
    std::uint32_t n = 0;
    if (!u32(n)) return false;
    if (n > max_bytes) return fail();
    return bytes(n, out);
  }

  bool digest(Digest& d) { return fixed(d.bytes); }
  bool mac(Mac& m) { return fixed(m.bytes); }
  bool signature(Signature& s) { return fixed(s.bytes); }

  // Marks the reader failed (used by callers that find a field out of its domain). Always returns false.
  bool fail() {
    ok_ = false;
    return false;
  }

 private:
  // Consumes n bytes if they are there.
  bool take(std::size_t n) {
    if (!ok_) return false;
    if (n > data_.size() - pos_) return fail();
    pos_ += n;
    return true;
  }
  template <std::size_t N>
  bool fixed(std::array<std::uint8_t, N>& a) {
    if (!take(N)) {
      a.fill(0);
      return false;
    }
    std::memcpy(a.data(), data_.data() + pos_ - N, N);
    return true;
  }
  template <typename T>
  bool get_le(T& v) {
    v = 0;
    if (!take(sizeof(T))) return false;
    const std::uint8_t* p = data_.data() + pos_ - sizeof(T);
    T r = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) r = static_cast<T>(r | (static_cast<T>(p[i]) << (8 * i)));
    v = r;
    return true;
  }

  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// Little-endian loads and stores at a fixed offset, for fixed-layout headers. Preconditions: in bounds.
inline std::uint32_t load_u32_le(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
inline std::uint64_t load_u64_le(const std::uint8_t* p) {
  return static_cast<std::uint64_t>(load_u32_le(p)) | (static_cast<std::uint64_t>(load_u32_le(p + 4)) << 32);
}
inline std::uint16_t load_u16_le(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline void store_u32_le(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void store_u64_le(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

}  // namespace bftfs
