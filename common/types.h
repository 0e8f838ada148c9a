// Basic value types shared by every layer of bftfs.
//
// Nothing here does I/O; this header may be included by the pure protocol core.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bftfs {

using Bytes = std::vector<std::uint8_t>;

// A node of the cluster. Replicas are 0..n-1; clients are n..n+m-1, as written by `keygen` into the cluster
// configuration. The id of a message's sender is authenticated by the per-link MAC, never trusted from a body.
using NodeId = std::uint32_t;

// Used as a Send destination: every replica except the sender itself.
inline constexpr NodeId kAllReplicas = 0xFFFFFFFFu;

inline constexpr std::size_t kDigestBytes = 32;  // BLAKE2b-256
inline constexpr std::size_t kMacBytes = 16;     // keyed BLAKE2b-128 with the pairwise session key
inline constexpr std::size_t kSignatureBytes = 64;  // Ed25519

struct Digest {
  std::array<std::uint8_t, kDigestBytes> bytes{};

  friend bool operator==(const Digest&, const Digest&) = default;
  friend auto operator<=>(const Digest&, const Digest&) = default;
  bool is_zero() const {
    for (auto b : bytes) {
      if (b != 0) return false;
    }
    return true;
  }
  std::string hex() const;        // 64 lowercase hex characters
  std::string short_hex() const;  // first 8 hex characters, for logs
};

struct Mac {
  std::array<std::uint8_t, kMacBytes> bytes{};
  friend bool operator==(const Mac&, const Mac&) = default;
};

struct Signature {
  std::array<std::uint8_t, kSignatureBytes> bytes{};
  friend bool operator==(const Signature&, const Signature&) = default;
};

}  // namespace bftfs
