#include "criu-hooks/policy.h"

#include <algorithm>
#include <cstdio>

#include "common/assert.h"

namespace bftfs::criu {
namespace {

constexpr std::uint64_t kWaitsPeriodUs = 100'000;  // the daemon sends WAITS every 100 ms
constexpr std::uint64_t kFirstDumpBaseUs = 15'000;
constexpr std::uint64_t kFirstDumpPerMibUs = 1'000;
// Speculation pays when an epoch of T_max hides at least this many checkpoints' cost (policy.h says why).
constexpr double kPaysFactor = 3.0;

std::string ms(std::uint64_t us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(us) / 1000.0);
  return buf;
}

}  // namespace

Policy::Policy(PolicyOptions options) : options_(options) {
  BFT_ASSERT(options_.checkpoint_share > 0.0);
  BFT_ASSERT(options_.max_epoch_us > 0);
  BFT_ASSERT(options_.max_uncommitted >= 1);
  BFT_ASSERT(options_.backoff_min_us <= options_.backoff_max_us);
  BFT_ASSERT(options_.judged_epochs >= 1);
}

void Policy::on_waits(std::uint64_t now_us, std::uint64_t, std::uint64_t hideable_us) {
  waits_.push_back({now_us, hideable_us});
  while (!waits_.empty() && waits_.front().at_us + options_.waits_window_us < now_us) waits_.pop_front();
}

void Policy::on_tree_memory(std::uint64_t bytes) { memory_bytes_ = bytes; }

void Policy::on_checkpoint(std::uint64_t, std::uint64_t dump_us, bool closed_speculative) {
  if (closed_speculative) {
    dump_us_smoothed_ = dump_us_smoothed_ == 0 ? dump_us : (3 * dump_us_smoothed_ + dump_us) / 4;
  }
  last_dump_us_ = dump_us;
  advised_ = advised_hide_ = false;
}

void Policy::on_sealed(std::uint64_t duration_us, std::uint64_t hidden_us) {
  pending_.push_back({hidden_us, last_dump_us_});
  recent_.push_back({duration_us, hidden_us});
  while (recent_.size() > options_.judged_epochs) recent_.pop_front();
  last_dump_us_ = 0;
  advised_ = advised_hide_ = false;
}

void Policy::on_advice(bool hide_target) { (hide_target ? advised_hide_ : advised_) = true; }

void Policy::on_committed(std::uint64_t now_us) {
  failures_in_a_row_ = 0;
  if (pending_.empty()) return;  // sealed before the policy saw it (the run's first moments): nothing to judge
  judged_.push_back(pending_.front());
  pending_.pop_front();
  judge(now_us);
}

void Policy::on_rollback(std::uint64_t now_us, std::uint64_t restore_us, std::uint64_t discarded_us,
                         bool open_discarded) {
  Judged lost{0, restore_us + discarded_us + (open_discarded ? last_dump_us_ : 0)};
  for (const Judged& j : pending_) lost.cost_us += j.cost_us;
  pending_.clear();
  judged_.push_back(lost);
  // The re-run starts from the failed epoch's checkpoint: no new dump begins it.
  last_dump_us_ = 0;
  advised_ = advised_hide_ = false;
  judge(now_us);
}

void Policy::judge(std::uint64_t now_us) {
  while (judged_.size() > options_.judged_epochs) judged_.pop_front();
  if (judged_.size() < options_.judged_epochs) return;
  std::uint64_t hidden = 0;
  std::uint64_t cost = 0;
  for (const Judged& j : judged_) {
    hidden += j.hidden_us;
    cost += j.cost_us;
  }
  if (hidden >= cost) {
    backoff_us_ = 0;  // speculation pays: a later backoff starts short again
    return;
  }
  judged_.clear();
  back_off(now_us, "the last " + std::to_string(options_.judged_epochs) + " epochs hid " + ms(hidden) +
                       " but cost " + ms(cost) + " in checkpoints and rollbacks");
}

void Policy::back_off(std::uint64_t now_us, const std::string& why) {
  backoff_us_ = backoff_us_ == 0 ? options_.backoff_min_us : std::min(2 * backoff_us_, options_.backoff_max_us);
  backoff_until_us_ = now_us + backoff_us_;
  backoff_requested_ = true;
  ++backoffs_;
  reason_ = "speculation off for " + ms(backoff_us_) + ": " + why;
}

bool Policy::speculate_after_failure(std::uint64_t now_us) {
  ++failures_in_a_row_;
  if (failures_in_a_row_ < 2) return true;
  failures_in_a_row_ = 0;
  back_off(now_us, "two failed epochs in a row");
  backoff_requested_ = false;  // the restore itself runs on without speculation
  return false;
}

std::uint64_t Policy::checkpoint_cost_us() const {
  if (dump_us_smoothed_ != 0) return dump_us_smoothed_;
  return kFirstDumpBaseUs + (memory_bytes_ >> 20) * kFirstDumpPerMibUs;
}

