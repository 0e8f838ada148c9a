// ByteWriter / ByteReader (common/codec.h).
#include <catch2/catch.hpp>

#include "common/codec.h"

using namespace bftfs;

TEST_CASE("the writer encodes integers little-endian and blobs with a u32 length", "[codec]") {
  Bytes out = {0xEE};  // the writer appends to what is there
  ByteWriter w(out);
  w.u8(0x01);
  w.u16(0x0302);
  w.u32(0x07060504u);
  w.u64(0x0f0e0d0c0b0a0908ull);
  w.boolean(true);
  w.blob(Bytes{0xAA, 0xBB});
  const Bytes expected = {0xEE, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d,
                          0x0e, 0x0f, 0x01, 0x02, 0x00, 0x00, 0x00, 0xAA, 0xBB};
  CHECK(out == expected);
  CHECK(w.size() == expected.size());

  w.patch_u32(1, 0xdeadbeefu);
  CHECK(out[1] == 0xef);
  CHECK(out[4] == 0xde);
}

TEST_CASE("the reader reads back what the writer wrote and ends exactly", "[codec]") {
  Bytes buf;
  ByteWriter w(buf);
  Digest d;
  d.bytes[0] = 9;
  d.bytes[31] = 7;
  Mac m;
  m.bytes[3] = 4;
  Signature s;
  s.bytes[63] = 1;
  w.u8(200);
  w.u16(65000);
  w.u32(4000000000u);
  w.u64(0xFFFFFFFFFFFFFFFEull);
  w.boolean(false);
  w.digest(d);
  w.mac(m);
  w.signature(s);
  w.blob(Bytes{1, 2, 3});
  w.bytes(std::string_view("xyz"));

  ByteReader r(buf);
  std::uint8_t a = 0;
  std::uint16_t b = 0;
  std::uint32_t c = 0;
  std::uint64_t e = 0;
  bool flag = true;
  Digest d2;
  Mac m2;
  Signature s2;
  Bytes blob;
  std::span<const std::uint8_t> tail;
  REQUIRE(r.u8(a));
  REQUIRE(r.u16(b));
  REQUIRE(r.u32(c));
  REQUIRE(r.u64(e));
  REQUIRE(r.boolean(flag));
  REQUIRE(r.digest(d2));
  REQUIRE(r.mac(m2));
  REQUIRE(r.signature(s2));
  REQUIRE(r.blob(blob, 3));
  CHECK(r.remaining() == 3);
  REQUIRE(r.view(3, tail));
  CHECK(r.done());
  CHECK(a == 200);
  CHECK(b == 65000);
  CHECK(c == 4000000000u);
  CHECK(e == 0xFFFFFFFFFFFFFFFEull);
  CHECK_FALSE(flag);
  CHECK(d2 == d);
  CHECK(m2 == m);
  CHECK(s2 == s);
  CHECK(blob == Bytes{1, 2, 3});
  CHECK(tail.size() == 3);
  CHECK(tail[0] == 'x');
}

TEST_CASE("a short read fails, yields zero, and the failure is sticky", "[codec]") {
  const Bytes buf = {1, 2, 3};
  ByteReader r(buf);
  std::uint32_t v = 77;
  CHECK_FALSE(r.u32(v));
  CHECK(v == 0);
  CHECK_FALSE(r.ok());
  CHECK(r.remaining() == 0);
  std::uint8_t small = 5;
  CHECK_FALSE(r.u8(small));  // even though a byte is there: the reader stays failed
  CHECK(small == 0);
  CHECK_FALSE(r.done());
  CHECK(r.position() == 0);
}

TEST_CASE("a blob length over the limit or over the remaining bytes fails without allocating", "[codec]") {
  Bytes buf;
  ByteWriter w(buf);
  w.u32(0xFFFFFFF0u);  // a hostile length
  w.u8(1);
  {
    ByteReader r(buf);
    Bytes out = {9};
    CHECK_FALSE(r.blob(out, 0xFFFFFFFFu));  // fits the limit but not the input
    CHECK(out.empty());
    CHECK(out.capacity() <= 1);
  }
  {
    ByteReader r(buf);
    Bytes out;
    CHECK_FALSE(r.blob(out, 16));  // over the limit
    CHECK_FALSE(r.ok());
  }
  {
    Bytes exact;
    ByteWriter w2(exact);
    w2.blob(Bytes{5, 6});
    ByteReader r(exact);
    Bytes out;
    CHECK_FALSE(r.blob(out, 1));  // the limit is inclusive: 2 > 1 fails
    ByteReader r2(exact);
    CHECK(r2.blob(out, 2));
    CHECK(r2.done());
  }
}

TEST_CASE("a boolean byte other than 0 or 1 fails the reader", "[codec]") {
  const Bytes buf = {1, 0, 2};
  ByteReader r(buf);
  bool b = false;
  CHECK(r.boolean(b));
  CHECK(b);
  CHECK(r.boolean(b));
  CHECK_FALSE(b);
  CHECK_FALSE(r.boolean(b));
  CHECK_FALSE(r.ok());
}

TEST_CASE("bytes, view and skip check the length against what remains", "[codec]") {
  const Bytes buf = {1, 2, 3, 4};
  ByteReader r(buf);
  CHECK(r.skip(1));
  Bytes out;
  CHECK(r.bytes(2, out));
  CHECK(out == Bytes{2, 3});
  std::span<const std::uint8_t> v;
  CHECK_FALSE(r.view(2, v));
  CHECK(v.empty());
  CHECK_FALSE(r.ok());

  ByteReader huge(buf);
  CHECK_FALSE(huge.bytes(static_cast<std::size_t>(-1), out));
  CHECK(out.empty());
}

TEST_CASE("fixed-offset loads and stores are little-endian", "[codec]") {
  std::uint8_t b[8] = {};
  store_u64_le(b, 0x0807060504030201ull);
  CHECK(b[0] == 1);
  CHECK(b[7] == 8);
  CHECK(load_u64_le(b) == 0x0807060504030201ull);
  CHECK(load_u32_le(b + 4) == 0x08070605u);
  CHECK(load_u16_le(b + 2) == 0x0403);
  store_u32_le(b, 0xA1B2C3D4u);
  CHECK(b[0] == 0xD4);
  CHECK(load_u32_le(b) == 0xA1B2C3D4u);
}
