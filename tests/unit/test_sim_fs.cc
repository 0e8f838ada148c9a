// Tests of the simulator's file-service building blocks, without a cluster: workload clients (sim/fs_workload.h)
// run serially against a local shim::Shim over fs::FsService; their requests must be valid and cover every
// form, and the serial-order oracle (sim/fs_oracle.h) must accept the recorded history and reject broken ones.
#include <catch2/catch.hpp>

#include <cstdint>
#include <deque>
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
#include "sim/fs_oracle.h"
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

FsOracleOptions oracle_options(std::uint64_t interval, std::uint64_t lag) {
  FsOracleOptions o;
  o.fs = small_fs();
  o.checkpoint_interval = interval;
  o.read_lag_seqs = lag;
  return o;
}

// Feeds a serial run to `oracle` as the simulator would: executions in order, the local service's checkpoint
// digests as a replica's, and each read begun when it ran with a window around its state ([at-2, at+2] at most),
// ended a few events later; sometimes an explicit on_complete_through. Then finish().
void feed(FsOracle& oracle, const std::vector<Step>& steps, std::uint64_t seed) {
  Prng prng(seed);
  std::deque<std::pair<FsOracle::ReadId, const Step*>> open;
  const auto end_one = [&] {
    const Step& s = *open.front().second;
    oracle.end_read(open.front().first, s.digest, s.at + prng.below(3));
    open.pop_front();
  };
  for (const Step& s : steps) {
    switch (s.kind) {
      case Step::Kind::kExecution: oracle.on_execution(s.ctx, s.op, s.digest); break;
      case Step::Kind::kCheckpoint: oracle.on_replica_checkpoint(s.at, s.digest); break;
      case Step::Kind::kRead:
        if (prng.chance(1, 3)) oracle.on_complete_through(s.at);
        open.emplace_back(oracle.begin_read(s.ctx.client, s.op, s.at - std::min<std::uint64_t>(s.at, prng.below(3))),
                          &s);
        break;
    }
    while (!open.empty() && prng.chance(1, 3)) end_one();
  }
  while (!open.empty()) end_one();
  oracle.finish();
}

std::size_t count_steps(const SerialRun& run, Step::Kind kind) {
  return static_cast<std::size_t>(
      std::count_if(run.steps.begin(), run.steps.end(), [&](const Step& s) { return s.kind == kind; }));
}

// Indices of the executions of `run`.
std::vector<std::size_t> executions_of(const std::vector<Step>& steps) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == Step::Kind::kExecution) out.push_back(i);
  }
  return out;
}

// An execution that was done and changed an object in its own batch (an Attr in its result carries the batch's
// timestamp as ctime). Run in another batch it gives another result: it fails, or it changes the object with
// the other batch's timestamp, or it finds the object changed by someone else at another time.
bool changes_in_its_batch(const Step& s) {
  if (s.kind != Step::Kind::kExecution || s.result.outcome != fs::Outcome::kDone) return false;
  for (std::size_t i = 0; i < s.result.results.size(); ++i) {
    const fs::OpResult& r = s.result.results[i];
    const bool makes = r.code == fs::OpCode::kCreate || r.code == fs::OpCode::kMkdir;
    if (makes && r.err == fs::err::kOk && r.attr.ctime_ns == s.ctx.timestamp_ns) return true;
  }
  return false;
}

