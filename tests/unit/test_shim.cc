// The PBFT-CS shim: the predicated-request envelope (shim/envelope.h).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/crypto.h"
#include "shim/envelope.h"

using namespace bftfs;
using namespace bftfs::shim;

namespace {

Digest digest_with(std::uint8_t b) {
  Digest d;
  d.bytes.fill(b);
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Envelope
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("envelope request round-trips with and without dependencies", "[shim]") {
  for (std::size_t deps : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{kDependenciesMax}}) {
    for (const Bytes& op : {Bytes{}, Bytes{1}, Bytes{2, 3, 4, 5, 6, 7, 8, 9, 10}}) {
      ShimRequest req;
      for (std::size_t i = 0; i < deps; ++i) {
        req.deps.push_back(Dependency{0x0102030405060708ull + i, digest_with(static_cast<std::uint8_t>(i))});
      }
      req.op = op;
      const Bytes bytes = encode_request(req);
      CHECK(bytes.size() == kRequestHeaderBytes + deps * kDependencyBytes + op.size());
      ShimRequest back;
      REQUIRE(decode_request(bytes, back) == DecodeError::kOk);
      CHECK(back == req);
      // The span form gives the same and views the op in place.
      std::vector<Dependency> dv;
      std::span<const std::uint8_t> view;
      REQUIRE(decode_request(bytes, dv, view) == DecodeError::kOk);
      CHECK(dv == req.deps);
      CHECK(Bytes(view.begin(), view.end()) == op);
      if (!op.empty()) CHECK(view.data() == bytes.data() + bytes.size() - op.size());
      // Both encoders agree.
      CHECK(encode_request(req.deps, req.op) == bytes);
    }
  }
}

TEST_CASE("envelope request wire form is little-endian with the documented layout", "[shim]") {
  const Bytes bytes = encode_request(std::vector<Dependency>{{0x1122334455667788ull, digest_with(0xAB)}}, Bytes{0xEE});
  REQUIRE(bytes.size() == 4 + 40 + 1);
  CHECK(bytes[0] == kEnvelopeVersion);
  CHECK(bytes[1] == 0);     // flags
  CHECK(bytes[2] == 1);     // dep_count, low byte first
  CHECK(bytes[3] == 0);
  CHECK(bytes[4] == 0x88);  // request id, low byte first
  CHECK(bytes[11] == 0x11);
  CHECK(bytes[12] == 0xAB);  // digest
  CHECK(bytes[43] == 0xAB);
  CHECK(bytes[44] == 0xEE);  // the inner op
}

TEST_CASE("envelope decode reports every error precisely", "[shim]") {
  const Bytes good = encode_request(std::vector<Dependency>{{7, digest_with(1)}, {9, digest_with(2)}}, Bytes{1, 2});
  ShimRequest out;
  REQUIRE(decode_request(good, out) == DecodeError::kOk);

  SECTION("shorter than the header") {
    for (std::size_t len = 0; len < kRequestHeaderBytes; ++len) {
      CHECK(decode_request(std::span(good).first(len), out) == DecodeError::kTooShort);
    }
  }
  SECTION("a version other than 1") {
    for (std::uint8_t v : {std::uint8_t{0}, std::uint8_t{2}, std::uint8_t{255}}) {
      Bytes bad = good;
      bad[0] = v;
      CHECK(decode_request(bad, out) == DecodeError::kBadVersion);
    }
  }
  SECTION("any flag bit set") {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes bad = good;
      bad[1] = static_cast<std::uint8_t>(1u << bit);
      CHECK(decode_request(bad, out) == DecodeError::kBadFlags);
    }
  }
  SECTION("more dependencies than kDependenciesMax, even with the bytes present") {
    Bytes bad = Bytes{kEnvelopeVersion, 0, 0, 0};
    const auto count = static_cast<std::uint16_t>(kDependenciesMax + 1);
    bad[2] = static_cast<std::uint8_t>(count & 0xFF);
    bad[3] = static_cast<std::uint8_t>(count >> 8);
    bad.resize(bad.size() + count * kDependencyBytes, 0);
    CHECK(decode_request(bad, out) == DecodeError::kTooManyDependencies);
    bad[2] = 0xFF;
    bad[3] = 0xFF;
    CHECK(decode_request(bad, out) == DecodeError::kTooManyDependencies);
  }
  SECTION("a dependency list that runs past the end") {
    // Every cut inside the two dependencies; cuts in the op are valid requests with a shorter op.
    for (std::size_t len = kRequestHeaderBytes; len < kRequestHeaderBytes + 2 * kDependencyBytes; ++len) {
      CHECK(decode_request(std::span(good).first(len), out) == DecodeError::kTruncatedDependencies);
    }
    CHECK(decode_request(std::span(good).first(kRequestHeaderBytes + 2 * kDependencyBytes), out) == DecodeError::kOk);
    CHECK(out.op.empty());
  }
  SECTION("the checks run in header order: version before flags before count") {
    Bytes bad = good;
    bad[0] = 9;
    bad[1] = 1;
    bad[2] = 0xFF;
    CHECK(decode_request(bad, out) == DecodeError::kBadVersion);
    bad[0] = kEnvelopeVersion;
    CHECK(decode_request(bad, out) == DecodeError::kBadFlags);
  }
}

