#include "criu-hooks/run_driver.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>

#include "common/assert.h"
#include "common/log.h"
#include "criu-hooks/control_client.h"
#include "criu-hooks/run_stats.h"
#include "os/clock.h"

namespace bftfs::criu {
namespace {

using spec::ControlType;
using spec::Next;

std::uint64_t now_us() { return mono_ns() / 1000; }
std::uint32_t to_ms(std::uint64_t us) { return static_cast<std::uint32_t>(std::min<std::uint64_t>(us / 1000, ~0u)); }

// Why the tree runs without speculation, for --stats.
enum class Mode : std::uint8_t { kWarmup, kSpeculating, kInput, kAfterRollback, kPolicyOff };

// How often the tree's memory is measured while no dump has been (the first checkpoint's estimated cost).
constexpr std::uint64_t kMemoryProbeUs = 500'000;
// The policy is consulted at least this often while nothing else happens.
constexpr int kTickMs = 100;
// After a failed or declined checkpoint, the next one waits this long.
constexpr std::uint64_t kRetryCheckpointUs = 500'000;

class RunDriver {
 public:
  explicit RunDriver(const RunOptions& options) : options_(options), policy_(options.policy) {}
  ~RunDriver() {
    if (trace_ != nullptr) std::fclose(trace_);
    if (stats_json_ != nullptr) std::fclose(stats_json_);
  }
  RunDriver(const RunDriver&) = delete;
  RunDriver& operator=(const RunDriver&) = delete;
  int run();

 private:
  std::string open_outputs();
  int run_without_daemon(const std::string& why);
  std::string start();
  std::string step();
  std::string handle(const spec::DaemonMsg& m);
  std::string on_committed(std::uint64_t epoch);
  std::string on_doomed(std::uint64_t epoch);
  std::string on_failed(const spec::Failed& f);
  std::string rollback(const spec::Failed& f);
  std::string consult_policy();
  std::string take_checkpoint();
  std::string seal_without_dump();
  std::string on_tree_end();
  std::string end_run();
  PolicyView view() const;
  bool done() const { return finish_sent_ && sealed_.empty() && !speculative_; }
  void switch_mode(Mode m);
  void trace(const char* format, ...) __attribute__((format(printf, 2, 3)));
  void say(const std::string& reason);
  int fail(const std::string& why);
  void collect_stats();
  int report();

