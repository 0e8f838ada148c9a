// SUBMIT dependencies through the relay daemon (docs/RELAY.md, "Dependencies"): a dependency is honoured
// whatever the state of the request it names. In flight, it becomes a predicate for the replicas; final, the
// relay judges it from the FINAL it sent (status 0: satisfied; otherwise the dependent request is not executed);
// unknown or forgotten, the SUBMIT is refused with a reason. Against a PBFT cluster whose primary lies in every
// early reply, and against the NO-REP server.
#include <string>
#include <vector>

#include "tests/unit/test_relay_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

constexpr std::uint32_t kAlwaysLie = 1000000;  // ppm of early replies the primary corrupts

// Receives frames until the FINAL for `tag`, and returns it; FIRST frames for `tag` are counted in `firsts`.
relay::Final final_for(Mount& m, std::uint64_t tag, int* firsts = nullptr) {
  for (;;) {
    relay::RelayMsg msg;
    REQUIRE(m.receive(msg, 30000));
    if (const auto* first = std::get_if<relay::First>(&msg)) {
      if (first->tag == tag && firsts != nullptr) ++*firsts;
      continue;
    }
    REQUIRE(std::holds_alternative<relay::Final>(msg));
    if (std::get<relay::Final>(msg).tag == tag) return std::get<relay::Final>(msg);
  }
}

relay::First first_for(Mount& m, std::uint64_t tag) {
  relay::RelayMsg msg;
  REQUIRE(m.receive(msg, 30000));
  REQUIRE(std::holds_alternative<relay::First>(msg));
  REQUIRE(std::get<relay::First>(msg).tag == tag);
  return std::get<relay::First>(msg);
}

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// True when the root holds `name`, asked through the relay under `tag`.
bool exists(Mount& m, std::uint64_t tag, const std::string& name) {
  m.send({relay::Submit{tag, relay::kFlagReadOnly, {}, lookup_root(name)}});
  const relay::Final fin = final_for(m, tag);
  REQUIRE(fin.status == relay::FinalStatus::kCommitted);
  const fs::Result r = decoded(fin.result);
  if (r.outcome == fs::Outcome::kDone) return true;
  REQUIRE(r.results.at(r.stop).err == fs::err::kNoEnt);
  return false;
}

std::string status_text(Mount& m) {
  m.send({relay::StatusQuery{}});
  relay::RelayMsg msg;
  REQUIRE(m.receive(msg));
  REQUIRE(std::holds_alternative<relay::StatusReply>(msg));
  return std::get<relay::StatusReply>(msg).text;
}

}  // namespace

TEST_CASE("relay: a request depending on one whose FINAL showed its FIRST wrong is not executed",
          "[relay_daemon][relay_deps]") {
  PbftRelayFixture fx(kAlwaysLie);
  Mount m(fx.sock);
  m.hello();
  m.send({relay::Submit{1, relay::kFlagReportFirst, {}, mkdir_root("a")}});
  first_for(m, 1);  // the primary's early reply: a lie
  const relay::Final fa = final_for(m, 1);
  REQUIRE(fa.status == relay::FinalStatus::kRolledBack);
  REQUIRE(!fa.result.empty());  // a executed; its consensus result differs from the FIRST sent
  // The mount acted on FIRST(a) and submits b depending on it, after the relay sent FINAL(a) (the mount's
  // reader had not looked yet). b relies on a wrong prediction: it must not execute.
  m.send({relay::Submit{2, relay::kFlagReportFirst, {1}, mkdir_root("b")}});
  int firsts = 0;
  const relay::Final fb = final_for(m, 2, &firsts);
  CHECK(firsts == 0);
  CHECK(fb.status == relay::FinalStatus::kRolledBack);
  CHECK(fb.result.empty());  // not executed
  // Nor does what depends on b.
  m.send({relay::Submit{3, relay::kFlagReportFirst, {2}, mkdir_root("c")}});
  const relay::Final fc = final_for(m, 3);
  CHECK(fc.status == relay::FinalStatus::kRolledBack);
  CHECK(fc.result.empty());
  CHECK(exists(m, 4, "a"));
  CHECK_FALSE(exists(m, 5, "b"));
  CHECK_FALSE(exists(m, 6, "c"));
  CHECK(status_text(m).find("dependencies_failed 2\n") != std::string::npos);
}

