// The control protocol between the supervisor and the daemon (spec/control_wire.h): canonical round trips of
// every frame, a named reason for every rejection, and stream splitting that does not depend on how the bytes
// arrive.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/prng.h"
#include "fuzz/spec_control_samples.h"
#include "spec/control_wire.h"

using namespace bftfs;
using namespace bftfs::spec;

namespace {

std::span<const std::uint8_t> body_of(const Bytes& frame) {
  REQUIRE(frame.size() > kControlLengthBytes);
  REQUIRE(load_u32_le(frame.data()) == frame.size() - kControlLengthBytes);
  return std::span<const std::uint8_t>(frame).subspan(kControlLengthBytes);
}

// A body built field by field, to make malformed ones.
struct Body {
  Bytes bytes;
  explicit Body(ControlType t) { bytes.push_back(static_cast<std::uint8_t>(t)); }
  Body& u8(std::uint8_t v) {
    ByteWriter(bytes).u8(v);
    return *this;
  }
  Body& u16(std::uint16_t v) {
    ByteWriter(bytes).u16(v);
    return *this;
  }
  Body& u32(std::uint32_t v) {
    ByteWriter(bytes).u32(v);
    return *this;
  }
  Body& u64(std::uint64_t v) {
    ByteWriter(bytes).u64(v);
    return *this;
  }
  Body& str(std::string_view s) {
    u16(static_cast<std::uint16_t>(s.size()));
    ByteWriter(bytes).bytes(s);
    return *this;
  }
};

ControlWireError sup(const Body& b) {
  SupervisorMsg m;
  return decode_supervisor_body(b.bytes, m);
}

ControlWireError dmn(const Body& b) {
  DaemonMsg m;
  return decode_daemon_body(b.bytes, m);
}

Body hello_ok(std::string_view options, std::string_view run_dir) {
  return std::move(Body(ControlType::kHelloOk).u16(kControlWireVersion).u32(4).str(options).str(run_dir).u64(1));
}

}  // namespace

TEST_CASE("every control frame round-trips canonically", "[spec][control]") {
  for (const SupervisorMsg& m : samples::control_supervisor_msgs()) {
    const Bytes frame = encode_control_frame(m);
    SupervisorMsg back;
    REQUIRE(decode_supervisor_body(body_of(frame), back) == ControlWireError::kOk);
    CHECK(back == m);
    CHECK(control_type(back) == control_type(m));
    CHECK(encode_control_frame(back) == frame);
    // The two directions' type spaces are disjoint.
    DaemonMsg wrong;
    CHECK(decode_daemon_body(body_of(frame), wrong) == ControlWireError::kUnknownType);
  }
  for (const DaemonMsg& m : samples::control_daemon_msgs()) {
    const Bytes frame = encode_control_frame(m);
    DaemonMsg back;
    REQUIRE(decode_daemon_body(body_of(frame), back) == ControlWireError::kOk);
    CHECK(back == m);
    CHECK(encode_control_frame(back) == frame);
    SupervisorMsg wrong;
    CHECK(decode_supervisor_body(body_of(frame), wrong) == ControlWireError::kUnknownType);
  }
}

TEST_CASE("events are told apart from replies", "[spec][control]") {
  CHECK(is_event(Committed{1}));
  CHECK(is_event(Doomed{1}));
  CHECK(is_event(Failed{1, FailCause::kEntry, ""}));
  CHECK(is_event(Advice{AdviceKind::kHideTarget, 1}));
  CHECK(is_event(Waits{}));
  CHECK(is_event(Fatal{"x"}));
  CHECK_FALSE(is_event(Sealed{}));
  CHECK_FALSE(is_event(Prepared{}));
  CHECK_FALSE(is_event(ReadyForRestore{2}));
  CHECK_FALSE(is_event(WindowClosed{2}));
  CHECK_FALSE(is_event(Detached{}));
}

