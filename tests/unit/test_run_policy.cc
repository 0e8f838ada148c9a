// When `bftfs run` speculates (criu-hooks/policy.h, docs/SPECULATION.md §10) and what `--stats` prints
// (criu-hooks/run_stats.h, §15). Pure: the tests feed measurements and times and check the decisions and their
// stated reasons.
#include <catch2/catch.hpp>

#include <string>

#include "criu-hooks/policy.h"
#include "criu-hooks/run_stats.h"

using namespace bftfs::criu;

namespace {

constexpr std::uint64_t kMs = 1000;
constexpr std::uint64_t kS = 1000 * kMs;

// `per_s` of hideable latency per second of run, as WAITS every 100 ms from `from` to `to`.
void feed_waits(Policy& p, std::uint64_t from, std::uint64_t to, std::uint64_t per_s) {
  for (std::uint64_t t = from + 100 * kMs; t <= to; t += 100 * kMs) p.on_waits(t, per_s / 10, per_s / 10);
}

PolicyView running(std::uint64_t now, bool speculating = false, std::uint64_t open_since = 0) {
  PolicyView v;
  v.now_us = now;
  v.tree_running = true;
  v.speculating = speculating;
  v.open_since_us = open_since;
  return v;
}

}  // namespace

TEST_CASE("policy: no speculation where a checkpoint costs more than the latency it hides, and -v says why",
          "[criu_hooks][policy]") {
  Policy p(PolicyOptions{});
  // A make -j2 on a LAN: about 70 ms of waiting in a whole build, against a 110 ms checkpoint.
  p.on_tree_memory(95ull << 20);  // first-dump estimate: 15 + 95 = 110 ms
  CHECK(p.checkpoint_cost_us() == 110 * kMs);
  CHECK(p.hide_target_us() == 1100 * kMs);
  CHECK(p.decide(running(0)) == PolicyAction::kNone);
  CHECK(p.reason().find("no measurement") != std::string::npos);
  feed_waits(p, 0, 2 * kS, 35 * kMs);
  CHECK(p.decide(running(2 * kS)) == PolicyAction::kNone);
  // The reason gives the numbers: hidden per second x T_max against the checkpoint cost over the share.
  CHECK(p.pays_target_us() == 330 * kMs);
  CHECK(p.reason() == "not speculating: 35.0 ms/s hidden x 1000.0 ms = 35.0 ms per epoch, against 110.0 ms per "
                      "checkpoint x 3 = 330.0 ms");
}

TEST_CASE("policy: speculation starts where the latency hidden pays for the checkpoints", "[criu_hooks][policy]") {
  Policy p(PolicyOptions{});
  p.on_tree_memory(1ull << 20);  // a tar: 16 ms per checkpoint, 160 ms to hide per epoch
  feed_waits(p, 0, 1 * kS, 500 * kMs);
  CHECK(p.decide(running(1 * kS)) == PolicyAction::kStart);
  CHECK(p.reason().rfind("speculating: ", 0) == 0);
  // Not while the tree is gone, input waits, or the pipeline or the images are full.
  PolicyView v = running(1 * kS);
  v.tree_running = false;
  CHECK(p.decide(v) == PolicyAction::kNone);
  v = running(1 * kS);
  v.input_pending = true;
  CHECK(p.decide(v) == PolicyAction::kNone);
  v = running(1 * kS);
  v.sealed_uncommitted = 4;
  CHECK(p.decide(v) == PolicyAction::kNone);
  v = running(1 * kS);
  v.images_full = true;
  CHECK(p.decide(v) == PolicyAction::kNone);
}

TEST_CASE("policy: an epoch ends at T_max or at the daemon's advice, never beyond the pipeline's bound",
          "[criu_hooks][policy]") {
  PolicyOptions o;
  o.max_epoch_us = 500 * kMs;
  Policy p(o);
  p.on_checkpoint(0, 20 * kMs);
  CHECK(p.checkpoint_cost_us() == 20 * kMs);
  CHECK(p.decide(running(100 * kMs, true, 0)) == PolicyAction::kNone);
  CHECK(p.decide(running(500 * kMs, true, 0)) == PolicyAction::kCheckpoint);
  CHECK(p.reason().find("500.0 ms old") != std::string::npos);
  // The hide target (20 ms / 0.1 = 200 ms hidden) ends the epoch only once it has run as long.
  p.on_advice(true);
  CHECK(p.decide(running(100 * kMs, true, 0)) == PolicyAction::kNone);
  CHECK(p.decide(running(200 * kMs, true, 0)) == PolicyAction::kCheckpoint);
  CHECK(p.reason() == "checkpoint: the epoch hid 200.0 ms and ran as long");
  // The prediction cap or a full log end it at once.
  p.on_advice(false);
  CHECK(p.decide(running(100 * kMs, true, 0)) == PolicyAction::kCheckpoint);
  CHECK(p.reason() == "checkpoint: the daemon advised it");
  PolicyView full = running(600 * kMs, true, 0);
  full.sealed_uncommitted = 4;
  CHECK(p.decide(full) == PolicyAction::kNone);
  CHECK(p.reason() == "checkpoint waits: 4 sealed epochs uncommitted");
  // Input to forward pauses speculation: a seal without a dump.
  PolicyView input = running(100 * kMs, true, 0);
  input.input_pending = true;
  CHECK(p.decide(input) == PolicyAction::kStop);
}

