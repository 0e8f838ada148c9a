// The relay daemon (relay/relay_daemon.h) in NO-REP mode against an in-process NO-REP file server, through its
// Unix socket: the frame rules of docs/RELAY.md that a mount relies on (HELLO first, FIRST before FINAL, one
// FINAL per SUBMIT, none after CANCEL, a cancelled tag reusable, refusals with a reason, a broken peer closed).
#include "tests/unit/test_relay_util.h"

using namespace bftfs;
using namespace bftfs::testing;

TEST_CASE("relay: HELLO, then FIRST before FINAL with the same result (NO-REP)", "[relay_daemon]") {
  RelayFixture fx;
  Mount m(fx.sock);
  const relay::HelloOk h = m.hello();
  CHECK(h.client_id == fx.client_id);
  CHECK(h.n == 1);
  CHECK(h.f == 0);
  m.send({relay::Submit{1, relay::kFlagReportFirst, {}, mkdir_root("a")}});
  relay::RelayMsg first, fin;
  REQUIRE(m.receive(first));
  REQUIRE(m.receive(fin));
  REQUIRE(std::holds_alternative<relay::First>(first));
  REQUIRE(std::holds_alternative<relay::Final>(fin));
  CHECK(std::get<relay::First>(first).tag == 1);
  CHECK(std::get<relay::Final>(fin).tag == 1);
  CHECK(std::get<relay::Final>(fin).status == relay::FinalStatus::kCommitted);
  CHECK(std::get<relay::First>(first).result == std::get<relay::Final>(fin).result);
  const fs::Result r = decoded(std::get<relay::Final>(fin).result);
  CHECK(r.outcome == fs::Outcome::kDone);
  CHECK(r.results.at(0).attr.type == fs::FileType::kDirectory);

  // Without bit 1 only FINAL comes; a read-only request is answered too.
  m.send({relay::Submit{2, relay::kFlagReadOnly, {}, getattr_root()}});
  REQUIRE(m.receive(fin));
  REQUIRE(std::holds_alternative<relay::Final>(fin));
  CHECK(std::get<relay::Final>(fin).tag == 2);
  CHECK(decoded(std::get<relay::Final>(fin).result).results.at(0).attr.nlink == 3);  // ., .. and a/..
}

TEST_CASE("relay: a cancelled request gets no FINAL and its tag can be reused", "[relay_daemon]") {
  RelayFixture fx;
  Mount m(fx.sock);
  m.hello();
  // In one write, so the relay handles the CANCEL before the server can answer the first SUBMIT.
  m.send({relay::Submit{5, 0, {}, mkdir_root("x")}, relay::Cancel{5}, relay::Submit{5, 0, {}, mkdir_root("y")},
          relay::Submit{6, relay::kFlagReadOnly, {}, getattr_root()}});
  std::vector<relay::Final> finals;
  while (finals.size() < 2) {
    relay::RelayMsg msg;
    REQUIRE(m.receive(msg));
    REQUIRE(std::holds_alternative<relay::Final>(msg));
    finals.push_back(std::get<relay::Final>(msg));
  }
  // Exactly one FINAL for tag 5, and it is the second request's (mkdir y: a fresh directory, inode 3).
  CHECK(finals[0].tag == 5);
  CHECK(finals[1].tag == 6);
  CHECK(decoded(finals[0].result).results.at(0).attr.ino == 3);
  // Nothing else arrives: ask for STATUS and get exactly that next.
  m.send({relay::StatusQuery{}});
  relay::RelayMsg msg;
  REQUIRE(m.receive(msg));
  REQUIRE(std::holds_alternative<relay::StatusReply>(msg));
  CHECK(std::get<relay::StatusReply>(msg).text.find("cancelled 1\n") != std::string::npos);
  CHECK(std::get<relay::StatusReply>(msg).text.find("mode norep\n") != std::string::npos);
}

