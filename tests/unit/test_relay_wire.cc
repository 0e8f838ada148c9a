// The relay socket protocol (relay/relay_wire.h): canonical round trips of every frame, a named reason for
// every rejection, and stream splitting that does not depend on how the bytes arrive.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/prng.h"
#include "relay/relay_wire.h"

using namespace bftfs;
using namespace bftfs::relay;

namespace {

std::span<const std::uint8_t> body_of(const Bytes& frame) {
  REQUIRE(frame.size() > kFrameLengthBytes);
  REQUIRE(load_u32_le(frame.data()) == frame.size() - kFrameLengthBytes);
  return std::span<const std::uint8_t>(frame).subspan(kFrameLengthBytes);
}

std::vector<MountMsg> every_mount_msg() {
  return {Hello{},
          Submit{0xFFFFFFFFFFFFFFFFull, kFlagReadOnly | kFlagReportFirst, {1, 2, 3}, Bytes(1000, 0xAB)},
          Submit{1, 0, {}, Bytes{9}},
          Cancel{42},
          StatusQuery{}};
}

std::vector<RelayMsg> every_relay_msg() {
  return {HelloOk{kRelayWireVersion, 4, 4, 1},
          HelloOk{kRelayWireVersion, 7, 1, 0},
          First{5, 3, Bytes{1, 2, 3}},
          Final{5, FinalStatus::kCommitted, Bytes{1, 2, 3}},
          Final{6, FinalStatus::kRolledBack, Bytes{}},
          Final{7, FinalStatus::kRefused, Bytes{'b', 'a', 'd', ' ', 0xC3, 0xA9}},
          StatusReply{"client_id 4\nin_flight 0\n"}};
}

// The body of a SUBMIT written field by field, to build malformed ones.
Bytes submit_body(std::uint8_t flags, std::uint16_t ndeps, std::uint32_t len, std::size_t actual_len) {
  Bytes b;
  ByteWriter w(b);
  w.u8(static_cast<std::uint8_t>(FrameType::kSubmit));
  w.u64(1);
  w.u8(flags);
  w.u16(ndeps);
  for (std::uint16_t i = 0; i < ndeps; ++i) w.u64(i);
  w.u32(len);
  w.bytes(Bytes(actual_len, 7));
  return b;
}

}  // namespace

TEST_CASE("every relay frame round-trips canonically", "[relay_wire]") {
  for (const MountMsg& m : every_mount_msg()) {
    const Bytes frame = encode_relay_frame(m);
    MountMsg back;
    REQUIRE(decode_mount_body(body_of(frame), back) == RelayWireError::kOk);
    CHECK(back == m);
    CHECK(frame_type(back) == frame_type(m));
    CHECK(encode_relay_frame(back) == frame);
    // A mount frame is not a relay frame: the type spaces are disjoint.
    RelayMsg wrong;
    CHECK(decode_relay_body(body_of(frame), wrong) == RelayWireError::kUnknownType);
  }
  for (const RelayMsg& m : every_relay_msg()) {
    const Bytes frame = encode_relay_frame(m);
    RelayMsg back;
    REQUIRE(decode_relay_body(body_of(frame), back) == RelayWireError::kOk);
    CHECK(back == m);
    CHECK(encode_relay_frame(back) == frame);
    MountMsg wrong;
    CHECK(decode_mount_body(body_of(frame), wrong) == RelayWireError::kUnknownType);
  }
}

TEST_CASE("a frame length of zero or above the bound breaks the stream", "[relay_wire]") {
  CHECK(check_frame_length(0) == RelayWireError::kFrameEmpty);
  CHECK(check_frame_length(1) == RelayWireError::kOk);
  CHECK(check_frame_length(kFrameBodyBytesMax) == RelayWireError::kOk);
  CHECK(check_frame_length(kFrameBodyBytesMax + 1) == RelayWireError::kFrameTooLarge);
  MountMsg m;
  CHECK(decode_mount_body({}, m) == RelayWireError::kFrameEmpty);
}

TEST_CASE("every truncation and every trailing byte of a valid frame is rejected", "[relay_wire]") {
  for (const MountMsg& msg : every_mount_msg()) {
    const Bytes frame = encode_relay_frame(msg);
    const auto body = body_of(frame);
    for (std::size_t cut = 1; cut < body.size(); ++cut) {
      MountMsg m;
      CHECK(decode_mount_body(body.first(cut), m) == RelayWireError::kTruncated);
    }
    Bytes longer(body.begin(), body.end());
    longer.push_back(0);
    MountMsg m;
    CHECK(decode_mount_body(longer, m) == RelayWireError::kTrailingBytes);
  }
  for (const RelayMsg& msg : every_relay_msg()) {
    const Bytes frame = encode_relay_frame(msg);
    const auto body = body_of(frame);
    for (std::size_t cut = 1; cut < body.size(); ++cut) {
      RelayMsg m;
      CHECK(decode_relay_body(body.first(cut), m) == RelayWireError::kTruncated);
    }
    Bytes longer(body.begin(), body.end());
    longer.push_back(0);
    RelayMsg m;
    CHECK(decode_relay_body(longer, m) == RelayWireError::kTrailingBytes);
  }
}