TEST_CASE("envelope decode errors and statuses have names", "[shim]") {
  for (DecodeError e : {DecodeError::kOk, DecodeError::kTooShort, DecodeError::kBadVersion, DecodeError::kBadFlags,
                        DecodeError::kTooManyDependencies, DecodeError::kTruncatedDependencies}) {
    CHECK_FALSE(to_string(e).empty());
    CHECK(to_string(e) != to_string(static_cast<DecodeError>(200)));
  }
  for (std::uint8_t s = 0; s <= kShimStatusMax; ++s) {
    CHECK(to_string(static_cast<ShimStatus>(s)) != to_string(static_cast<ShimStatus>(kShimStatusMax + 1)));
  }
  CHECK(is_retry(ShimStatus::kRetryPredicateFailed));
  CHECK(is_retry(ShimStatus::kRetryDependencyUnknown));
  CHECK_FALSE(is_retry(ShimStatus::kExecuted));
  CHECK_FALSE(is_retry(ShimStatus::kMalformed));
}

TEST_CASE("envelope result round-trips and rejects what no shim returns", "[shim]") {
  ShimResult r;
  const Bytes executed = encode_result(ShimStatus::kExecuted, Bytes{4, 5, 6});
  CHECK(executed == Bytes{0, 4, 5, 6});
  REQUIRE(decode_result(executed, r));
  CHECK(r == ShimResult{ShimStatus::kExecuted, Bytes{4, 5, 6}});
  REQUIRE(decode_result(encode_result(ShimStatus::kExecuted, {}), r));
  CHECK(r == ShimResult{ShimStatus::kExecuted, {}});
  for (ShimStatus s : {ShimStatus::kRetryPredicateFailed, ShimStatus::kRetryDependencyUnknown, ShimStatus::kMalformed}) {
    const Bytes bytes = encode_result(s, {});
    CHECK(bytes.size() == kResultHeaderBytes);
    REQUIRE(decode_result(bytes, r));
    CHECK(r == ShimResult{s, {}});
    Bytes trailing = bytes;
    trailing.push_back(0);
    CHECK_FALSE(decode_result(trailing, r));
  }
  CHECK_FALSE(decode_result(Bytes{}, r));
  CHECK_FALSE(decode_result(Bytes{kShimStatusMax + 1}, r));
  CHECK_FALSE(decode_result(Bytes{0xFF, 1}, r));
}

TEST_CASE("envelope decode never fails other than by an error on arbitrary bytes", "[shim]") {
  // A small deterministic sweep (the fuzz target does the rest): prefixes of valid requests with every byte
  // position flipped, decoded without crashing, and an accepted one re-encodes to the same bytes.
  const Bytes good = encode_request(std::vector<Dependency>{{1, digest_with(3)}, {2, digest_with(4)}}, Bytes{9, 8, 7});
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (std::uint8_t flip : {std::uint8_t{0x01}, std::uint8_t{0x80}, std::uint8_t{0xFF}}) {
      Bytes mutated = good;
      mutated[i] ^= flip;
      ShimRequest out;
      if (decode_request(mutated, out) == DecodeError::kOk) CHECK(encode_request(out) == mutated);
    }
  }
}