TEST_CASE("relay: malformed or inconsistent requests are refused with a reason", "[relay_daemon]") {
  RelayFixture fx;
  Mount m(fx.sock);
  m.hello();
  m.send({relay::Submit{1, 0, {}, Bytes{0xFF, 0xFF}}, relay::Submit{2, relay::kFlagReadOnly, {}, mkdir_root("z")}});
  for (std::uint64_t tag : {1u, 2u}) {
    relay::RelayMsg msg;
    REQUIRE(m.receive(msg));
    REQUIRE(std::holds_alternative<relay::Final>(msg));
    const auto& fin = std::get<relay::Final>(msg);
    CHECK(fin.tag == tag);
    CHECK(fin.status == relay::FinalStatus::kRefused);
    CHECK(!fin.result.empty());
  }
  // The connection is still good.
  m.send({relay::Submit{3, 0, {}, getattr_root()}});
  relay::RelayMsg msg;
  REQUIRE(m.receive(msg));
  CHECK(std::get<relay::Final>(msg).status == relay::FinalStatus::kCommitted);
}

TEST_CASE("relay: a request that fits the socket's limit but not one operation is refused, not fatal",
          "[relay_daemon]") {
  RelayFixture fx;
  Mount m(fx.sock);
  m.hello();
  // Two full-size writes in one compound: within kSubmitRequestBytesMax, above kOpBytesMax (a 1 MiB write
  // of a mount). It used to trip the client library's assertion and kill the relay.
  fs::Request big;
  for (std::uint64_t k = 0; k < 2; ++k) {
    fs::Op w = root_op(fs::OpCode::kWrite);
    w.offset = k * fs::kIoBytesMax;
    w.data.assign(fs::kIoBytesMax, 0x5A);
    big.ops.push_back(std::move(w));
  }
  const Bytes request = fs::encode_request(big);
  REQUIRE(request.size() > kOpBytesMax);
  REQUIRE(request.size() <= relay::kSubmitRequestBytesMax);
  m.send({relay::Submit{1, 0, {}, request}});
  relay::RelayMsg msg;
  REQUIRE(m.receive(msg));
  REQUIRE(std::holds_alternative<relay::Final>(msg));
  CHECK(std::get<relay::Final>(msg).tag == 1);
  CHECK(std::get<relay::Final>(msg).status == relay::FinalStatus::kRefused);
  const auto& why = std::get<relay::Final>(msg).result;
  CHECK(std::string(why.begin(), why.end()).find("too large") != std::string::npos);
  // The relay lives on.
  m.send({relay::Submit{2, 0, {}, getattr_root()}});
  REQUIRE(m.receive(msg));
  CHECK(std::get<relay::Final>(msg).status == relay::FinalStatus::kCommitted);
}

TEST_CASE("relay: a broken peer is disconnected, and others are not affected", "[relay_daemon]") {
  RelayFixture fx;
  Mount good(fx.sock);
  good.hello();
  SECTION("a frame before HELLO") {
    Mount bad(fx.sock);
    bad.send({relay::StatusQuery{}});
    relay::RelayMsg msg;
    CHECK_FALSE(bad.receive(msg));
  }
  SECTION("a SUBMIT reusing a tag in flight") {
    Mount bad(fx.sock);
    bad.hello();
    bad.send({relay::Submit{9, 0, {}, getattr_root()}, relay::Submit{9, 0, {}, getattr_root()}});
    relay::RelayMsg msg;
    while (bad.receive(msg)) {}  // whatever came before the close, the connection ends
  }
  SECTION("a zero length") {
    Mount bad(fx.sock);
    bad.hello();
    bad.send_raw(Bytes{0, 0, 0, 0});
    relay::RelayMsg msg;
    CHECK_FALSE(bad.receive(msg));
  }
  good.send({relay::Submit{1, 0, {}, getattr_root()}});
  relay::RelayMsg msg;
  REQUIRE(good.receive(msg));
  CHECK(std::get<relay::Final>(msg).status == relay::FinalStatus::kCommitted);
}
