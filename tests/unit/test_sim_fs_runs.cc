// Tests of the simulator on the file service: FsCheck gathers the agreed history from what correct replicas
// report (sim/fs_check.h), file-service seeds pass under every kind of fault, and their checks are wired to the
// cluster (a seed whose replicas all drift from what the clients sent fails).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "sim/fs_check.h"
#include "sim/simulator.h"

using namespace bftfs;
using namespace bftfs::sim;

namespace {

fs::FsOptions small_fs() {
  fs::FsOptions o;
  o.partitions = 4;
  o.capacity_bytes = 16ull << 20;
  o.inodes_max = 256;
  o.root_mode = 0777;
  return o;
}

FsOracleOptions oracle_options(std::uint64_t interval) {
  FsOracleOptions o;
  o.fs = small_fs();
  o.checkpoint_interval = interval;
  return o;
}

// The agreed history of `seqs` seqs, one CREATE of "f<seq>" at the root each (client 9), as a correct replica
// records it: executed serially on a local shim over the file service.
std::vector<ExecRecord> history(std::uint64_t seqs) {
  fs::FsService svc(nullptr, small_fs());
  shim::Shim shim(svc, nullptr);
  std::vector<ExecRecord> out;
  for (std::uint64_t seq = 1; seq <= seqs; ++seq) {
    fs::Op create;
    create.code = fs::OpCode::kCreate;
    create.handle = fs::Handle::of(fs::kRootIno, 1);
    create.name = "f" + std::to_string(seq);
    create.mode = 0644;
    ExecRecord r;
    r.seq = seq;
    r.client = 9;
    r.request_id = seq;
    r.timestamp_ns = seq * 1'000'000;
    r.enveloped = true;
    r.op = shim::encode_envelope({}, fs::encode_request(fs::Request{{create}}));
    r.result = shim.execute(ExecContext{r.seq, r.client, r.request_id, r.timestamp_ns}, r.op);
    r.result_digest = digest_of(r.result);
    out.push_back(r);
  }
  return out;
}

std::vector<ExecRecord> slice(const std::vector<ExecRecord>& h, std::uint64_t from, std::uint64_t through) {
  std::vector<ExecRecord> out;
  for (const ExecRecord& r : h) {
    if (r.seq > from && r.seq <= through) out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("fs check gathers the agreed history from replicas that each cover part of it", "[sim][fs]") {
  const std::vector<ExecRecord> h = history(10);
  FsCheck check(oracle_options(0));
  // Replica 1 installed a checkpoint at 4 and executed 5..7 before replica 0 reported anything.
  check.on_progress(1, slice(h, 4, 7), 4, 7);
  CHECK(check.complete_through() == 0);
  check.on_progress(0, slice(h, 0, 3), 0, 3);
  CHECK(check.complete_through() == 3);
  // Seq 4 arrives, then everything it held back goes to the oracle; a late, overlapping report changes nothing.
  check.on_progress(0, slice(h, 3, 5), 0, 5);
  CHECK(check.complete_through() == 7);
  check.on_progress(2, slice(h, 0, 10), 0, 10);
  CHECK(check.complete_through() == 10);
  check.finish();
  INFO(check.violation());
  CHECK_FALSE(check.failed());
  CHECK(check.stats().executions == 10);
  CHECK(check.stats().done == 10);
  CHECK(check.oracle().stats().executions == 10);
}

TEST_CASE("fs check treats a covered seq without records as empty and reports a gap at the end", "[sim][fs]") {
  const std::vector<ExecRecord> h = history(6);
  SECTION("an empty seq is part of the history") {
    FsCheck check(oracle_options(0));
    std::vector<ExecRecord> without_3 = slice(h, 0, 2);
    check.on_progress(0, without_3, 0, 3);  // seq 3 was a null request
    CHECK(check.complete_through() == 3);
    check.finish();
    CHECK_FALSE(check.failed());
  }
  SECTION("a seq nobody covered below a covered one is a gap") {
    FsCheck check(oracle_options(0));
    check.on_progress(0, slice(h, 0, 2), 0, 2);
    check.on_progress(1, slice(h, 3, 6), 3, 6);
    check.finish();
    REQUIRE(check.failed());
    CHECK(check.violation().find("seq 3") != std::string::npos);
    CHECK(check.stats().gaps == 1);
  }
}

TEST_CASE("fs check objects to a history whose result is not the serial execution's", "[sim][fs]") {
  std::vector<ExecRecord> h = history(4);
  h[2].result_digest.bytes[0] ^= 1;
  FsCheck check(oracle_options(0));
  check.on_progress(0, h, 0, 4);
  REQUIRE(check.failed());
  CHECK(check.violation().find("agreed result") != std::string::npos);
}

TEST_CASE("fs check compares the replicas' checkpoints with the serial execution's", "[sim][fs]") {
  const std::vector<ExecRecord> h = history(8);
  fs::FsService svc(nullptr, small_fs());
  shim::Shim shim(svc, nullptr);
  for (const ExecRecord& r : slice(h, 0, 4)) {
    (void)shim.execute(ExecContext{r.seq, r.client, r.request_id, r.timestamp_ns}, r.op);
  }
  const Digest at_4 = shim.checkpoint(4).digest;
  FsCheck check(oracle_options(4));
  check.on_checkpoint(4, at_4);  // before the history reaches it: compared when it does
  check.on_progress(0, h, 0, 8);
  CHECK_FALSE(check.failed());
  check.on_checkpoint(8, at_4);  // the state at 4 is not the state at 8
  REQUIRE(check.failed());
  CHECK(check.violation().find("checkpoint at seq 8") != std::string::npos);
}

TEST_CASE("file-service seeds pass under every kind of fault", "[sim][fs][seeds]") {
  for (const char* scenario : {"calm", "network", "crash", "all-crash", "byzantine", "lying-early-replies"}) {
    for (std::uint64_t seed : {1, 2}) {
      SimConfig c;
      c.seed = seed;
      c.scenario = scenario;
      c.service = "fs";
      const SimResult r = run_isolated(c);
      INFO("seed " << seed << " " << r.scenario << "\n" << r.failure);
      REQUIRE(r.passed);
      CHECK(r.stats.fs_seed == 1);
      CHECK(r.stats.cs_shim == 1);
      CHECK(r.stats.fs_executions > 0);
      CHECK(r.stats.fs_requests > 0);
      CHECK(r.stats.fs_checkpoints_compared > 0);
      CHECK(r.stats.fs_invariant_checks > 0);
    }
  }
}

TEST_CASE("speculating file-service clients chain requests and read on the read-only path", "[sim][fs][seeds]") {
  // A seed whose run has many of each (31 read-only reads, 51 dependencies): a seed with few may draw none once
  // a change elsewhere moves its run.
  SimConfig c;
  c.seed = 5;
  c.service = "fs";
  c.speculation = 1;
  c.scenario = "network";
  const SimResult r = run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE(r.passed);
  CHECK(r.stats.cs_speculating_clients >= 1);
  CHECK(r.stats.first_delivered > 0);
  CHECK(r.stats.fs_dependencies > 0);
  CHECK(r.stats.fs_with_dependencies > 0);
  CHECK(r.stats.fs_read_only_reads > 0);
  CHECK(r.stats.fs_reads_checked == r.stats.fs_read_only_reads);
}

TEST_CASE("the oracle sees the cluster: replicas that all alter writes fail the run", "[sim][fs]") {
  SimConfig c;
  c.seed = 3;
  c.service = "fs";
  c.scenario = "calm";
  c.sabotage_fs = true;
  const SimResult r = run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  const bool named = r.failure.find("checkpoint at seq") != std::string::npos ||
                     r.failure.find("agreed result:") != std::string::npos ||
                     r.failure.find("read-only result") != std::string::npos;
  CHECK(named);
  c.sabotage_fs = false;  // and the same seed passes with honest replicas
  const SimResult honest = run_isolated(c);
  INFO(honest.failure);
  CHECK(honest.passed);
}

TEST_CASE("the checker sees file-service replicas: altered results and ignored predicates fail", "[sim][fs]") {
  SimConfig c;
  c.seed = 11;
  c.service = "fs";
  c.scenario = "calm";
  c.sabotage_results = true;
  const SimResult r = run_isolated(c);
  INFO(r.failure);
  REQUIRE_FALSE(r.passed);
  const bool named = r.failure.find("agreed result") != std::string::npos ||
                     r.failure.find("accepted result") != std::string::npos;
  CHECK(named);
  SimConfig p;
  p.seed = 21;
  p.service = "fs";
  p.scenario = "lying-early-replies";
  p.speculation = 1;
  p.sabotage_predicates = true;
  const SimResult s = run_isolated(p);
  INFO(s.scenario << "\n" << s.failure);
  CHECK_FALSE(s.passed);
}

TEST_CASE("overload: many clients far ahead of a slow machine start no view change, and all complete",
          "[sim][fs][seeds][overload]") {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    SimConfig c;
    c.seed = seed;
    c.scenario = "overload";
    const SimResult r = run_isolated(c);
    INFO("seed " << seed << " " << r.scenario << "\n" << r.failure);
    REQUIRE(r.passed);  // among its checks: no correct replica started a view change, every client finished
    CHECK(r.stats.overload == 1);
    CHECK(r.stats.fs_seed == 1);
    CHECK(r.stats.byzantine_replicas == 0);
    CHECK(r.stats.crashes == 0);
    CHECK(r.stats.view_changes_started == 0);
    CHECK(r.stats.completed == r.stats.submitted);
    // A backlog: at least 16 clients' 4 requests each were in flight at once, and the replicas' machine had
    // frames waiting for it.
    CHECK(r.stats.overload_in_flight_max >= 64);
    CHECK(r.stats.machine_frames_waited > 0);
    CHECK(r.stats.machine_backlog_max > 0);
  }
  SimConfig wrong;
  wrong.scenario = "overload";
  wrong.service = "counter";
  CHECK_FALSE(check_config(wrong).empty());
}

TEST_CASE("the file service is a service a seed may name, and a regression line may", "[sim][fs]") {
  SimConfig c;
  c.service = "fs";
  CHECK(check_config(c).empty());
  c.scenario = "null";
  CHECK_FALSE(check_config(c).empty());  // names the null service
  c.scenario = "calm";
  c.speculation = 1;
  CHECK(check_config(c).empty());
  bool empty = false;
  std::string error;
  REQUIRE(parse_regression_line("12 service=fs scenario=crash", c, empty, error));
  CHECK(c.service == "fs");
}