std::uint64_t Policy::hide_target_us() const {
  return static_cast<std::uint64_t>(static_cast<double>(checkpoint_cost_us()) / options_.checkpoint_share);
}

std::uint64_t Policy::hideable_per_s(std::uint64_t now_us) const {
  std::uint64_t sum = 0;
  std::uint64_t oldest = now_us;
  for (const Waited& w : waits_) {
    if (w.at_us + options_.waits_window_us < now_us) continue;
    sum += w.hideable_us;
    oldest = std::min(oldest, w.at_us);
  }
  const std::uint64_t span = std::min(options_.waits_window_us, now_us - oldest + kWaitsPeriodUs);
  return static_cast<std::uint64_t>(static_cast<double>(sum) * 1e6 / static_cast<double>(span));
}

std::uint64_t Policy::pays_target_us() const {
  return static_cast<std::uint64_t>(static_cast<double>(checkpoint_cost_us()) * kPaysFactor);
}

bool Policy::pays(std::uint64_t per_s) const {
  const double hidden_per_epoch = static_cast<double>(per_s) * static_cast<double>(options_.max_epoch_us) / 1e6;
  return hidden_per_epoch >= static_cast<double>(pays_target_us());
}

std::string Policy::numbers(std::uint64_t per_s) const {
  const auto per_epoch =
      static_cast<std::uint64_t>(static_cast<double>(per_s) * static_cast<double>(options_.max_epoch_us) / 1e6);
  char factor[16];
  std::snprintf(factor, sizeof factor, "%.0f", kPaysFactor);
  return ms(per_s) + "/s hidden x " + ms(options_.max_epoch_us) + " = " + ms(per_epoch) + " per epoch, against " +
         ms(checkpoint_cost_us()) + " per checkpoint x " + factor + " = " + ms(pays_target_us());
}

PolicyAction Policy::decide(const PolicyView& view) {
  if (!options_.speculate) {
    reason_ = "not speculating: --no-speculate";
    return view.speculating ? PolicyAction::kStop : PolicyAction::kNone;
  }
  return view.speculating ? decide_speculating(view) : decide_not_speculating(view);
}

PolicyAction Policy::decide_speculating(const PolicyView& view) {
  if (view.input_pending) {
    reason_ = "pausing speculation: input waits to be forwarded";
    return PolicyAction::kStop;
  }
  if (backoff_requested_) {
    backoff_requested_ = false;
    return PolicyAction::kStop;
  }
  if (!view.tree_running) return PolicyAction::kNone;
  const std::uint64_t age = view.now_us - std::min(view.now_us, view.open_since_us);
  const bool paid = advised_hide_ && age >= std::min(hide_target_us(), options_.max_epoch_us);
  const bool due = advised_ || paid || age >= options_.max_epoch_us;
  if (!due) return PolicyAction::kNone;
  if (view.sealed_uncommitted >= options_.max_uncommitted) {
    reason_ = "checkpoint waits: " + std::to_string(view.sealed_uncommitted) + " sealed epochs uncommitted";
    return PolicyAction::kNone;
  }
  if (view.images_full) {
    reason_ = "checkpoint waits: the images budget is full";
    return PolicyAction::kNone;
  }
  std::uint64_t hidden = 0;
  std::uint64_t duration = 0;
  for (const Ran& r : recent_) {
    hidden += r.hidden_us;
    duration += r.duration_us;
  }
  if (duration > 0) {
    const auto per_s = static_cast<std::uint64_t>(static_cast<double>(hidden) * 1e6 / static_cast<double>(duration));
    if (!pays(per_s)) {
      back_off(view.now_us, "epochs do not pay: " + numbers(per_s));
      backoff_requested_ = false;
      return PolicyAction::kStop;
    }
  }
  reason_ = advised_ ? "checkpoint: the daemon advised it"
            : paid   ? "checkpoint: the epoch hid " + ms(hide_target_us()) + " and ran as long"
                     : "checkpoint: the epoch is " + ms(options_.max_epoch_us) + " old";
  return PolicyAction::kCheckpoint;
}

PolicyAction Policy::decide_not_speculating(const PolicyView& view) {
  if (!view.tree_running) return PolicyAction::kNone;
  if (view.now_us < backoff_until_us_) return PolicyAction::kNone;  // reason_ still says why
  if (view.input_pending) {
    reason_ = "not speculating: input waits to be forwarded";
    return PolicyAction::kNone;
  }
  if (view.sealed_uncommitted >= options_.max_uncommitted || view.images_full) return PolicyAction::kNone;
  if (waits_.empty()) {
    reason_ = "not speculating: no measurement of the latency to hide yet";
    return PolicyAction::kNone;
  }
  const std::uint64_t per_s = hideable_per_s(view.now_us);
  if (!pays(per_s)) {
    reason_ = "not speculating: " + numbers(per_s);
    return PolicyAction::kNone;
  }
  reason_ = "speculating: " + numbers(per_s);
  return PolicyAction::kStart;
}

}  // namespace bftfs::criu
