// Formatting of the basic value types (types.h).
#include "common/types.h"

namespace bftfs {

namespace {
constexpr char kHexDigits[] = "0123456789abcdef";

std::string hex_prefix(const Digest& d, std::size_t bytes) {
  std::string s;
  s.resize(bytes * 2);
  for (std::size_t i = 0; i < bytes; ++i) {
    s[2 * i] = kHexDigits[d.bytes[i] >> 4];
    s[2 * i + 1] = kHexDigits[d.bytes[i] & 0x0F];
  }
  return s;
}
}  // namespace

std::string Digest::hex() const { return hex_prefix(*this, kDigestBytes); }

std::string Digest::short_hex() const { return hex_prefix(*this, 4); }

}  // namespace bftfs
