// Tests of the simulator's file-service building blocks, without a cluster: workload clients (sim/fs_workload.h)
// run serially against a local shim::Shim over fs::FsService; their requests must be valid and cover every
// form, and the serial-order oracle (sim/fs_oracle.h) must accept the recorded history and reject broken ones.
#include <catch2/catch.hpp>

#include <cstdint>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/prng.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "shim/envelope.h"
#include "shim/shim.h"
#include "sim/fs_workload.h"

using namespace bftfs;
using namespace bftfs::sim;

namespace {

constexpr NodeId kFirstClient = 10;

fs::FsOptions small_fs() {
  fs::FsOptions o;
  o.partitions = 64;
  o.capacity_bytes = 64ull << 20;
  o.inodes_max = 4000;
  o.root_mode = 0777;  // every user may create at the root
  return o;
}

// One event of a serial run: an agreed execution, a read-only read, or a checkpoint.
struct Step {
  enum class Kind : std::uint8_t { kExecution, kRead, kCheckpoint } kind = Kind::kExecution;
  ExecContext ctx;      // kExecution; kRead: client only
  Bytes op;             // the envelope the client sent
  Digest digest;        // the result's digest (kCheckpoint: the service's checkpoint digest)
  std::uint64_t at = 0;  // kRead: the read ran on the state after this seq; kCheckpoint: its seq
  fs::Request request;
  fs::Result result;    // the file-service result inside the envelope (executed requests)
};

struct SerialRun {
  std::vector<Step> steps;
  FsWorkloadStats stats;
  std::uint64_t last_seq = 0;
  std::string invariants;  // FsService::check_invariants at the end
};

fs::Result inner_result(const Bytes& envelope) {
  shim::ShimResult sr;
  REQUIRE(shim::decode_envelope_result(envelope, sr));
  REQUIRE(sr.status == shim::ShimStatus::kExecuted);
  fs::Result r;
  REQUIRE(fs::decode_result(sr.inner, r) == fs::FsDecodeError::kOk);
  return r;
}

// The local stand-in for the cluster: one Shim over one FsService executing batches in seq order.
class Serial {
 public:
  explicit Serial(std::uint64_t checkpoint_interval) : svc_(nullptr, small_fs()), shim_(svc_, nullptr),
                                                      interval_(checkpoint_interval) {}

  // Starts the batch at `seq` (> the last), first taking every checkpoint below it.
  void start_batch(std::uint64_t seq, SerialRun& run) {
    REQUIRE(seq > seq_);
    while (interval_ != 0 && next_checkpoint_ < seq) {
      Step s;
      s.kind = Step::Kind::kCheckpoint;
      s.at = next_checkpoint_;
      s.digest = shim_.checkpoint(next_checkpoint_).digest;
      shim_.discard_checkpoints_below(next_checkpoint_);
      run.steps.push_back(s);
      next_checkpoint_ += interval_;
    }
    seq_ = seq;
    time_ns_ += 1'000'000;
  }

  Step execute(NodeId client, std::uint64_t request_id, const FsWorkRequest& w) {
    Step s;
    s.ctx = ExecContext{seq_, client, request_id, time_ns_};
    s.op = shim::encode_envelope({}, fs::encode_request(w.request));
    const Bytes out = shim_.execute(s.ctx, s.op);
    s.digest = digest_of(out);
    s.request = w.request;
    s.result = inner_result(out);
    return s;
  }

  Step read(NodeId client, const FsWorkRequest& w) {
    Step s;
    s.kind = Step::Kind::kRead;
    s.ctx.client = client;
    s.at = seq_;
    s.op = shim::encode_envelope({}, fs::encode_request(w.request));
    Bytes out;
    REQUIRE(shim_.execute_read_only(client, s.op, out));
    s.digest = digest_of(out);
    s.request = w.request;
    s.result = inner_result(out);
    return s;
  }

  std::string invariants() const { return svc_.check_invariants(); }