TEST_CASE("relay: a request depending on a wrong FIRST is not executed, whether the dependency is in flight or final",
          "[relay_daemon][relay_deps]") {
  PbftRelayFixture fx(kAlwaysLie);
  Mount m(fx.sock);
  m.hello();
  m.send({relay::Submit{1, relay::kFlagReportFirst, {}, mkdir_root("a")}});
  first_for(m, 1);
  // At once: the relay may or may not have sent FINAL(a) by the time it reads this.
  m.send({relay::Submit{2, relay::kFlagReportFirst, {1}, mkdir_root("b")}});
  const relay::Final fa = final_for(m, 1);
  CHECK(fa.status == relay::FinalStatus::kRolledBack);
  const relay::Final fb = final_for(m, 2);
  CHECK(fb.status == relay::FinalStatus::kRolledBack);
  CHECK(fb.result.empty());
  CHECK_FALSE(exists(m, 3, "b"));
}

TEST_CASE("relay: a dependency on a committed request is satisfied; on an unknown, cancelled or refused one the "
          "request is refused with a reason",
          "[relay_daemon][relay_deps]") {
  RelayFixture fx;
  Mount m(fx.sock);
  m.hello();
  m.send({relay::Submit{1, 0, {}, mkdir_root("x")}});
  REQUIRE(final_for(m, 1).status == relay::FinalStatus::kCommitted);
  m.send({relay::Submit{2, 0, {1}, mkdir_root("y")}});
  CHECK(final_for(m, 2).status == relay::FinalStatus::kCommitted);
  CHECK(exists(m, 3, "y"));

  m.send({relay::Submit{10, 0, {77}, mkdir_root("never1")}});
  relay::Final fin = final_for(m, 10);
  CHECK(fin.status == relay::FinalStatus::kRefused);
  CHECK(text(fin.result).find("tag 77") != std::string::npos);

  m.send({relay::Submit{11, 0, {}, Bytes{0xFF}}});  // malformed: refused
  REQUIRE(final_for(m, 11).status == relay::FinalStatus::kRefused);
  m.send({relay::Submit{12, 0, {11}, mkdir_root("never2")}});
  fin = final_for(m, 12);
  CHECK(fin.status == relay::FinalStatus::kRefused);
  CHECK(text(fin.result).find("tag 11") != std::string::npos);
  CHECK(text(fin.result).find("refused") != std::string::npos);

  // In one write, so the CANCEL is handled before the server answers.
  m.send({relay::Submit{13, 0, {}, mkdir_root("maybe")}, relay::Cancel{13},
          relay::Submit{14, 0, {13}, mkdir_root("never3")}});
  fin = final_for(m, 14);
  CHECK(fin.status == relay::FinalStatus::kRefused);
  CHECK(text(fin.result).find("tag 13") != std::string::npos);
  for (const char* name : {"never1", "never2", "never3"}) CHECK_FALSE(exists(m, 20, name));
}

TEST_CASE("relay: a dependency names the latest request with its tag, and FINALs beyond the limit are forgotten",
          "[relay_daemon][relay_deps]") {
  RelayFixture fx([](RelayOptions& o) { o.conn_finals_remembered = 4; });
  Mount m(fx.sock);
  m.hello();
  m.send({relay::Submit{1, 0, {}, mkdir_root("x")}});
  REQUIRE(final_for(m, 1).status == relay::FinalStatus::kCommitted);
  // Tag 1 again, for a request that is refused: a dependency on tag 1 now names that one.
  m.send({relay::Submit{1, 0, {}, Bytes{0xFF}}});
  REQUIRE(final_for(m, 1).status == relay::FinalStatus::kRefused);
  m.send({relay::Submit{2, 0, {1}, mkdir_root("y")}});
  CHECK(final_for(m, 2).status == relay::FinalStatus::kRefused);
  // Tag 1 again, cancelled before its FINAL: nothing is known about tag 1 any more.
  m.send({relay::Submit{1, 0, {}, getattr_root()}, relay::Cancel{1}, relay::Submit{3, 0, {1}, mkdir_root("z")}});
  CHECK(final_for(m, 3).status == relay::FinalStatus::kRefused);

  // Four FINALs later, tag 10's is forgotten; tag 14's is not.
  m.send({relay::Submit{10, 0, {}, getattr_root()}});
  REQUIRE(final_for(m, 10).status == relay::FinalStatus::kCommitted);
  for (std::uint64_t tag = 11; tag <= 14; ++tag) {
    m.send({relay::Submit{tag, 0, {}, getattr_root()}});
    REQUIRE(final_for(m, tag).status == relay::FinalStatus::kCommitted);
  }
  m.send({relay::Submit{15, 0, {10}, mkdir_root("old")}});
  const relay::Final fin = final_for(m, 15);
  CHECK(fin.status == relay::FinalStatus::kRefused);
  CHECK(text(fin.result).find("tag 10") != std::string::npos);
  m.send({relay::Submit{16, 0, {14}, mkdir_root("recent")}});
  CHECK(final_for(m, 16).status == relay::FinalStatus::kCommitted);
}
