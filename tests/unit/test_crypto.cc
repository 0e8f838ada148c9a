// Digests, key generation, pairwise MACs and signatures (common/crypto.h).
#include <catch2/catch.hpp>

#include <string_view>

#include "common/crypto.h"
#include "common/log.h"

using namespace bftfs;

namespace {

std::span<const std::uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

struct Cluster {
  std::map<NodeId, PublicKeys> pub;
  std::map<NodeId, SecretKeys> sec;
  explicit Cluster(std::uint64_t seed, NodeId nodes = 5) {
    for (NodeId id = 0; id < nodes; ++id) generate_keys_from_seed(seed, id, pub[id], sec[id]);
  }
  Crypto crypto(NodeId id) const { return Crypto(id, sec.at(id), pub); }
};

}  // namespace

TEST_CASE("digest_of is BLAKE2b-256 and matches DigestBuilder over the same bytes", "[crypto]") {
  // BLAKE2b with a 32-byte output over "abc" (the same value as Python's hashlib.blake2b(b"abc", digest_size=32)).
  const Digest d = digest_of(as_bytes("abc"));
  CHECK(d.hex() == "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
  CHECK(d.short_hex() == "bddd813c");

  DigestBuilder b;
  b.add(as_bytes("a")).add(as_bytes("bc"));
  CHECK(b.finish() == d);
}

TEST_CASE("DigestBuilder encodes integers little-endian", "[crypto]") {
  DigestBuilder b;
  b.add_u32(0x04030201u).add_u64(0x0c0b0a0908070605ull);
  const std::uint8_t raw[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  CHECK(b.finish() == digest_of(raw));

  Digest inner = digest_of(as_bytes("x"));
  DigestBuilder c;
  c.add_digest(inner);
  CHECK(c.finish() == digest_of(inner.bytes));
}

TEST_CASE("keys from the same seed and node are equal, and differ across seeds and nodes", "[crypto]") {
  PublicKeys a, b, c, d;
  SecretKeys sa, sb, sc, sd;
  generate_keys_from_seed(7, 1, a, sa);
  generate_keys_from_seed(7, 1, b, sb);
  generate_keys_from_seed(8, 1, c, sc);
  generate_keys_from_seed(7, 2, d, sd);
  CHECK(a == b);
  CHECK(sa.kx == sb.kx);
  CHECK(sa.sign == sb.sign);
  CHECK_FALSE(a == c);
  CHECK_FALSE(a == d);
  CHECK(a.kx != a.sign);  // the two key pairs are derived independently

  PublicKeys r1, r2;
  SecretKeys s1, s2;
  generate_keys(r1, s1);
  generate_keys(r2, s2);
  CHECK_FALSE(r1 == r2);
}

TEST_CASE("a MAC made by a verifies at b and one made by b verifies at a", "[crypto]") {
  Cluster cl(42);
  Crypto a = cl.crypto(1);
  Crypto b = cl.crypto(3);
  const auto msg = as_bytes("pre-prepare v1 s7");
  CHECK(a.knows(3));
  CHECK(b.knows(1));
  CHECK_FALSE(a.knows(1));  // no session key with oneself
  CHECK_FALSE(a.knows(99));

  const Mac ab = a.mac(3, msg);
  CHECK(b.verify_mac(1, msg, ab));
  const Mac ba = b.mac(1, msg);
  CHECK(a.verify_mac(3, msg, ba));
  // One shared key per pair: both directions give the same tag for the same bytes.
  CHECK(ab == ba);
}

TEST_CASE("a MAC fails for another pair, a flipped bit, or an unknown peer", "[crypto]") {
  Cluster cl(42);
  Crypto a = cl.crypto(0);
  Crypto b = cl.crypto(1);
  Crypto c = cl.crypto(2);
  Bytes msg(64, 0x5a);
  const Mac m = a.mac(1, msg);

  CHECK(b.verify_mac(0, msg, m));
  CHECK_FALSE(c.verify_mac(0, msg, m));  // c shares another key with a
  CHECK_FALSE(b.verify_mac(2, msg, m));  // claimed to come from c
  CHECK_FALSE(b.verify_mac(77, msg, m));

  Bytes flipped = msg;
  flipped[17] ^= 0x04;
  CHECK_FALSE(b.verify_mac(0, flipped, m));
  Mac bad = m;
  bad.bytes[15] ^= 0x80;
  CHECK_FALSE(b.verify_mac(0, msg, bad));
  Bytes shorter(msg.begin(), msg.end() - 1);
  CHECK_FALSE(b.verify_mac(0, shorter, m));
}

TEST_CASE("session keys differ between clusters made from different seeds", "[crypto]") {
  Cluster one(1);
  Cluster two(2);
  Crypto a1 = one.crypto(0);
  Crypto a2 = two.crypto(0);
  const auto msg = as_bytes("x");
  CHECK_FALSE(a1.mac(1, msg) == a2.mac(1, msg));
}

TEST_CASE("a signature verifies for its signer only and over the exact bytes", "[crypto]") {
  Cluster cl(9);
  Crypto a = cl.crypto(2);
  Crypto b = cl.crypto(4);
  Bytes msg = {1, 2, 3, 4, 5};
  const Signature s = a.sign(msg);
  CHECK(b.verify_signature(2, msg, s));
  CHECK(a.verify_signature(2, msg, s));  // one's own signatures verify too
  CHECK_FALSE(b.verify_signature(3, msg, s));
  CHECK_FALSE(b.verify_signature(1000, msg, s));
  msg[0] ^= 1;
  CHECK_FALSE(b.verify_signature(2, msg, s));
  msg[0] ^= 1;
  Signature bad = s;
  bad.bytes[40] ^= 0x10;
  CHECK_FALSE(b.verify_signature(2, msg, bad));
}

TEST_CASE("a low-order kx public key leaves that peer unknown instead of sharing a predictable key", "[crypto]") {
  Cluster cl(5);
  auto pub = cl.pub;
  pub[3].kx.fill(0);  // the identity point: X25519 with it yields all zeros, which libsodium refuses
  std::vector<std::string> lines;
  log_set_sink([&lines](LogLevel, std::string_view line) { lines.emplace_back(line); });
  Crypto a(0, cl.sec.at(0), pub);
  log_set_sink(nullptr);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("ERROR") == 0);
  CHECK(lines[0].find("node 3") != std::string::npos);
  CHECK(a.knows(1));
  CHECK_FALSE(a.knows(3));
  CHECK_FALSE(a.verify_mac(3, Bytes{1}, Mac{}));
}
