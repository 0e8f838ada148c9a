// Cryptography for bftfs, on libsodium.
//
// Key model (PBFT §3 of the BFT paper, with MACs instead of signatures on the normal path):
// - Every node (replica or client) has a long-term X25519 key pair (crypto_kx) for deriving pairwise session
//   keys, and an Ed25519 key pair for the rare messages that must convince a third party (view change).
// - The session key of nodes a and b is derived with crypto_kx from their long-term keys; both ends derive the
//   same 32-byte key (the node with the smaller id plays the crypto_kx "client" role, and the key is the
//   BLAKE2b hash of rx||tx so both directions share it). The frame header carries sender AND receiver, so a
//   frame cannot be reflected back to its sender.
// - MAC = keyed BLAKE2b with a 16-byte output (0.5 us for 64 bytes on this machine).
//
// This header is pure computation (deterministic, no I/O), so the protocol core and the simulator use it
// directly. Loading and writing key files lives in common/config.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/types.h"

namespace bftfs {

// BLAKE2b-256 of the concatenation of `parts`. Deterministic, used for every protocol digest.
Digest digest_of(std::span<const std::uint8_t> data);

// Incremental BLAKE2b-256 for digests over several fields without building a buffer.
class DigestBuilder {
 public:
  DigestBuilder();
  DigestBuilder& add(std::span<const std::uint8_t> data);
  DigestBuilder& add_u64(std::uint64_t v);  // little-endian
  DigestBuilder& add_u32(std::uint32_t v);  // little-endian
  DigestBuilder& add_digest(const Digest& d);
  Digest finish();

 private:
  alignas(64) std::uint8_t state_[384];  // crypto_generichash_state storage
};

struct PublicKeys {
  std::array<std::uint8_t, 32> kx{};    // X25519 (crypto_kx_PUBLICKEYBYTES)
  std::array<std::uint8_t, 32> sign{};  // Ed25519 (crypto_sign_PUBLICKEYBYTES)
  friend bool operator==(const PublicKeys&, const PublicKeys&) = default;
};

struct SecretKeys {
  std::array<std::uint8_t, 32> kx{};    // crypto_kx_SECRETKEYBYTES
  std::array<std::uint8_t, 64> sign{};  // crypto_sign_SECRETKEYBYTES
};

// Makes a fresh key pair from the OS RNG (keygen) or deterministically from a seed (simulator, tests).
void generate_keys(PublicKeys& pub, SecretKeys& sec);
void generate_keys_from_seed(std::uint64_t seed, NodeId node, PublicKeys& pub, SecretKeys& sec);

// The crypto context of one node: its secrets and the pairwise session keys with every other node.
// Not copyable (it holds secrets); created once per process or per simulated node.
class Crypto {
 public:
  // `public_keys` maps every node of the cluster to its public keys. Derives all session keys eagerly.
  Crypto(NodeId self, const SecretKeys& secret, const std::map<NodeId, PublicKeys>& public_keys);
  Crypto(const Crypto&) = delete;
  Crypto& operator=(const Crypto&) = delete;
  ~Crypto();  // wipes secrets (sodium_memzero)

  NodeId self() const { return self_; }
  bool knows(NodeId peer) const;

  // MAC with the session key shared with `peer`. Precondition: knows(peer) and peer != self.
  Mac mac(NodeId peer, std::span<const std::uint8_t> data) const;
  // Constant-time check; false for an unknown peer (never asserts: peer ids come from the network).
  bool verify_mac(NodeId peer, std::span<const std::uint8_t> data, const Mac& mac) const;

  Signature sign(std::span<const std::uint8_t> data) const;
  // False for an unknown signer or a bad signature.
  bool verify_signature(NodeId signer, std::span<const std::uint8_t> data, const Signature& sig) const;

 private:
  NodeId self_;
  SecretKeys secret_;
  std::map<NodeId, PublicKeys> public_keys_;
  // Looked up for every frame and authenticator entry: hashed, since a cluster may name thousands of clients
  // and a tree walk over them showed in the profile.
  std::unordered_map<NodeId, std::array<std::uint8_t, 32>> session_keys_;
};

}  // namespace bftfs