TEST_CASE("policy: epochs that hid less than their checkpoints turn speculation off with a backoff",
          "[criu_hooks][policy]") {
  Policy p(PolicyOptions{});
  p.on_checkpoint(0, 100 * kMs);
  p.on_sealed(1 * kS, 10 * kMs);  // one epoch of 1 s hid 10 ms: 10 ms/s x 1 s < 100 ms / 0.1
  p.on_checkpoint(1 * kS, 100 * kMs);
  CHECK(p.decide(running(2 * kS, true, 1 * kS)) == PolicyAction::kStop);
  CHECK(p.reason().rfind("speculation off for 1000.0 ms: epochs do not pay", 0) == 0);
  CHECK(p.backoffs() == 1);
  // During the backoff nothing starts, however much latency there is to hide; after it, WAITS decide again.
  feed_waits(p, 2 * kS, 3 * kS, 2 * kS);  // concurrent requests: more than 1 s per s
  CHECK(p.decide(running(2500 * kMs)) == PolicyAction::kNone);
  CHECK(p.decide(running(3100 * kMs)) == PolicyAction::kStart);
}

TEST_CASE("policy: the window of judged epochs turns speculation off when rollbacks cost more than it hid",
          "[criu_hooks][policy]") {
  PolicyOptions o;
  o.judged_epochs = 2;
  Policy p(o);
  p.on_checkpoint(0, 10 * kMs);
  p.on_sealed(100 * kMs, 5 * kMs);
  p.on_committed(100 * kMs);  // hid 5 ms, cost 10 ms: one epoch is not yet a window
  CHECK(p.backoffs() == 0);
  p.on_checkpoint(100 * kMs, 10 * kMs);
  CHECK(p.speculate_after_failure(200 * kMs));
  p.on_rollback(200 * kMs, 30 * kMs, 100 * kMs, true);
  CHECK(p.backoffs() == 1);
  CHECK(p.reason().find("the last 2 epochs hid 5.0 ms but cost") != std::string::npos);
  CHECK(p.decide(running(300 * kMs, true, 200 * kMs)) == PolicyAction::kStop);
}

TEST_CASE("policy: after one failure the re-run speculates; after two in a row it does not", "[criu_hooks][policy]") {
  Policy p(PolicyOptions{});
  CHECK(p.speculate_after_failure(1 * kS));
  CHECK_FALSE(p.speculate_after_failure(2 * kS));
  CHECK(p.reason() == "speculation off for 1000.0 ms: two failed epochs in a row");
  // A commit in between resets the count.
  CHECK(p.speculate_after_failure(4 * kS));
  p.on_committed(5 * kS);
  CHECK(p.speculate_after_failure(6 * kS));
}

TEST_CASE("policy: --no-speculate never checkpoints and says so", "[criu_hooks][policy]") {
  PolicyOptions o;
  o.speculate = false;
  Policy p(o);
  feed_waits(p, 0, 2 * kS, 900 * kMs);
  CHECK(p.decide(running(2 * kS)) == PolicyAction::kNone);
  CHECK(p.reason() == "not speculating: --no-speculate");
}

TEST_CASE("run stats: --stats lines and --stats-json list every checkpoint and rollback", "[criu_hooks][policy]") {
  RunStats s;
  s.run_us = 2 * kS;
  s.exit_code = 3;
  s.speculating_us = 1500 * kMs;
  s.warmup_us = 500 * kMs;
  s.epochs_committed = 4;
  s.epochs_discarded = 2;
  s.checkpoints.push_back({1, 20 * kMs, 10 * kMs, 1 * kMs, 2 * kMs, 1 * kMs, 3ull << 20});
  s.checkpoints.push_back({2, 40 * kMs, 12 * kMs, 1 * kMs, 2 * kMs, 1 * kMs, 5ull << 20});
  s.rollbacks.push_back({2, 5, 1, "LOOKUP \"a\"", 64 * kMs, 2 * kMs, 0, 50 * kMs, 300 * kMs, false});
  s.hidden_us = 600 * kMs;
  s.daemon_text = "model 3 MiB\nfetches 12\n";
  const std::string text = format_stats_text(s);
  CHECK(text.find("run          2.00 s, exit status 3; speculating 1.50 s, not 0.50 s") == 0);
  CHECK(text.find("epochs       4 committed, 1 rolled back, 2 discarded in all\n") != std::string::npos);
  CHECK(text.find("checkpoints  2 (0 failed): dump p50 40.0 ms") != std::string::npos);
  CHECK(text.find("0.06 s in all (3.0% of the run)") != std::string::npos);
  CHECK(text.find("rollbacks    1: epoch 2 first reply wrong (LOOKUP \"a\"), restore 64.0 ms, 0.30 s discarded, "
                  "re-run without speculation\n") != std::string::npos);
  CHECK(text.find("latency      hidden 0.60 s, waited 0.00 s; hidden / checkpoint cost 10.0\n") != std::string::npos);
  CHECK(text.find("daemon       model 3 MiB\ndaemon       fetches 12\n") != std::string::npos);
  const std::string json = format_stats_json(s);
  CHECK(json.find("\"exit_code\": 3") != std::string::npos);
  CHECK(json.find("{\"epoch\": 2, \"wall_us\": 40000,") != std::string::npos);
  CHECK(json.find("\"detail\": \"LOOKUP \\\"a\\\"\", \"restore_us\": 64000") != std::string::npos);
  CHECK(json.find("\"rerun_speculative\": false}") != std::string::npos);
  CHECK(json.find("\"daemon\": \"model 3 MiB\\u000afetches 12\\u000a\"") != std::string::npos);
  CHECK(quantile({}, 0.5) == 0);
  CHECK(quantile({5, 1, 3}, 0.5) == 3);
  CHECK(quantile({5, 1, 3}, 1.0) == 5);
}