TEST_CASE("each malformed field is rejected with its own reason", "[relay_wire]") {
  MountMsg m;
  RelayMsg r;
  SECTION("unknown types") {
    for (int t = 0; t < 256; ++t) {
      const Bytes b{static_cast<std::uint8_t>(t)};
      const bool mount_type = t >= 1 && t <= 4;
      const bool relay_type = t >= 129 && t <= 132;
      if (!mount_type) CHECK(decode_mount_body(b, m) == RelayWireError::kUnknownType);
      if (!relay_type) CHECK(decode_relay_body(b, r) == RelayWireError::kUnknownType);
    }
  }
  SECTION("HELLO of another version") {
    CHECK(decode_mount_body(Bytes{1, 2, 0}, m) == RelayWireError::kBadVersion);
    CHECK(decode_mount_body(Bytes{1, 0, 0}, m) == RelayWireError::kBadVersion);
  }
  SECTION("SUBMIT fields") {
    CHECK(decode_mount_body(submit_body(0, 0, 3, 3), m) == RelayWireError::kOk);
    CHECK(decode_mount_body(submit_body(4, 0, 3, 3), m) == RelayWireError::kBadFlags);
    CHECK(decode_mount_body(submit_body(0x80, 0, 3, 3), m) == RelayWireError::kBadFlags);
    CHECK(decode_mount_body(submit_body(0, kDepsMax, 3, 3), m) == RelayWireError::kOk);
    CHECK(decode_mount_body(submit_body(0, kDepsMax + 1, 3, 3), m) == RelayWireError::kTooManyDeps);
    CHECK(decode_mount_body(submit_body(0, 0, 0, 0), m) == RelayWireError::kEmptyRequest);
    CHECK(decode_mount_body(submit_body(0, 0, kSubmitRequestBytesMax + 1, 0), m) ==
          RelayWireError::kRequestTooLarge);
    CHECK(decode_mount_body(submit_body(0, 0, 5, 3), m) == RelayWireError::kTruncated);
    CHECK(decode_mount_body(submit_body(0, 0, 3, 5), m) == RelayWireError::kTrailingBytes);
    // The largest request fits in the largest frame.
    const Bytes big = submit_body(0, kDepsMax, kSubmitRequestBytesMax, kSubmitRequestBytesMax);
    CHECK(big.size() <= kFrameBodyBytesMax);
    CHECK(decode_mount_body(big, m) == RelayWireError::kOk);
  }
  SECTION("HELLO_OK replica counts") {
    const auto hello_ok = [](std::uint32_t n, std::uint32_t f) {
      Bytes b;
      ByteWriter w(b);
      w.u8(129);
      w.u16(kRelayWireVersion);
      w.u32(4);
      w.u32(n);
      w.u32(f);
      return b;
    };
    CHECK(decode_relay_body(hello_ok(4, 1), r) == RelayWireError::kOk);
    CHECK(decode_relay_body(hello_ok(0, 0), r) == RelayWireError::kBadReplicaCount);
    CHECK(decode_relay_body(hello_ok(3, 1), r) == RelayWireError::kBadReplicaCount);
    CHECK(decode_relay_body(hello_ok(4, 0xFFFFFFFFu), r) == RelayWireError::kBadReplicaCount);
  }
  SECTION("FINAL status and reason") {
    const auto final_body = [](std::uint8_t status, Bytes payload) {
      Bytes b;
      ByteWriter w(b);
      w.u8(131);
      w.u64(9);
      w.u8(status);
      w.blob(payload);
      return b;
    };
    CHECK(decode_relay_body(final_body(2, Bytes{'o', 'k'}), r) == RelayWireError::kOk);
    CHECK(decode_relay_body(final_body(3, Bytes{}), r) == RelayWireError::kBadStatus);
    CHECK(decode_relay_body(final_body(2, Bytes{0xFF}), r) == RelayWireError::kBadUtf8);
    // A result is opaque bytes to the codec: only a refusal reason must be text.
    CHECK(decode_relay_body(final_body(0, Bytes{0xFF}), r) == RelayWireError::kOk);
    Bytes huge;
    ByteWriter w(huge);
    w.u8(131);
    w.u64(9);
    w.u8(0);
    w.u32(kResultBytesMax + 1);
    CHECK(decode_relay_body(huge, r) == RelayWireError::kResultTooLarge);
  }
  SECTION("STATUS_REPLY text") {
    Bytes b;
    ByteWriter w(b);
    w.u8(132);
    w.u32(2);
    w.u8(0xC0);  // an overlong encoding of '/'
    w.u8(0xAF);
    CHECK(decode_relay_body(b, r) == RelayWireError::kBadUtf8);
    Bytes big;
    ByteWriter w2(big);
    w2.u8(132);
    w2.u32(kStatusTextBytesMax + 1);
    CHECK(decode_relay_body(big, r) == RelayWireError::kStatusTooLarge);
  }
}