TEST_CASE("every truncation and every trailing byte of a valid control frame is rejected", "[spec][control]") {
  for (const SupervisorMsg& msg : samples::control_supervisor_msgs()) {
    const Bytes frame = encode_control_frame(msg);
    const auto body = body_of(frame);
    for (std::size_t cut = 1; cut < body.size(); ++cut) {
      SupervisorMsg m;
      CHECK(decode_supervisor_body(body.first(cut), m) == ControlWireError::kTruncated);
    }
    Bytes longer(body.begin(), body.end());
    longer.push_back(0);
    SupervisorMsg m;
    CHECK(decode_supervisor_body(longer, m) == ControlWireError::kTrailingBytes);
  }
  for (const DaemonMsg& msg : samples::control_daemon_msgs()) {
    const Bytes frame = encode_control_frame(msg);
    const auto body = body_of(frame);
    for (std::size_t cut = 1; cut < body.size(); ++cut) {
      DaemonMsg m;
      CHECK(decode_daemon_body(body.first(cut), m) == ControlWireError::kTruncated);
    }
    Bytes longer(body.begin(), body.end());
    longer.push_back(0);
    DaemonMsg m;
    CHECK(decode_daemon_body(longer, m) == ControlWireError::kTrailingBytes);
  }
}

TEST_CASE("control frame lengths of zero or above 64 KiB are rejected", "[spec][control]") {
  CHECK(check_control_length(0) == ControlWireError::kFrameEmpty);
  CHECK(check_control_length(1) == ControlWireError::kOk);
  CHECK(check_control_length(kControlBodyBytesMax) == ControlWireError::kOk);
  CHECK(check_control_length(kControlBodyBytesMax + 1) == ControlWireError::kFrameTooLarge);
  SupervisorMsg m;
  CHECK(decode_supervisor_body({}, m) == ControlWireError::kFrameEmpty);
  DaemonMsg d;
  CHECK(decode_daemon_body(Bytes(kControlBodyBytesMax + 1, 139), d) == ControlWireError::kFrameTooLarge);
}