// The digest of read-only request `op` of `client` on the state after each batch of `steps` (by the batch's seq;
// 0 is the initial state), from a fresh replay.
std::map<std::uint64_t, Digest> read_after_each_batch(const std::vector<Step>& steps, NodeId client,
                                                      const Bytes& op) {
  fs::FsService svc(nullptr, small_fs());
  shim::Shim sh(svc, nullptr);
  std::map<std::uint64_t, Digest> out;
  std::uint64_t seq = 0;
  const auto record = [&] {
    Bytes b;
    REQUIRE(sh.execute_read_only(client, op, b));
    out[seq] = digest_of(b);
  };
  for (const Step& s : steps) {
    if (s.kind != Step::Kind::kExecution) continue;
    if (s.ctx.seq != seq) {
      record();
      seq = s.ctx.seq;
    }
    sh.execute(s.ctx, s.op);
  }
  record();
  return out;
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
  for (std::uint8_t code = 1; code <= fs::kFileOpCodeMax; ++code) {
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

TEST_CASE("fs oracle: accepts the serial history of a workload", "[sim][fs][oracle]") {
  const std::uint64_t lags[] = {2, 5, 64};
  for (std::uint64_t seed = 1; seed <= 9; ++seed) {
    INFO("seed " << seed);
    const SerialRun run = run_serial(seed, 3, 300, 8);
    const std::uint64_t lag = lags[seed % 3];
    FsOracle oracle(oracle_options(8, lag));
    feed(oracle, run.steps, seed);
    INFO(oracle.violation());
    REQUIRE_FALSE(oracle.failed());
    CHECK(oracle.check_invariants() == "");
    const FsOracleStats& st = oracle.stats();
    CHECK(st.executions == count_steps(run, Step::Kind::kExecution));
    CHECK(st.checkpoints_compared == count_steps(run, Step::Kind::kCheckpoint));
    CHECK(st.checkpoints + 1 >= st.checkpoints_compared);  // the reference's seq 0 is the oracle's initial state
    CHECK(st.reads_begun == count_steps(run, Step::Kind::kRead));
    CHECK(st.reads_begun > 0);
    CHECK(st.reads_passed == st.reads_begun);
    CHECK(st.reads_unverifiable == 0);
    CHECK(st.reads_forgotten == 0);
    for (const Step& s : run.steps) {
      if (s.kind == Step::Kind::kCheckpoint) CHECK(oracle.checkpoint_digest(s.at) == s.digest);
    }
  }
}

TEST_CASE("fs oracle: rejects a swapped result", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(11, 3, 200, 8);
  std::vector<Step> steps = run.steps;
  const std::vector<std::size_t> ex = executions_of(steps);
  std::size_t j = 1;
  while (j < ex.size() && steps[ex[j]].digest == steps[ex[0]].digest) ++j;
  REQUIRE(j < ex.size());
  std::swap(steps[ex[0]].digest, steps[ex[j]].digest);
  FsOracle oracle(oracle_options(8, 4));
  feed(oracle, steps, 11);
  REQUIRE(oracle.failed());
  CHECK(oracle.violation().find("agreed result: seq " + std::to_string(steps[ex[0]].ctx.seq)) == 0);
}

TEST_CASE("fs oracle: rejects a dropped execution", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(12, 3, 200, 8);
  for (const std::size_t k : {std::size_t{3}, std::size_t{40}, std::size_t{90}}) {
    INFO("dropping execution " << k);
    std::vector<Step> steps = run.steps;
    const std::vector<std::size_t> ex = executions_of(steps);
    REQUIRE(k < ex.size());
    REQUIRE(steps[ex[k]].ctx.seq + 8 < run.last_seq);  // a checkpoint follows it at least
    steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(ex[k]));
    FsOracle oracle(oracle_options(8, 4));
    feed(oracle, steps, 12);
    REQUIRE(oracle.failed());
    // Its successors may still give the same results (a lookup that fails either way), but the shim's log of
    // the client's results has lost an entry: the next checkpoint differs at the latest.
    const std::string& v = oracle.violation();
    CHECK((v.find("agreed result") == 0 || v.find("checkpoint at seq") == 0));
  }
}

TEST_CASE("fs oracle: rejects two executions swapped in order", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(13, 3, 200, 8);
  std::vector<Step> steps = run.steps;
  std::vector<std::size_t> made;
  for (std::size_t i : executions_of(steps)) {
    const bool new_batch = made.empty() || steps[i].ctx.seq != steps[made.back()].ctx.seq;
    if (changes_in_its_batch(steps[i]) && new_batch) made.push_back(i);
  }
  REQUIRE(made.size() >= 6);
  // Two requests trade places; seqs and batch timestamps stay where they were.
  Step& a = steps[made[2]];
  Step& b = steps[made[5]];
  std::swap(a.ctx.client, b.ctx.client);
  std::swap(a.ctx.request_id, b.ctx.request_id);
  std::swap(a.op, b.op);
  std::swap(a.digest, b.digest);
  FsOracle oracle(oracle_options(8, 4));
  feed(oracle, steps, 13);
  REQUIRE(oracle.failed());
  CHECK(oracle.violation().find("agreed result: seq " + std::to_string(a.ctx.seq)) == 0);
}

TEST_CASE("fs oracle: a read-only result must come from a state in its window", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(14, 3, 200, 8);
  // A listing of the root changes with most creations and removals there.
  fs::Op list;
  list.code = fs::OpCode::kReaddirPlus;
  list.handle = fs::Handle::of(fs::kRootIno, 1);
  list.count = 16;
  const Bytes op = shim::encode_envelope({}, fs::encode_request(fs::Request{{list}}));
  const std::map<std::uint64_t, Digest> at = read_after_each_batch(run.steps, kFirstClient, op);
  // A batch s in the middle and a later batch t whose listing differs from s's.
  auto s = at.begin();
  std::advance(s, static_cast<std::ptrdiff_t>(at.size() / 3));
  auto t = std::next(s);
  while (t != at.end() && t->second == s->second) ++t;
  REQUIRE(t != at.end());
  const auto run_with = [&](std::uint64_t lo, std::uint64_t hi, const Digest& accepted) {
    FsOracle oracle(oracle_options(8, 4));
    const FsOracle::ReadId id = oracle.begin_read(kFirstClient, op, lo);
    oracle.end_read(id, accepted, hi);  // accepted before the history arrives: decided as the shadow passes
    feed(oracle, run.steps, 14);
    const FsOracleStats st = oracle.stats();
    CHECK(st.reads_unverifiable == 0);
    return oracle.failed() ? oracle.violation() : std::string();
  };
  CHECK(run_with(s->first, s->first, s->second) == "");
  CHECK(run_with(t->first, t->first, t->second) == "");
  CHECK(run_with(s->first, t->first, t->second) == "");
  CHECK(run_with(s->first, t->first - 1, t->second).find("read-only result: client") == 0);
  CHECK(run_with(s->first, s->first, t->second).find("read-only result: client") == 0);
  CHECK(run_with(t->first, t->first, s->second).find("read-only result: client") == 0);
}

TEST_CASE("fs oracle: a read begun late is checked on the states the read shadow kept", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(17, 3, 200, 8);
  fs::Op list;
  list.code = fs::OpCode::kReaddirPlus;
  list.handle = fs::Handle::of(fs::kRootIno, 1);
  list.count = 16;
  const Bytes op = shim::encode_envelope({}, fs::encode_request(fs::Request{{list}}));
  const std::map<std::uint64_t, Digest> at = read_after_each_batch(run.steps, kFirstClient, op);
  auto s = at.begin();
  std::advance(s, static_cast<std::ptrdiff_t>(at.size() / 3));
  auto t = std::next(s);
  while (t != at.end() && t->second == s->second) ++t;
  REQUIRE(t != at.end());
  REQUIRE(t->first - s->first < 30);
  // The history arrives up to batch t + 20 before the read of state s begins; the read shadow trails by 32.
  const auto execute_through = [&](FsOracle& oracle, std::size_t& i, std::uint64_t last) {
    for (; i < run.steps.size() && run.steps[i].ctx.seq <= last; ++i) {
      const Step& e = run.steps[i];
      if (e.kind == Step::Kind::kExecution) oracle.on_execution(e.ctx, e.op, e.digest);
    }
  };
  const auto run_with = [&](const Digest& accepted) {
    FsOracle oracle(oracle_options(8, 32));
    std::size_t i = 0;
    execute_through(oracle, i, t->first + 20);
    REQUIRE(oracle.complete_through() > t->first);
    const FsOracle::ReadId id = oracle.begin_read(kFirstClient, op, s->first);
    oracle.end_read(id, accepted, s->first);
    execute_through(oracle, i, run.last_seq);
    oracle.finish();
    CHECK(oracle.stats().reads_unverifiable == 0);
    return oracle.failed() ? oracle.violation() : std::string();
  };
  CHECK(run_with(s->second) == "");
  CHECK(run_with(t->second).find("read-only result: client") == 0);
}

TEST_CASE("fs oracle: a read whose window the read shadow has left is never a false alarm", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(15, 2, 120, 0);
  FsOracle oracle(oracle_options(0, 0));  // the read shadow keeps up with the history
  for (const Step& s : run.steps) {
    if (s.kind == Step::Kind::kExecution) oracle.on_execution(s.ctx, s.op, s.digest);
  }
  oracle.on_complete_through(run.last_seq);
  fs::Op root;
  root.code = fs::OpCode::kGetattr;
  root.handle = fs::Handle::of(fs::kRootIno, 1);
  const Bytes op = shim::encode_envelope({}, fs::encode_request(fs::Request{{root}}));
  // Its window begins at 0, long left behind: a result no state in reach gives is unverifiable, not a violation.
  const FsOracle::ReadId wrong = oracle.begin_read(kFirstClient, op, 0);
  oracle.end_read(wrong, Digest{}, run.last_seq);
  // The same window with the current state's result passes.
  Bytes now;
  {
    fs::FsService svc(nullptr, small_fs());
    shim::Shim sh(svc, nullptr);
    for (const Step& s : run.steps) {
      if (s.kind == Step::Kind::kExecution) sh.execute(s.ctx, s.op);
    }
    REQUIRE(sh.execute_read_only(kFirstClient, op, now));
  }
  const FsOracle::ReadId right = oracle.begin_read(kFirstClient, op, 0);
  oracle.end_read(right, digest_of(now), run.last_seq);
  oracle.finish();
  INFO(oracle.violation());
  CHECK_FALSE(oracle.failed());
  CHECK(oracle.stats().reads_unverifiable == 1);
  CHECK(oracle.stats().reads_passed == 1);
}

TEST_CASE("fs oracle: rejects an empty read window and a checkpoint that differs", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(16, 2, 100, 8);
  {
    FsOracle oracle(oracle_options(8, 4));
    const FsOracle::ReadId id = oracle.begin_read(kFirstClient, run.steps.front().op, 5);
    oracle.end_read(id, Digest{}, 4);
    REQUIRE(oracle.failed());
    CHECK(oracle.violation().find("empty window") != std::string::npos);
  }
  for (const bool before : {true, false}) {  // reported before the shadow gets there, or after
    INFO("reported before the shadow passes it: " << before);
    FsOracle oracle(oracle_options(8, 4));
    Digest wrong;
    wrong.bytes[0] = 1;
    if (before) oracle.on_replica_checkpoint(16, wrong);
    for (const Step& s : run.steps) {
      if (s.kind == Step::Kind::kExecution) oracle.on_execution(s.ctx, s.op, s.digest);
    }
    oracle.finish();
    if (!before) oracle.on_replica_checkpoint(16, wrong);
    REQUIRE(oracle.failed());
    CHECK(oracle.violation().find("checkpoint at seq 16:") == 0);
    CHECK(oracle.stats().checkpoints_compared == 1);
  }
}

TEST_CASE("fs oracle: a replica checkpoint past the history is compared with the last state", "[sim][fs][oracle]") {
  const SerialRun run = run_serial(18, 2, 100, 8);
  const std::uint64_t far = (run.last_seq / 8 + 3) * 8;  // null batches may follow the last request
  const auto execute_all = [&](FsOracle& oracle) {
    for (const Step& s : run.steps) {
      if (s.kind == Step::Kind::kExecution) oracle.on_execution(s.ctx, s.op, s.digest);
    }
  };
  FsOracle after(oracle_options(8, 4));
  execute_all(after);
  after.finish();
  REQUIRE_FALSE(after.checkpoint_digest(far).has_value());
  after.on_replica_checkpoint(far, Digest{});  // reported after finish: taken on the last state, compared
  REQUIRE(after.failed());
  CHECK(after.violation().find("checkpoint at seq " + std::to_string(far) + ":") == 0);
  const std::optional<Digest> last = after.checkpoint_digest(far);
  REQUIRE(last.has_value());
  CHECK(after.checkpoint_digest(far - 8) == last);  // nothing was executed between them

  FsOracle before(oracle_options(8, 4));
  before.on_replica_checkpoint(far, *last);  // reported before the history: compared at finish
  execute_all(before);
  before.finish();
  INFO(before.violation());
  CHECK_FALSE(before.failed());
  CHECK(before.stats().checkpoints_compared == 1);
}