  RunOptions options_;
  Policy policy_;
  std::unique_ptr<ControlClient> ctl_;
  std::unique_ptr<Supervisor> sup_;
  std::FILE* trace_ = nullptr;
  std::FILE* stats_json_ = nullptr;
  // The open stretch: its number, whether it is a speculative epoch, since when.
  std::uint64_t open_ = 0;
  bool speculative_ = false;
  std::uint64_t open_since_us_ = 0;
  std::uint64_t next_unused_ = 1;
  std::deque<std::uint64_t> sealed_;  // sealed speculative epochs not yet committed, oldest first
  std::map<std::uint64_t, std::uint64_t> began_us_;  // when each uncommitted speculative epoch began
  bool finish_sent_ = false;
  bool doomed_ = false;
  std::uint64_t last_image_bytes_ = 0;
  std::uint64_t memory_probed_us_ = 0;
  bool dumped_ = false;
  std::uint64_t retry_checkpoint_us_ = 0;
  std::string last_said_;
  Mode mode_ = Mode::kWarmup;
  std::uint64_t mode_since_us_ = 0;
  std::uint64_t start_us_ = 0;
  RunStats stats_;
};

void RunDriver::trace(const char* format, ...) {
  if (trace_ == nullptr) return;
  std::fprintf(trace_, "%llu ", static_cast<unsigned long long>(now_us()));
  va_list args;
  va_start(args, format);
  std::vfprintf(trace_, format, args);
  va_end(args);
  std::fputc('\n', trace_);
  std::fflush(trace_);
}

void RunDriver::say(const std::string& reason) {
  if (!options_.verbose || reason.empty()) return;
  // Numbers change with every WAITS: say a reason again only when its words change.
  std::string words;
  for (const char c : reason) {
    if ((c < '0' || c > '9') && c != '.') words += c;
  }
  if (words == last_said_) return;
  last_said_ = words;
  std::fprintf(stderr, "bftfs run: %s\n", reason.c_str());
}

int RunDriver::fail(const std::string& why) {
  std::string unknown;
  for (std::uint64_t e : sealed_) unknown += " " + std::to_string(e);
  if (speculative_) unknown += " " + std::to_string(open_);
  std::fprintf(stderr, "bftfs run: %s%s\n", why.c_str(),
               unknown.empty() ? "" : ("; the fate of epochs" + unknown + " is unknown").c_str());
  if (sup_) sup_->kill_tree();
  trace("fatal");
  return kExitRunFailure;
}

void RunDriver::switch_mode(Mode m) {
  const std::uint64_t now = now_us();
  const std::uint64_t spent = now - mode_since_us_;
  switch (mode_) {
    case Mode::kWarmup: stats_.warmup_us += spent; break;
    case Mode::kSpeculating: stats_.speculating_us += spent; break;
    case Mode::kInput: stats_.input_us += spent; break;
    case Mode::kAfterRollback: stats_.after_rollback_us += spent; break;
    case Mode::kPolicyOff: stats_.policy_off_us += spent; break;
  }
  mode_ = m;
  mode_since_us_ = now;
}

std::string RunDriver::open_outputs() {
  // Opened before the boundary makes the host read-only: the paths are the user's.
  if (!options_.trace_path.empty()) {
    trace_ = std::fopen(options_.trace_path.c_str(), "we");
    if (trace_ == nullptr) return "cannot write " + options_.trace_path + ": " + std::strerror(errno);
  }
  if (!options_.stats_json_path.empty()) {
    stats_json_ = std::fopen(options_.stats_json_path.c_str(), "we");
    if (stats_json_ == nullptr) return "cannot write " + options_.stats_json_path + ": " + std::strerror(errno);
  }
  return "";
}

// The mount's daemon does not serve `bftfs run` (yet): the tree runs inside the same boundary but without a spec
// session, on the mount's ordinary connection, where every request waits for its consensus result. Its output
// passes straight out; there is nothing to commit or roll back.
int RunDriver::run_without_daemon(const std::string& why) {
  SupervisorOptions so = options_.supervisor;
  so.boundary.spec_session = false;
  so.boundary.run_dir.clear();
  SupervisorHooks hooks;
  hooks.attach = [](std::uint64_t, int) { return std::string(); };
  if (std::string err = Supervisor::start(so, hooks, sup_); !err.empty()) return fail(err);
  if (options_.verbose) {
    std::fprintf(stderr, "bftfs run: not speculating: %s; the command runs on the mount as it is, every request "
                 "waiting for agreement. The boundary:\n", why.c_str());
    for (const std::string& line : sup_->boundary().description()) std::fprintf(stderr, "  %s\n", line.c_str());
  }
  if (sup_->exec_errno() != 0) {
    std::fprintf(stderr, "bftfs run: %s: %s\n", so.argv.front().c_str(), std::strerror(sup_->exec_errno()));
  }
  start_us_ = mode_since_us_ = now_us();
  mode_ = Mode::kPolicyOff;
  trace("start without daemon");
  while (!sup_->tree_finished()) sup_->pump(kTickMs);
  return report();
}

std::string RunDriver::start() {
  spec::DaemonMsg reply;
  if (std::string err = ctl_->call(spec::Hello{}, ControlType::kHelloOk, reply); !err.empty()) return err;
  const auto& hello = std::get<spec::HelloOk>(reply);
  SupervisorOptions so = options_.supervisor;
  so.boundary.run_dir = hello.run_dir;
  so.boundary.fuse_options = hello.fuse_options;
  SupervisorHooks hooks;
  hooks.attach = [this](std::uint64_t pidns, int fuse) {
    spec::DaemonMsg attached;
    return ctl_->call(spec::Attach{pidns, options_.policy.speculate, options_.model_mb}, ControlType::kAttached, attached, fuse);
  };
  if (std::string err = Supervisor::start(so, hooks, sup_); !err.empty()) return err;
  sup_->set_release_observer([this](EpochId epoch, int stream, std::size_t bytes) {
    trace("release %llu %d %zu", static_cast<unsigned long long>(epoch), stream, bytes);
  });
  if (options_.verbose) {
    std::fprintf(stderr, "bftfs run: stream %llu, client %u; the boundary:\n",
                 static_cast<unsigned long long>(hello.stream), hello.client_id);
    for (const std::string& line : sup_->boundary().description()) std::fprintf(stderr, "  %s\n", line.c_str());
  }
  if (sup_->exec_errno() != 0) {
    std::fprintf(stderr, "bftfs run: %s: %s\n", so.argv.front().c_str(), std::strerror(sup_->exec_errno()));
  }
  start_us_ = mode_since_us_ = open_since_us_ = now_us();
  if (!options_.policy.speculate) mode_ = Mode::kPolicyOff;
  trace("start");
  return "";
}

PolicyView RunDriver::view() const {
  PolicyView v;
  v.now_us = now_us();
  v.tree_running = sup_->tree_running() && !doomed_ && !finish_sent_;
  v.speculating = speculative_;
  v.open_since_us = open_since_us_;
  v.sealed_uncommitted = sealed_.size();
  std::uint64_t used = 0, size = 0;
  sup_->images_usage(used, size);
  v.images_full = size > 0 && used + last_image_bytes_ > size;
  v.input_pending = sup_->outside_input_pending();
  return v;
}

std::string RunDriver::step() {
  // Input that cannot be replayed reaches the tree only when nothing speculative is outstanding (§8.7, §8.9).
  sup_->set_outside_input_allowed(!speculative_ && sealed_.empty());
  int timeout = kTickMs;
  if (speculative_ && sup_->tree_running() && !doomed_) {
    const std::uint64_t due = open_since_us_ + options_.policy.max_epoch_us;
    const std::uint64_t now = now_us();
    timeout = due <= now ? 0 : static_cast<int>(std::min<std::uint64_t>((due - now) / 1000 + 1, kTickMs));
  }
  sup_->pump(timeout, ctl_->fd());
  if (std::string err = ctl_->read_events(); !err.empty()) return err;
  spec::DaemonMsg m;
  while (ctl_->next_event(m)) {
    if (std::string err = handle(m); !err.empty()) return err;
  }
  if (sup_->tree_finished() && !finish_sent_) {
    if (std::string err = on_tree_end(); !err.empty()) return err;
  }
  if (!dumped_ && sup_->tree_running() && now_us() >= memory_probed_us_ + kMemoryProbeUs) {
    memory_probed_us_ = now_us();
    policy_.on_tree_memory(sup_->tree_memory_bytes());
  }
  return consult_policy();
}

std::string RunDriver::handle(const spec::DaemonMsg& m) {
  if (const auto* w = std::get_if<spec::Waits>(&m)) {
    policy_.on_waits(now_us(), w->waited_us, w->hideable_us);
    stats_.waited_us += w->waited_us;
    return "";
  }
  if (const auto* a = std::get_if<spec::Advice>(&m)) {
    if (a->kind == spec::AdviceKind::kPredictionCap) ++stats_.cap_advices;
    // Advice about an epoch that is no longer open (it raced with a seal) is moot; a full pipeline is already
    // known from the sealed epochs.
    if (a->kind != spec::AdviceKind::kPipelineFull && speculative_ && a->epoch == open_) policy_.on_advice(a->kind == spec::AdviceKind::kHideTarget);
    return "";
  }
  if (const auto* c = std::get_if<spec::Committed>(&m)) return on_committed(c->epoch);
  if (const auto* d = std::get_if<spec::Doomed>(&m)) return on_doomed(d->epoch);
  if (const auto* f = std::get_if<spec::Failed>(&m)) return on_failed(*f);
  return "unexpected message " + std::to_string(static_cast<int>(spec::control_type(m))) + " from the daemon";
}

std::string RunDriver::on_committed(std::uint64_t epoch) {
  bool known = false;
  for (std::uint64_t e : sealed_) known = known || e == epoch;
  if (!known) return "the daemon committed epoch " + std::to_string(epoch) + ", which is not a sealed, uncommitted one";
  while (!sealed_.empty() && sealed_.front() <= epoch) {
    const std::uint64_t e = sealed_.front();
    sealed_.pop_front();
    began_us_.erase(e);
    policy_.on_committed(now_us());
    ++stats_.epochs_committed;
    trace("commit %llu", static_cast<unsigned long long>(e));
  }
  sup_->commit_through(epoch);
  return "";
}

std::string RunDriver::on_doomed(std::uint64_t epoch) {
  bool known = speculative_ && epoch == open_;
  for (std::uint64_t e : sealed_) known = known || e == epoch;
  if (!known) return "the daemon doomed epoch " + std::to_string(epoch) + ", which is not an uncommitted one";
  // The work after it is wasted: stop it now, and restore when FAILED says from where.
  trace("doomed %llu", static_cast<unsigned long long>(epoch));
  doomed_ = true;
  sup_->kill_tree();
  return "";
}

std::string RunDriver::on_failed(const spec::Failed& f) {
  const bool oldest = sealed_.empty() ? speculative_ && f.epoch == open_ : f.epoch == sealed_.front();
  if (!oldest)
    return "the daemon failed epoch " + std::to_string(f.epoch) + ", which is not the oldest uncommitted one";
  trace("failed %llu cause=%d", static_cast<unsigned long long>(f.epoch), static_cast<int>(f.cause));
  LOG_INFO("run", "epoch %llu failed (cause %d): %s", static_cast<unsigned long long>(f.epoch),
           static_cast<int>(f.cause), f.detail.c_str());
  return rollback(f);
}

// size: the rollback as §8.8 orders it, with both protocol steps inside the supervisor's hooks.
std::string RunDriver::rollback(const spec::Failed& f) {
  const std::uint64_t now = now_us();
  const std::uint64_t discarded = now - began_us_.at(f.epoch);
  const bool open_discarded = speculative_;
  const bool next_speculative = policy_.speculate_after_failure(now);
  say(policy_.reason());
  std::uint64_t rerun = 0;
  RollbackHooks hooks;
  hooks.before_restore = [&](EpochId& out) -> std::string {
    spec::DaemonMsg reply;
    if (std::string err = ctl_->call(spec::Rollback{f.epoch}, ControlType::kReadyForRestore, reply); !err.empty())
      return err;
    out = rerun = std::get<spec::ReadyForRestore>(reply).epoch;
    if (rerun < next_unused_) return "the daemon named re-run epoch " + std::to_string(rerun) + ", already used";
    return "";
  };
  hooks.pre_resume = [&](std::uint64_t pidns, std::uint64_t restore_us) -> std::string {
    if (pidns == 0) return "the restored tree has no pid namespace";
    spec::DaemonMsg reply;
    const spec::Restored restored{pidns, next_speculative ? Next::kSpeculative : Next::kNotSpeculative,
                                  to_ms(restore_us)};
    if (std::string err = ctl_->call(restored, ControlType::kWindowClosed, reply); !err.empty()) return err;
    if (std::get<spec::WindowClosed>(reply).epoch != rerun) return "the daemon closed the window for another epoch";
    return "";
  };
  RestoreCost cost;
  if (std::string err = sup_->rollback(f.epoch, next_speculative, hooks, cost); !err.empty())
    return "rollback of epoch " + std::to_string(f.epoch) + " failed: " + err;
  stats_.epochs_discarded += sealed_.size() + (open_discarded ? 1 : 0);
  sealed_.clear();
  began_us_.clear();
  open_ = rerun;
  next_unused_ = rerun + 1;
  speculative_ = next_speculative;
  open_since_us_ = now_us();
  if (speculative_) began_us_[open_] = open_since_us_;
  finish_sent_ = false;
  doomed_ = false;
  policy_.on_rollback(now_us(), cost.total_us, discarded, open_discarded);
  switch_mode(speculative_ ? Mode::kSpeculating : Mode::kAfterRollback);
  stats_.rollbacks.push_back({f.epoch, rerun, static_cast<std::uint8_t>(f.cause), f.detail, cost.total_us,
                              cost.kill_reap_us, cost.tmp_us, cost.restore_us, discarded, next_speculative});
  trace("rollback %llu rerun %llu speculative=%d restore_us=%llu", static_cast<unsigned long long>(f.epoch),
        static_cast<unsigned long long>(rerun), speculative_ ? 1 : 0, static_cast<unsigned long long>(cost.total_us));
  return "";
}

std::string RunDriver::consult_policy() {
  const PolicyAction action = policy_.decide(view());
  say(policy_.reason());
  switch (action) {
    case PolicyAction::kNone: return "";
    case PolicyAction::kStart:
    case PolicyAction::kCheckpoint:
      // A dump that failed, or that the daemon declined, is tried again only after a while.
      if (now_us() < retry_checkpoint_us_) return "";
      return take_checkpoint();
    case PolicyAction::kStop: return seal_without_dump();
  }
  return "";
}

// size: PREPARE, the dump with SEAL inside it, and the bookkeeping of a new epoch belong in one place.
std::string RunDriver::take_checkpoint() {
  const std::uint64_t k = open_;
  const std::uint64_t next = k + 1;
  BFT_ASSERT(next == next_unused_);
  spec::DaemonMsg reply;
  const spec::Prepare prepare{k, Next::kSpeculative,
                              static_cast<std::uint32_t>(std::min<std::uint64_t>(policy_.hide_target_us(), ~0u))};
  if (std::string err = ctl_->call(prepare, ControlType::kPrepared, reply); !err.empty()) return err;
  if (const auto& p = std::get<spec::Prepared>(reply); !p.ok) {
    say("checkpoint declined by the daemon: " + p.reason);
    retry_checkpoint_us_ = now_us() + kRetryCheckpointUs;
    return "";
  }
  spec::Sealed sealed;
  auto seal = [&](const DumpFacts& facts) -> std::string {
    const spec::Seal s{k, Next::kSpeculative, to_ms(facts.dump_us), to_ms(facts.frozen_us),
                       static_cast<std::uint32_t>(std::min<std::uint64_t>(facts.image_bytes >> 10, ~0u))};
    spec::DaemonMsg answer;
    if (std::string err = ctl_->call(s, ControlType::kSealed, answer); !err.empty()) return err;
    sealed = std::get<spec::Sealed>(answer);
    if (sealed.epoch != k) return "the daemon sealed epoch " + std::to_string(sealed.epoch) + " instead";
    return "";
  };
  CheckpointCost cost;
  if (std::string err = sup_->checkpoint(next, seal, cost); !err.empty()) {
    if (!ctl_->broken().empty()) return ctl_->broken();
    ++stats_.checkpoint_failures;
    say("checkpoint failed: " + err);
    retry_checkpoint_us_ = now_us() + kRetryCheckpointUs;
    return ctl_->send(spec::Abort{k});
  }
  const std::uint64_t now = now_us();
  const bool closed_speculative = speculative_;
  if (speculative_) {
    sealed_.push_back(k);
    policy_.on_sealed(now - open_since_us_, sealed.hidden_us);
  }
  stats_.entries += sealed.entries;
  stats_.one_reply += sealed.one_reply;
  stats_.hidden_us += sealed.hidden_us;
  stats_.log_bytes += sealed.log_bytes;
  open_ = next;
  next_unused_ = next + 1;
  speculative_ = true;
  open_since_us_ = now;
  began_us_[next] = now;
  dumped_ = true;
  last_image_bytes_ = cost.image_bytes;
  policy_.on_checkpoint(now, cost.wall_us, closed_speculative);
  switch_mode(Mode::kSpeculating);
  stats_.checkpoints.push_back({next, cost.wall_us, cost.frozen_us, cost.freezing_us, cost.frozen_work_us,
                                cost.seal_us, cost.image_bytes});
  trace("checkpoint %llu seals %llu dump_us=%llu frozen_us=%llu image_bytes=%llu", static_cast<unsigned long long>(next),
        static_cast<unsigned long long>(k), static_cast<unsigned long long>(cost.wall_us),
        static_cast<unsigned long long>(cost.frozen_us), static_cast<unsigned long long>(cost.image_bytes));
  return "";
}

std::string RunDriver::seal_without_dump() {
  BFT_ASSERT(speculative_);
  const std::uint64_t k = open_;
  spec::DaemonMsg reply;
  if (std::string err = ctl_->call(spec::Seal{k, Next::kNotSpeculative, 0, 0, 0}, ControlType::kSealed, reply);
      !err.empty())
    return err;
  const auto& sealed = std::get<spec::Sealed>(reply);
  if (sealed.epoch != k) return "the daemon sealed epoch " + std::to_string(sealed.epoch) + " instead";
  stats_.entries += sealed.entries;
  stats_.one_reply += sealed.one_reply;
  stats_.hidden_us += sealed.hidden_us;
  stats_.log_bytes += sealed.log_bytes;
  sealed_.push_back(k);
  policy_.on_sealed(now_us() - open_since_us_, sealed.hidden_us);
  open_ = k + 1;
  next_unused_ = k + 2;
  speculative_ = false;
  open_since_us_ = now_us();
  switch_mode(sup_->outside_input_pending() ? Mode::kInput : Mode::kPolicyOff);
  trace("seal %llu nodump", static_cast<unsigned long long>(k));
  return "";
}

std::string RunDriver::on_tree_end() {
  const int code = sup_->exit_code();
  // The init reports a command killed by signal N as 128 + N, like a shell: FINISH carries that exit code.
  if (std::string err = ctl_->send(spec::Finish{spec::FinishHow::kExit, static_cast<std::uint32_t>(code)});
      !err.empty())
    return err;
  finish_sent_ = true;
  if (speculative_) {
    // FINISH sealed the open epoch: the exit status waits for it.
    sealed_.push_back(open_);
    policy_.on_sealed(now_us() - open_since_us_, 0);
    open_ += 1;
    next_unused_ = open_ + 1;
    speculative_ = false;
  }
  trace("finish %d", code);
  return "";
}

std::string RunDriver::end_run() {
  spec::DaemonMsg reply;
  if (std::string err = ctl_->call(spec::StatsQuery{}, ControlType::kStatsReply, reply); !err.empty()) return err;
  stats_.daemon_text = std::get<spec::StatsReply>(reply).text;
  if (std::string err = ctl_->call(spec::Detach{}, ControlType::kDetached, reply); !err.empty()) return err;
  return "";
}

void RunDriver::collect_stats() {
  switch_mode(mode_);
  stats_.run_us = now_us() - start_us_;
  stats_.exit_code = sup_->exit_code();
  const Supervisor::Stats& s = sup_->stats();
  stats_.checkpoint_failures += s.checkpoint_failures;
  stats_.output_bytes_released = s.output_bytes_released;
  stats_.output_bytes_dropped = s.output_bytes_dropped;
  stats_.output_bytes_held_max = s.output_bytes_held_max;
  stats_.output_hold_us_max = s.output_hold_us_max;
  stats_.stdin_bytes_replayed = s.stdin_bytes_replayed;
  stats_.signals_forwarded = s.signals_forwarded;
  stats_.keystroke_bytes_forwarded = s.keystroke_bytes_forwarded;
  stats_.backoffs = policy_.backoffs();
}

int RunDriver::run() {
  if (std::string err = open_outputs(); !err.empty()) return fail(err);
  int connect_errno = 0;
  if (std::string err = ControlClient::connect(options_.control_socket, ctl_, &connect_errno); !err.empty()) {
    // No socket, or nobody listening on it: a daemon that does not speak the control protocol.
    if (connect_errno == ENOENT || connect_errno == ECONNREFUSED)
      return run_without_daemon("the mount's daemon does not serve bftfs run (" + err + ")");
    return fail(err);
  }
  if (options_.policy.speculate && !options_.criu_missing.empty()) return fail(options_.criu_missing);
  if (std::string err = start(); !err.empty()) return fail(err);
  while (!done()) {
    if (std::string err = step(); !err.empty()) return fail(err);
  }
  if (std::string err = end_run(); !err.empty()) return fail(err);
  return report();
}

int RunDriver::report() {
  collect_stats();
  trace("exit %d", stats_.exit_code);
  if (options_.stats) std::fputs(format_stats_text(stats_).c_str(), stderr);
  if (stats_json_ != nullptr) std::fputs(format_stats_json(stats_).c_str(), stats_json_);
  return stats_.exit_code;
}

}  // namespace

int run_speculatively(const RunOptions& options) {
  RunDriver driver(options);
  return driver.run();
}

}  // namespace bftfs::criu
