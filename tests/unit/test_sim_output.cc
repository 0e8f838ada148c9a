// What an epoch client's program externalized, and checker properties 14 and 15 (docs/SPECULATION.md §14;
// sim/spec_output.h): the check accepts the serial replay's lines and objects to every way of getting them wrong;
// a client that externalizes lines before their epoch commits (and keeps a failed epoch's), or whose rollback does
// not restore its program, fails the run with property 14, and one whose last epoch never commits fails it with
// property 15.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/simulator.h"
#include "sim/spec_output.h"
#include "test_fs_speculation_util.h"

namespace {

using bftfs::sim::AppliedEpoch;
using bftfs::sim::CommittedEpoch;
using bftfs::sim::OutputLine;
using bftfs::sim::ProgramOutput;
using bftfs::sim::RequestFacts;

constexpr std::uint64_t kSeed = 42;

fstest::Result getattr_result(std::uint64_t size) {
  fstest::Result r;
  r.results.resize(2);
  r.results[0].code = fstest::OpCode::kTime;
  r.results[1].code = fstest::OpCode::kGetattr;
  r.results[1].attr.ino = fstest::kRootIno;
  r.results[1].attr.generation = 1;
  r.results[1].attr.type = fstest::FileType::kDirectory;
  r.results[1].attr.size = size;
  return r;
}

// Two applied epochs of client 9 (requests 10 and 20, at seqs 5 and 8), two GETATTR entries and one, and the
// output a correct client externalizes for them.
struct History {
  std::vector<AppliedEpoch> applied;
  ProgramOutput out;
  RequestFacts facts;

  History() {
    const fstest::Request get = fstest::entry_request(1000, {fstest::getattr(fstest::kRoot)});
    applied.push_back(AppliedEpoch{9, 1, 1, 5, 10, {fstest::entry_of(get), fstest::entry_of(get)},
                                   {getattr_result(1), getattr_result(2)}});
    applied.push_back(AppliedEpoch{9, 1, 3, 8, 20, {fstest::entry_of(get)}, {getattr_result(3)}});
    out.client = 9;
    out.stream = 1;
    out.input_seed = kSeed;
    out.committed = {CommittedEpoch{1, 10, false}, CommittedEpoch{3, 20, false}};
    std::uint64_t pos = 0;
    for (const AppliedEpoch& a : applied) {
      for (std::size_t i = 0; i < a.entries.size(); ++i) {
        const bftfs::Bytes in = bftfs::sim::read_input(kSeed, pos);
        out.lines.push_back(OutputLine{a.epoch,
                                       bftfs::sim::output_line(bftfs::sim::render_result(a.entries[i].request,
                                                                                         a.results[i]),
                                                               in),
                                       pos, in, 100 * a.epoch, {}});
        pos += in.size();
      }
    }
    facts.agreed_seq = [](std::uint64_t rid) -> std::optional<std::uint64_t> { return rid == 10 ? 5 : 8; };
    facts.completed_step = [](std::uint64_t rid) -> std::optional<std::uint64_t> { return rid == 10 ? 100 : 300; };
  }
  std::string check() const { return bftfs::sim::check_serial_output(out, applied, facts); }
};

// A file-service seed whose last client runs epochs (the sabotage tests change one switch of it).
bftfs::sim::SimConfig epoch_seed(std::uint64_t seed) {
  bftfs::sim::SimConfig c;
  c.seed = seed;
  c.service = "fs";
  c.epochs = 1;
  return c;
}

}  // namespace

TEST_CASE("the program's input stream: each read takes one byte and up to three more, fixed by the stream",
          "[sim][epoch][output]") {
  std::uint64_t pos = 0;
  for (int i = 0; i < 100; ++i) {
    const bftfs::Bytes in = bftfs::sim::read_input(kSeed, pos);
    REQUIRE(in.size() == 1u + in[0] % 4u);
    for (std::size_t k = 0; k < in.size(); ++k) CHECK(in[k] == bftfs::sim::program_input_byte(kSeed, pos + k));
    pos += in.size();
  }
  CHECK(bftfs::sim::read_input(kSeed, 7) == bftfs::sim::read_input(kSeed, 7));
}