TEST_CASE("UTF-8 validation rejects overlong forms, surrogates and out-of-range code points", "[relay_wire]") {
  const auto u = [](std::initializer_list<std::uint8_t> b) { return is_utf8(Bytes(b)); };
  CHECK(u({}));
  CHECK(u({'a', 'b'}));
  CHECK(u({0xC3, 0xA9}));              // é
  CHECK(u({0xE2, 0x82, 0xAC}));        // €
  CHECK(u({0xF0, 0x9F, 0x98, 0x80}));  // U+1F600
  CHECK_FALSE(u({0x80}));
  CHECK_FALSE(u({0xC3}));
  CHECK_FALSE(u({0xC0, 0x80}));              // overlong NUL
  CHECK_FALSE(u({0xE0, 0x80, 0x80}));        // overlong
  CHECK_FALSE(u({0xED, 0xA0, 0x80}));        // U+D800
  CHECK_FALSE(u({0xF4, 0x90, 0x80, 0x80}));  // U+110000
  CHECK_FALSE(u({0xF8, 0x88, 0x80, 0x80, 0x80}));
}

TEST_CASE("the frame splitter yields the same frames however the stream is cut", "[relay_wire]") {
  Bytes stream;
  std::vector<Bytes> expected;
  for (const MountMsg& m : every_mount_msg()) {
    const Bytes f = encode_relay_frame(m);
    stream.insert(stream.end(), f.begin(), f.end());
    expected.emplace_back(f.begin() + kFrameLengthBytes, f.end());
  }
  Prng prng(7);
  for (int round = 0; round < 50; ++round) {
    FrameSplitter s;
    std::vector<Bytes> got;
    std::size_t off = 0;
    while (off < stream.size()) {
      const std::size_t piece = std::min<std::size_t>(stream.size() - off, 1 + prng.below(300));
      s.append(std::span<const std::uint8_t>(stream).subspan(off, piece));
      off += piece;
      Bytes body;
      RelayWireError why = RelayWireError::kOk;
      FrameSplitter::Next next;
      while ((next = s.next(body, why)) == FrameSplitter::Next::kFrame) got.push_back(body);
      REQUIRE(next == FrameSplitter::Next::kNeedMore);
    }
    CHECK(got == expected);
    CHECK(s.buffered_bytes() == 0);
  }
}

TEST_CASE("a bad length breaks the splitter for good", "[relay_wire]") {
  FrameSplitter s;
  Bytes good = encode_relay_frame(MountMsg{Cancel{1}});
  Bytes stream = good;
  const Bytes zero{0, 0, 0, 0};
  stream.insert(stream.end(), zero.begin(), zero.end());
  s.append(stream);
  Bytes body;
  RelayWireError why = RelayWireError::kOk;
  REQUIRE(s.next(body, why) == FrameSplitter::Next::kFrame);
  CHECK(s.next(body, why) == FrameSplitter::Next::kBroken);
  CHECK(why == RelayWireError::kFrameEmpty);
  s.append(good);  // a later valid frame cannot resynchronise a broken stream
  CHECK(s.next(body, why) == FrameSplitter::Next::kBroken);

  FrameSplitter t;
  Bytes huge(4);
  store_u32_le(huge.data(), kFrameBodyBytesMax + 1);
  t.append(huge);
  CHECK(t.next(body, why) == FrameSplitter::Next::kBroken);
  CHECK(why == RelayWireError::kFrameTooLarge);
}

TEST_CASE("random bytes never crash the relay decoders", "[relay_wire]") {
  Prng prng(11);
  for (int i = 0; i < 2000; ++i) {
    Bytes b(prng.below(64));
    for (auto& x : b) x = static_cast<std::uint8_t>(prng.below(256));
    if (!b.empty() && prng.below(2) == 0) b[0] = static_cast<std::uint8_t>(1 + prng.below(4));
    MountMsg m;
    RelayMsg r;
    if (decode_mount_body(b, m) == RelayWireError::kOk) {
      const Bytes again = encode_relay_frame(m);
      CHECK(Bytes(again.begin() + kFrameLengthBytes, again.end()) == b);
    }
    if (decode_relay_body(b, r) == RelayWireError::kOk) {
      const Bytes again = encode_relay_frame(r);
      CHECK(Bytes(again.begin() + kFrameLengthBytes, again.end()) == b);
    }
  }
}
