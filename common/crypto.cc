// Digests, key generation, MACs and signatures on libsodium (see crypto.h for the key model).
#include "common/crypto.h"

#include <sodium.h>

#include <cstring>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs {

namespace {

static_assert(sizeof(crypto_generichash_state) <= 384, "DigestBuilder::state_ is too small for libsodium's state");
static_assert(alignof(crypto_generichash_state) <= 64, "DigestBuilder::state_ is under-aligned for libsodium");
static_assert(crypto_kx_PUBLICKEYBYTES == 32 && crypto_kx_SECRETKEYBYTES == 32);
static_assert(crypto_kx_SESSIONKEYBYTES == 32 && crypto_kx_SEEDBYTES == 32);
static_assert(crypto_sign_PUBLICKEYBYTES == 32 && crypto_sign_SECRETKEYBYTES == 64);
static_assert(crypto_sign_BYTES == kSignatureBytes && crypto_sign_SEEDBYTES == 32);
static_assert(crypto_generichash_BYTES_MIN <= kMacBytes && kMacBytes <= crypto_generichash_BYTES_MAX);
static_assert(kDigestBytes <= crypto_generichash_BYTES_MAX);

// sodium_init must run before the first use of the RNG; a function-local static makes that happen once, and
// thread-safely, without a global constructor order dependency. It fails only if the OS has no entropy source,
// in which case no key can be made safely: that is fatal.
void ensure_sodium() {
  static const bool ready = [] { return sodium_init() >= 0; }();
  BFT_ASSERT(ready);
}

crypto_generichash_state* state_of(std::uint8_t* storage) {
  return reinterpret_cast<crypto_generichash_state*>(storage);
}

// Seed for one key pair of one node: BLAKE2b-256(tag || seed || node), so every (seed, node, purpose) gives an
// independent key.
std::array<std::uint8_t, 32> derive_seed(std::string_view tag, std::uint64_t seed, NodeId node) {
  DigestBuilder b;
  b.add({reinterpret_cast<const std::uint8_t*>(tag.data()), tag.size()}).add_u64(seed).add_u32(node);
  return b.finish().bytes;
}

}  // namespace

Digest digest_of(std::span<const std::uint8_t> data) {
  ensure_sodium();
  Digest d;
  crypto_generichash(d.bytes.data(), d.bytes.size(), data.data(), data.size(), nullptr, 0);
  return d;
}

DigestBuilder::DigestBuilder() {
  ensure_sodium();
  crypto_generichash_init(state_of(state_), nullptr, 0, kDigestBytes);
}

DigestBuilder& DigestBuilder::add(std::span<const std::uint8_t> data) {
  crypto_generichash_update(state_of(state_), data.data(), data.size());
  return *this;
}

DigestBuilder& DigestBuilder::add_u64(std::uint64_t v) {
  std::uint8_t buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = static_cast<std::uint8_t>(v >> (8 * i));
  return add(buf);
}

DigestBuilder& DigestBuilder::add_u32(std::uint32_t v) {
  std::uint8_t buf[4];
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<std::uint8_t>(v >> (8 * i));
  return add(buf);
}

DigestBuilder& DigestBuilder::add_digest(const Digest& d) { return add(d.bytes); }

Digest DigestBuilder::finish() {
  Digest d;
  crypto_generichash_final(state_of(state_), d.bytes.data(), d.bytes.size());
  return d;
}

void generate_keys(PublicKeys& pub, SecretKeys& sec) {
  ensure_sodium();
  crypto_kx_keypair(pub.kx.data(), sec.kx.data());
  crypto_sign_keypair(pub.sign.data(), sec.sign.data());
}

void generate_keys_from_seed(std::uint64_t seed, NodeId node, PublicKeys& pub, SecretKeys& sec) {
  ensure_sodium();
  auto kx_seed = derive_seed("bftfs-kx-seed", seed, node);
  auto sign_seed = derive_seed("bftfs-sign-seed", seed, node);
  crypto_kx_seed_keypair(pub.kx.data(), sec.kx.data(), kx_seed.data());
  crypto_sign_seed_keypair(pub.sign.data(), sec.sign.data(), sign_seed.data());
  sodium_memzero(kx_seed.data(), kx_seed.size());
  sodium_memzero(sign_seed.data(), sign_seed.size());
}

