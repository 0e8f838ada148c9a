// Write-ahead log record encoding (encode_record / decode_record of protocol/effects.h).
#include <catch2/catch.hpp>

#include "common/codec.h"
#include "fuzz/samples.h"
#include "protocol/effects.h"

using namespace bftfs;

TEST_CASE("every record type round-trips, empty and large", "[records]") {
  Prng prng(3);
  for (bool large : {false, true}) {
    for (const auto& r : samples::records(prng, 4, large)) {
      INFO("record index " << r.index() << " large " << large);
      const Bytes b = encode_record(r);
      CHECK(b[0] == r.index() + 1);  // the documented type tag
      PersistRecord out;
      REQUIRE(decode_record(b, out));
      CHECK(out == r);
    }
  }
}

TEST_CASE("a pre-prepare record keeps requests of any cluster size up to the wire limit", "[records]") {
  Prng prng(4);
  for (std::uint32_t n : {1u, 4u, 7u, kReplicasMax}) {
    PrePrepareRecord rec{9, 10, samples::batch(prng, n, 3, 5)};
    PersistRecord out;
    REQUIRE(decode_record(encode_record(rec), out));
    CHECK(std::get<PrePrepareRecord>(out) == rec);
  }
}

TEST_CASE("malformed records are rejected", "[records]") {
  Prng prng(5);
  const auto all = samples::records(prng, 4, true);
  PersistRecord out;
  CHECK_FALSE(decode_record(Bytes{}, out));
  CHECK_FALSE(decode_record(Bytes{0}, out));  // tag 0: a zeroed region is not a record
  CHECK_FALSE(decode_record(Bytes{7}, out));  // unknown tag

  for (const auto& r : all) {
    INFO("record index " << r.index());
    const Bytes good = encode_record(r);
    for (std::size_t cut = 0; cut < good.size(); cut += 1 + good.size() / 50) {
      CHECK_FALSE(decode_record(std::span(good).first(cut), out));
    }
    Bytes longer = good;
    longer.push_back(0);
    CHECK_FALSE(decode_record(longer, out));
  }

  Bytes view = encode_record(ViewRecord{3, true});
  view.back() = 2;  // a boolean must be 0 or 1
  CHECK_FALSE(decode_record(view, out));

  // A checkpoint record whose client table length is over kPartitionBytesMax, with the bytes present.
  CheckpointRecord big{1, Digest{}, Bytes(16, 1)};
  Bytes cb = encode_record(big);
  store_u32_le(cb.data() + 1 + 8 + kDigestBytes, kPartitionBytesMax + 1);
  CHECK_FALSE(decode_record(cb, out));

  // A pre-prepare record with a request whose authenticator is empty or over kReplicasMax.
  PrePrepareRecord pp{1, 2, samples::batch(prng, 4, 1, 0)};
  Bytes pb = encode_record(pp);
  const std::size_t auth_at = 1 + 8 + 8 + 8 + 4 + 29;  // tag view seq timestamp count, then the request
  REQUIRE(load_u32_le(pb.data() + auth_at) == 4);
  Bytes none = pb;
  store_u32_le(none.data() + auth_at, 0);
  none.resize(auth_at + 4);
  CHECK_FALSE(decode_record(none, out));
  store_u32_le(pb.data() + auth_at, kReplicasMax + 1);
  CHECK_FALSE(decode_record(pb, out));
}

TEST_CASE("random mutations of records never crash, and what decodes re-encodes to the same bytes", "[records]") {
  Prng gen(6);
  Prng prng(60);
  std::size_t accepted = 0;
  for (const auto& r : samples::records(gen, 4, true)) {
    const Bytes good = encode_record(r);
    for (int i = 0; i < 300; ++i) {
      Bytes b = good;
      const std::uint64_t flips = prng.range(1, 3);
      for (std::uint64_t k = 0; k < flips; ++k) b[prng.below(b.size())] ^= static_cast<std::uint8_t>(1u << prng.below(8));
      if (prng.chance(1, 4)) b.resize(prng.below(b.size() + 1));
      PersistRecord out;
      if (decode_record(b, out)) {
        ++accepted;
        CHECK(encode_record(out) == b);
      }
    }
  }
  CHECK(accepted > 0);
}