TEST_CASE("each malformed control field is rejected with its own reason", "[spec][control]") {
  using E = ControlWireError;
  SECTION("unknown types") {
    for (int t = 0; t < 256; ++t) {
      const Bytes b{static_cast<std::uint8_t>(t)};
      SupervisorMsg m;
      DaemonMsg d;
      if (t < 1 || t > 10) CHECK(decode_supervisor_body(b, m) == E::kUnknownType);
      if (t < 129 || t > 142) CHECK(decode_daemon_body(b, d) == E::kUnknownType);
    }
  }
  SECTION("versions") {
    CHECK(sup(Body(ControlType::kHello).u16(2)) == E::kBadVersion);
    CHECK(sup(Body(ControlType::kHello).u16(0)) == E::kBadVersion);
    CHECK(dmn(Body(ControlType::kHelloOk).u16(2).u32(1).str("").str("/").u64(1)) == E::kBadVersion);
  }
  SECTION("flags that are 0 or 1") {
    CHECK(sup(Body(ControlType::kAttach).u64(5).u8(1).u32(512)) == E::kOk);
    CHECK(sup(Body(ControlType::kAttach).u64(5).u8(2).u32(512)) == E::kBadBool);
    CHECK(sup(Body(ControlType::kAttach).u64(5).u8(0).u32(0)) == E::kBadModelSize);
    CHECK(dmn(Body(ControlType::kPrepared).u8(2).str("")) == E::kBadBool);
    CHECK(sup(Body(ControlType::kPrepare).u64(1).u8(2).u32(0)) == E::kBadNext);
    CHECK(sup(Body(ControlType::kSeal).u64(1).u8(0xFF).u32(0).u32(0).u32(0)) == E::kBadNext);
    CHECK(sup(Body(ControlType::kRestored).u64(5).u8(2).u32(0)) == E::kBadNext);
    CHECK(sup(Body(ControlType::kFinish).u8(2).u32(0)) == E::kBadHow);
  }
  SECTION("pid namespaces and epochs") {
    CHECK(sup(Body(ControlType::kAttach).u64(0).u8(1).u32(512)) == E::kBadPidns);
    CHECK(sup(Body(ControlType::kRestored).u64(0).u8(0).u32(0)) == E::kBadPidns);
    CHECK(sup(Body(ControlType::kRollback).u64(0)) == E::kBadEpoch);
    CHECK(dmn(Body(ControlType::kCommitted).u64(0)) == E::kBadEpoch);
    CHECK(dmn(Body(ControlType::kDoomed).u64(0)) == E::kBadEpoch);
    CHECK(dmn(Body(ControlType::kFailed).u64(0).u8(1).str("")) == E::kBadEpoch);
    CHECK(dmn(Body(ControlType::kReadyForRestore).u64(1)) == E::kBadEpoch);
    CHECK(dmn(Body(ControlType::kReadyForRestore).u64(2)) == E::kOk);
    CHECK(dmn(Body(ControlType::kWindowClosed).u64(0)) == E::kBadEpoch);
    // The first, non-speculative stretch is 0: it may be prepared, sealed and aborted.
    CHECK(sup(Body(ControlType::kPrepare).u64(0).u8(0).u32(0)) == E::kOk);
    CHECK(sup(Body(ControlType::kAbort).u64(0)) == E::kOk);
  }
  SECTION("a seal without a dump has no dump costs") {
    CHECK(sup(Body(ControlType::kSeal).u64(1).u8(1).u32(0).u32(0).u32(0)) == E::kOk);
    CHECK(sup(Body(ControlType::kSeal).u64(1).u8(1).u32(1).u32(0).u32(0)) == E::kCostsWithoutDump);
    CHECK(sup(Body(ControlType::kSeal).u64(1).u8(1).u32(0).u32(1).u32(0)) == E::kCostsWithoutDump);
    CHECK(sup(Body(ControlType::kSeal).u64(1).u8(1).u32(0).u32(0).u32(1)) == E::kCostsWithoutDump);
  }
  SECTION("FINISH by a signal names one") {
    CHECK(sup(Body(ControlType::kFinish).u8(1).u32(0)) == E::kBadSignal);
    CHECK(sup(Body(ControlType::kFinish).u8(1).u32(65)) == E::kBadSignal);
    CHECK(sup(Body(ControlType::kFinish).u8(1).u32(64)) == E::kOk);
    CHECK(sup(Body(ControlType::kFinish).u8(0).u32(1000)) == E::kOk);
  }
  SECTION("causes and advice kinds") {
    CHECK(dmn(Body(ControlType::kFailed).u64(1).u8(0).str("")) == E::kBadCause);
    CHECK(dmn(Body(ControlType::kFailed).u64(1).u8(kFailCauseMax + 1).str("")) == E::kBadCause);
    CHECK(dmn(Body(ControlType::kAdvice).u8(0).u64(1)) == E::kBadAdvice);
    CHECK(dmn(Body(ControlType::kAdvice).u8(kAdviceKindMax + 1).u64(1)) == E::kBadAdvice);
  }
  SECTION("strings") {
    CHECK(dmn(hello_ok("a\xC0\x80", "/r")) == E::kBadUtf8);
    CHECK(dmn(hello_ok(std::string_view("a\0b", 3), "/r")) == E::kBadString);
    CHECK(dmn(hello_ok("", std::string_view("/r\0", 3))) == E::kBadString);
    CHECK(dmn(hello_ok("", "")) == E::kBadRunDir);
    CHECK(dmn(hello_ok("", "relative/dir")) == E::kBadRunDir);
    CHECK(dmn(Body(ControlType::kFailed).u64(1).u8(2).str("\xED\xA0\x80")) == E::kBadUtf8);
    CHECK(dmn(Body(ControlType::kStatsReply).str("\xFF")) == E::kBadUtf8);
    // A string's length is checked against the body, not trusted.
    CHECK(dmn(Body(ControlType::kStatsReply).u16(10).u8('a')) == E::kTruncated);
  }
  SECTION("reasons are present exactly when something failed") {
    CHECK(dmn(Body(ControlType::kPrepared).u8(1).str("why")) == E::kReasonMismatch);
    CHECK(dmn(Body(ControlType::kPrepared).u8(0).str("")) == E::kReasonMismatch);
    CHECK(dmn(Body(ControlType::kFatal).str("")) == E::kReasonMismatch);
  }
}