Crypto::Crypto(NodeId self, const SecretKeys& secret, const std::map<NodeId, PublicKeys>& public_keys)
    : self_(self), secret_(secret), public_keys_(public_keys) {
  ensure_sodium();
  auto own = public_keys_.find(self_);
  BFT_ASSERT(own != public_keys_.end());
  const std::uint8_t* own_kx = own->second.kx.data();
  session_keys_.reserve(public_keys_.size());
  for (const auto& [peer, keys] : public_keys_) {
    if (peer == self_) continue;
    std::uint8_t rx[crypto_kx_SESSIONKEYBYTES];
    std::uint8_t tx[crypto_kx_SESSIONKEYBYTES];
    // The lower id is the crypto_kx client. The client's rx is the server's tx, so hashing (client rx ||
    // client tx) on one side and (server tx || server rx) on the other gives both the same input.
    std::uint8_t material[2 * crypto_kx_SESSIONKEYBYTES];
    int rc = 0;
    if (self_ < peer) {
      rc = crypto_kx_client_session_keys(rx, tx, own_kx, secret_.kx.data(), keys.kx.data());
      std::memcpy(material, rx, sizeof rx);
      std::memcpy(material + sizeof rx, tx, sizeof tx);
    } else {
      rc = crypto_kx_server_session_keys(rx, tx, own_kx, secret_.kx.data(), keys.kx.data());
      std::memcpy(material, tx, sizeof tx);
      std::memcpy(material + sizeof tx, rx, sizeof rx);
    }
    if (rc != 0) {
      // A low-order public key in the configuration: this peer can never be authenticated. It stays unknown
      // (knows() is false, its frames are rejected) rather than sharing a predictable key.
      LOG_ERROR("", "crypto: invalid kx public key for node %u; frames from it will be rejected", peer);
    } else {
      std::array<std::uint8_t, 32> key{};
      crypto_generichash(key.data(), key.size(), material, sizeof material, nullptr, 0);
      session_keys_.emplace(peer, key);
      sodium_memzero(key.data(), key.size());
    }
    sodium_memzero(rx, sizeof rx);
    sodium_memzero(tx, sizeof tx);
    sodium_memzero(material, sizeof material);
  }
}

Crypto::~Crypto() {
  sodium_memzero(secret_.kx.data(), secret_.kx.size());
  sodium_memzero(secret_.sign.data(), secret_.sign.size());
  for (auto& [peer, key] : session_keys_) sodium_memzero(key.data(), key.size());
}

bool Crypto::knows(NodeId peer) const { return session_keys_.find(peer) != session_keys_.end(); }

Mac Crypto::mac(NodeId peer, std::span<const std::uint8_t> data) const {
  BFT_ASSERT(peer != self_);
  auto it = session_keys_.find(peer);
  BFT_ASSERT(it != session_keys_.end());
  Mac m;
  crypto_generichash(m.bytes.data(), m.bytes.size(), data.data(), data.size(), it->second.data(),
                     it->second.size());
  return m;
}

bool Crypto::verify_mac(NodeId peer, std::span<const std::uint8_t> data, const Mac& mac) const {
  auto it = session_keys_.find(peer);
  if (it == session_keys_.end()) return false;
  Mac expected;
  crypto_generichash(expected.bytes.data(), expected.bytes.size(), data.data(), data.size(), it->second.data(),
                     it->second.size());
  return sodium_memcmp(expected.bytes.data(), mac.bytes.data(), kMacBytes) == 0;
}

Signature Crypto::sign(std::span<const std::uint8_t> data) const {
  Signature s;
  crypto_sign_detached(s.bytes.data(), nullptr, data.data(), data.size(), secret_.sign.data());
  return s;
}

bool Crypto::verify_signature(NodeId signer, std::span<const std::uint8_t> data, const Signature& sig) const {
  auto it = public_keys_.find(signer);
  if (it == public_keys_.end()) return false;
  return crypto_sign_verify_detached(sig.bytes.data(), data.data(), data.size(), it->second.sign.data()) == 0;
}

}  // namespace bftfs