TEST_CASE("a rendered line shows what the program saw: a stopped request only its errno", "[sim][epoch][output]") {
  const fstest::Request req = fstest::entry_request(1000, {fstest::lookup(fstest::kRoot, "x")});
  fstest::Result stopped;
  stopped.outcome = fstest::Outcome::kOpFailed;
  stopped.stop = 1;
  stopped.results.resize(2);
  stopped.results[1].code = fstest::OpCode::kLookup;
  stopped.results[1].err = fstest::err::kNoEnt;
  CHECK(bftfs::sim::render_result(req, stopped) == "FAILED at op 1: LOOKUP x E2");
  const std::string done = bftfs::sim::render_result(fstest::entry_request(1000, {fstest::getattr(fstest::kRoot)}),
                                                     getattr_result(7));
  CHECK(done.find("GETATTR = ino=1.1") != std::string::npos);
  CHECK(done.find("size=7") != std::string::npos);
  CHECK(done.find("TIME") == std::string::npos);  // the tree never sees TIME
}

TEST_CASE("property 14 accepts the serial replay's lines", "[sim][epoch][output]") {
  const History h;
  CHECK(h.check().empty());
}

TEST_CASE("property 14 objects to a line that differs from the serial replay", "[sim][epoch][output]") {
  History h;
  h.out.lines[1].text.replace(h.out.lines[1].text.find("size=2"), 6, "size=9");
  CHECK(h.check().find("but the serial replay of epoch 1 entry 1 prints") != std::string::npos);
}

TEST_CASE("property 14 objects to a line of an epoch that failed", "[sim][epoch][output]") {
  History h;
  OutputLine stray = h.out.lines[2];
  stray.epoch = 2;  // epoch 2 failed: the client rolled it back
  h.out.lines.insert(h.out.lines.begin() + 2, stray);
  CHECK(h.check().find("of epoch 2 was externalized, but that epoch never committed") != std::string::npos);
}

TEST_CASE("property 14 objects to a line externalized before its epoch's verdict", "[sim][epoch][output]") {
  History h;
  h.out.lines[2].step = 299;
  CHECK(h.check().find("before the client received its EPOCH's verdict") != std::string::npos);
}

TEST_CASE("property 14 objects to input consumed twice or skipped", "[sim][epoch][output]") {
  History h;
  h.out.lines[1].input_pos = h.out.lines[0].input_pos;  // re-read after a rollback but kept
  h.out.lines[1].input = h.out.lines[0].input;
  CHECK(!h.check().empty());
}

TEST_CASE("property 14 objects to lines missing or extra", "[sim][epoch][output]") {
  History missing;
  missing.out.lines.pop_back();
  CHECK(missing.check().find("was never externalized") != std::string::npos);
  History extra;
  extra.out.lines.push_back(extra.out.lines.back());
  CHECK(extra.check().find("its epoch has fewer entries") != std::string::npos);
}

TEST_CASE("property 14 objects to an epoch applied that the client rolled back, or committed that never applied",
          "[sim][epoch][output]") {
  History rolled_back;
  rolled_back.out.committed.pop_back();
  CHECK(rolled_back.check().find("never committed it") != std::string::npos);
  History never_applied;
  never_applied.applied.pop_back();
  CHECK(never_applied.check().find("applied epoch is none") != std::string::npos);
  History elsewhere;
  elsewhere.applied[1].seq = 9;  // applied, but not where the client's EPOCH request executed
  CHECK(elsewhere.check().find("but it applied at seq 9") != std::string::npos);
}

TEST_CASE("a client that externalizes output before its epoch commits fails the run with property 14",
          "[sim][fs][epoch][output]") {
  bftfs::sim::SimConfig c = epoch_seed(5);
  c.sabotage_output = true;
  const bftfs::sim::SimResult r = bftfs::sim::run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  CHECK(r.failure.find("serial equivalence (property 14)") != std::string::npos);
}

TEST_CASE("a rollback that does not restore what the program knew fails the run with property 14",
          "[sim][fs][epoch][output]") {
  bftfs::sim::SimConfig c = epoch_seed(1);
  c.sabotage_checkpoint = true;
  const bftfs::sim::SimResult r = bftfs::sim::run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  CHECK(r.failure.find("the serial run of its program issues another request") != std::string::npos);
}

TEST_CASE("a client whose last epoch is never sealed fails the run with property 15", "[sim][fs][epoch][output]") {
  bftfs::sim::SimConfig c = epoch_seed(3);
  c.liveness_ticks_max = 8000;
  c.sabotage_last_epoch = true;
  const bftfs::sim::SimResult r = bftfs::sim::run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  CHECK(r.failure.find("liveness under quiescence (property 15)") != std::string::npos);
}