 private:
  fs::FsService svc_;
  shim::Shim shim_;
  std::uint64_t interval_;
  std::uint64_t next_checkpoint_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t time_ns_ = 1'000'000'000;
};

// `clients` workload clients sharing one namespace issue `requests` requests in batches of 1..3 (seqs sometimes
// skipped, as null batches do); read-only requests run on the state after each batch. Every request must
// encode canonically, and every result feeds the client that issued it.
SerialRun run_serial(std::uint64_t seed, std::size_t clients, std::size_t requests, std::uint64_t interval) {
  Prng prng(seed);
  Serial serial(interval);
  SerialRun run;
  std::vector<FsWorkload> work(clients, FsWorkload(FsWorkloadOptions{}));
  std::vector<std::uint64_t> request_ids(clients, 0);
  std::uint64_t seq = 0;
  std::size_t issued = 0;
  while (issued < requests) {
    seq += prng.chance(1, 8) ? prng.range(2, 4) : 1;
    serial.start_batch(seq, run);
    std::vector<std::pair<std::size_t, FsWorkRequest>> reads;
    for (std::uint64_t n = prng.range(1, 3); n > 0 && issued < requests; ++issued) {
      const std::size_t c = prng.below(clients);
      FsWorkRequest w = work[c].next(prng);
      fs::Request back;
      REQUIRE(fs::decode_request(fs::encode_request(w.request), back) == fs::FsDecodeError::kOk);
      REQUIRE(back == w.request);
      if (w.read_only) {
        for (const fs::Op& op : w.request.ops) REQUIRE(fs::is_read_only(op.code));
        reads.emplace_back(c, std::move(w));
        continue;
      }
      --n;
      run.steps.push_back(serial.execute(kFirstClient + static_cast<NodeId>(c), ++request_ids[c], w));
      work[c].on_result(w.request, run.steps.back().result);
    }
    for (const auto& [c, w] : reads) {
      run.steps.push_back(serial.read(kFirstClient + static_cast<NodeId>(c), w));
      work[c].on_result(w.request, run.steps.back().result);
    }
  }
  run.last_seq = seq;
  for (const FsWorkload& w : work) run.stats.add(w.stats());
  run.invariants = serial.invariants();
  return run;
}

}  // namespace

TEST_CASE("fs workload: valid requests that cover every op, form and outcome", "[sim][fs]") {
  FsWorkloadStats total;
  std::uint64_t executions = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const SerialRun run = run_serial(seed, 3, 400, 0);
    INFO("seed " << seed);
    REQUIRE(run.invariants == "");
    total.add(run.stats);
    for (const Step& s : run.steps) executions += s.kind == Step::Kind::kExecution ? 1 : 0;
  }
  REQUIRE(total.requests == 30 * 400);
  CHECK(executions + total.read_only_requests == total.requests);
  CHECK(total.results == total.requests);
  for (std::uint8_t code = 1; code <= fs::kOpCodeMax; ++code) {
    INFO("op code " << static_cast<int>(code));
    CHECK(total.ops[code] > 0);
  }
  for (std::size_t shape = 0; shape < kFsShapes; ++shape) {
    INFO("shape " << to_string(static_cast<FsShape>(shape)));
    CHECK(total.shapes[shape] > 0);
  }
  CHECK(total.read_only_requests > 0);
  CHECK(total.compounds > 0);
  CHECK(total.result_refs > 0);
  CHECK(total.expect_errno > 0);
  CHECK(total.expect_digest > 0);
  CHECK(total.appends > 0);
  CHECK(total.truncates > 0);
  CHECK(total.renames_of_dirs > 0);
  CHECK(total.renames_across_dirs > 0);
  CHECK(total.renames_onto_known > 0);
  CHECK(total.renames_into_subtree > 0);
  // What the results say: predicates both hold and fail, and clients meet each other's changes.
  CHECK(total.outcomes[static_cast<std::size_t>(fs::Outcome::kDone)] > 0);
  CHECK(total.outcomes[static_cast<std::size_t>(fs::Outcome::kOpFailed)] > 0);
  CHECK(total.outcomes[static_cast<std::size_t>(fs::Outcome::kPredicateFailed)] > 0);
  CHECK(total.outcomes[static_cast<std::size_t>(fs::Outcome::kMalformed)] == 0);
  CHECK(total.digest_predicates_held > 0);
  CHECK(total.failed_noent > 0);
  CHECK(total.failed_exist > 0);
  CHECK(total.failed_stale > 0);
  CHECK(total.failed_notempty > 0);
  CHECK(total.failed_inval > 0);
  CHECK(total.failed_access > 0);
}

TEST_CASE("fs workload: one seed draws the same requests", "[sim][fs]") {
  const SerialRun a = run_serial(77, 2, 300, 0);
  const SerialRun b = run_serial(77, 2, 300, 0);
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    REQUIRE(a.steps[i].op == b.steps[i].op);
    REQUIRE(a.steps[i].digest == b.steps[i].digest);
  }
  const SerialRun c = run_serial(78, 2, 300, 0);
  bool differs = c.steps.size() != a.steps.size();
  for (std::size_t i = 0; i < std::min(a.steps.size(), c.steps.size()); ++i) differs |= c.steps[i].op != a.steps[i].op;
  CHECK(differs);
}
