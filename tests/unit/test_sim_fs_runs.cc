// Tests of the simulator on the file service: FsCheck gathers the agreed history from what correct replicas
// report (sim/fs_check.h).
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