TEST_CASE("UTF-8 validation of control strings", "[spec][control]") {
  CHECK(is_utf8(""));
  CHECK(is_utf8("plain ascii"));
  CHECK(is_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));
  CHECK_FALSE(is_utf8("\xC0\xAF"));              // overlong '/'
  CHECK_FALSE(is_utf8("\xE0\x80\xAF"));          // overlong
  CHECK_FALSE(is_utf8("\xED\xA0\x80"));          // surrogate
  CHECK_FALSE(is_utf8("\xF4\x90\x80\x80"));      // above U+10FFFF
  CHECK_FALSE(is_utf8("\x80"));                  // continuation first
  CHECK_FALSE(is_utf8("\xC3"));                  // cut short
  CHECK_FALSE(is_utf8("\xF8\x88\x80\x80\x80"));  // 5-byte form
}

TEST_CASE("the control frame splitter yields the same frames however the stream is cut", "[spec][control]") {
  Bytes stream;
  std::vector<Bytes> expected;
  for (const DaemonMsg& m : samples::control_daemon_msgs()) {
    const Bytes frame = encode_control_frame(m);
    stream.insert(stream.end(), frame.begin(), frame.end());
    expected.emplace_back(frame.begin() + kControlLengthBytes, frame.end());
  }
  for (std::size_t piece : {std::size_t{1}, std::size_t{3}, std::size_t{17}, stream.size()}) {
    ControlFrameSplitter s;
    std::vector<Bytes> got;
    for (std::size_t off = 0; off < stream.size(); off += piece) {
      s.append(std::span<const std::uint8_t>(stream).subspan(off, std::min(piece, stream.size() - off)));
      Bytes body;
      ControlWireError why = ControlWireError::kOk;
      ControlFrameSplitter::Step step;
      while ((step = s.next(body, why)) == ControlFrameSplitter::Step::kFrame) got.push_back(body);
      REQUIRE(step == ControlFrameSplitter::Step::kNeedMore);
    }
    CHECK(got == expected);
    CHECK(s.buffered_bytes() == 0);
  }
}

TEST_CASE("a bad control length breaks the splitter for good", "[spec][control]") {
  ControlFrameSplitter s;
  const Bytes good = encode_control_frame(SupervisorMsg{Abort{1}});
  Bytes stream = good;
  const Bytes zero{0, 0, 0, 0};
  stream.insert(stream.end(), zero.begin(), zero.end());
  s.append(stream);
  Bytes body;
  ControlWireError why = ControlWireError::kOk;
  REQUIRE(s.next(body, why) == ControlFrameSplitter::Step::kFrame);
  CHECK(s.next(body, why) == ControlFrameSplitter::Step::kBroken);
  CHECK(why == ControlWireError::kFrameEmpty);
  s.append(good);  // a later valid frame cannot resynchronise a broken stream
  CHECK(s.next(body, why) == ControlFrameSplitter::Step::kBroken);

  ControlFrameSplitter t;
  Bytes huge(4);
  store_u32_le(huge.data(), kControlBodyBytesMax + 1);
  t.append(huge);
  CHECK(t.next(body, why) == ControlFrameSplitter::Step::kBroken);
  CHECK(why == ControlWireError::kFrameTooLarge);
}

TEST_CASE("random bytes never crash the control decoders, and what they accept is canonical", "[spec][control]") {
  Prng prng(20);
  for (int i = 0; i < 5000; ++i) {
    Bytes b(prng.below(48));
    for (auto& x : b) x = static_cast<std::uint8_t>(prng.below(256));
    if (!b.empty() && prng.below(2) == 0) {
      b[0] = static_cast<std::uint8_t>(prng.below(2) == 0 ? 1 + prng.below(10) : 129 + prng.below(14));
    }
    SupervisorMsg m;
    DaemonMsg d;
    if (decode_supervisor_body(b, m) == ControlWireError::kOk) {
      const Bytes again = encode_control_frame(m);
      CHECK(Bytes(again.begin() + kControlLengthBytes, again.end()) == b);
    }
    if (decode_daemon_body(b, d) == ControlWireError::kOk) {
      const Bytes again = encode_control_frame(d);
      CHECK(Bytes(again.begin() + kControlLengthBytes, again.end()) == b);
    }
  }
}
