// SpecBackend's epochs (client/spec_backend.h): seals into batches, verdicts taken in epoch order, the rollback of
// failed epochs and the restore window, the stream's start and close, and what --stats shows
// (docs/SPECULATION.md §6.7, §6.8, §8.4, §8.8, §9).
#include <algorithm>
#include <sstream>
#include <utility>

#include "client/spec_backend.h"
#include "client/spec_core.h"
#include "common/assert.h"

namespace bftfs::client {

namespace {

// FAILED's cause and detail for a batch that did not apply.
spec::Failed failure_of(const SpecBackend::Core::Sealed& s) {
  spec::Failed out;
  out.epoch = s.stretch;
  if (!s.verdict) {
    out.cause = spec::FailCause::kEntry;
    out.detail = "the batch did not execute: " + (s.refused.empty() ? std::string("no EPOCH result") : s.refused);
    return out;
  }
  switch (s.verdict->verdict) {
    case fs::EpochVerdict::kChain:
      out.cause = spec::FailCause::kChain;
      out.detail = "the stream's last applied epoch is " + std::to_string(s.verdict->last_before);
      break;
    case fs::EpochVerdict::kStaging:
      out.cause = spec::FailCause::kStaging;
      out.detail = "the staged parts were not all there";
      break;
    default:
      out.cause = spec::FailCause::kEntry;
      out.detail = "entry " + std::to_string(s.verdict->entry) + " of " + std::to_string(s.entries) +
                   " gave another result at the replicas (outcome " +
                   std::to_string(static_cast<unsigned>(s.verdict->entry_outcome)) + ", errno " +
                   std::to_string(s.verdict->entry_err) + ")";
      break;
  }
  return out;
}

}  // namespace

void SpecBackend::Core::seal_locked(bool internal) {
  const std::uint64_t entries = log.open_entries();
  spec::SealedEpoch s = log.seal();
  Sealed rec;
  rec.stretch = stretch;
  rec.epoch = s.epoch;
  rec.entries = entries;
  rec.internal = internal;
  sealed.push_back(std::move(rec));
  ++stats.sealed;
  auto self = shared_from_this();
  const std::uint64_t epoch = s.epoch;
  send_stream_locked(std::move(s.request), [self, epoch](const Final& f) { self->epoch_final(epoch, f); });
}

void SpecBackend::Core::epoch_final(std::uint64_t epoch, const Final& f) {
  std::vector<spec::DaemonMsg> out;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = std::find_if(sealed.begin(), sealed.end(), [&](const Sealed& s) { return s.epoch == epoch; });
    if (it == sealed.end()) return;  // discarded by a rollback: its fate no longer matters
    it->final = true;
    it->verdict = stream_result(f, fs::OpCode::kEpoch);
    if (!it->verdict) it->refused = f.status == FinalStatus::kRefused ? f.reason : "no EPOCH result";
    out = verdicts_locked();
    cv.notify_all();
  }
  emit(std::move(out));
  answer_refused();
}

void SpecBackend::Core::answer_refused() {
  std::deque<Plain> queued;
  {
    std::lock_guard<std::mutex> lock(mu);
    queued.swap(refused_plain);
  }
  for (Plain& p : queued) p.callbacks.on_final(refused("an earlier epoch failed: the tree is rolled back"));
}

// An epoch's verdict means something only once every epoch before it committed (§6.8). A CHAIN verdict whose
// last_before descends from the epoch says an earlier execution of the same batch applied (a resubmission).
std::vector<spec::DaemonMsg> SpecBackend::Core::verdicts_locked() {
  std::vector<spec::DaemonMsg> out;
  while (!sealed.empty() && sealed.front().final) {
    const Sealed& s = sealed.front();
    const bool applied = s.verdict && (s.verdict->verdict == fs::EpochVerdict::kApplied ||
                                       (s.verdict->verdict == fs::EpochVerdict::kChain &&
                                        log.descends_from(s.verdict->last_before, s.epoch)));
    if (!applied) {
      if (!failure_reported) {
        failure_reported = true;
        for (Plain& p : plain_queue) refused_plain.push_back(std::move(p));
        plain_queue.clear();
        ++stats.failed;
        if (s.internal) {
          out.push_back(spec::Fatal{"the restore's own changes did not apply: " + failure_of(s).detail});
        } else {
          out.push_back(failure_of(s));
        }
      }
      break;
    }
    log.committed(s.epoch);
    model.commit_through(s.epoch);
    creates_by_epoch.erase(creates_by_epoch.begin(), creates_by_epoch.upper_bound(s.epoch));
    ++stats.committed;
    if (!s.internal) out.push_back(spec::Committed{s.stretch});
    sealed.pop_front();
  }
  if (sealed.empty()) flush_plain_locked();
  return out;
}

void SpecBackend::Core::flush_plain_locked() {
  while (!plain_queue.empty()) {
    Plain p = std::move(plain_queue.front());
    plain_queue.pop_front();
    send_plain_locked(std::move(p));
  }
}

// ---- SpecBackend: the run's life ----

std::string SpecBackend::start() {
  Core& c = *core_;
  std::unique_lock<std::mutex> lk(c.mu);
  c.ensure_pool_locked();
  c.cv.wait(lk, [&] { return c.closed.load() || !c.reserving; });
  if (!c.reserve_error.empty()) return "RESERVE of the stream's inode numbers: " + c.reserve_error;
  return c.reserved > 0 ? "" : "the run ended";
}

void SpecBackend::prepare(const spec::Prepare& p) {
  Core& c = *core_;
  std::unique_lock<std::mutex> lk(c.mu);
  c.hide_target_us = p.hide_target_us;
  c.cv.wait(lk, [&] { return c.closed.load() || (c.plain_queue.empty() && c.plain_tags.empty()); });
  c.dumping = true;
  c.cv.notify_all();
}

std::optional<spec::Sealed> SpecBackend::seal(const spec::Seal& s) {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (s.epoch != c.stretch || c.window) return std::nullopt;
  c.dumping = false;
  spec::Sealed reply{s.epoch, c.open.entries, c.open.one_reply, c.open.hidden_us,
                     static_cast<std::uint64_t>(c.log.open_bytes())};
  const bool was_speculative = c.speculative;
  if (c.speculative) c.seal_locked(false);
  c.stretch = s.epoch + 1;
  c.max_used = std::max(c.max_used, c.stretch);
  c.speculative = s.next == spec::Next::kSpeculative;
  // Non-speculative requests changed the replicas behind the model's back: it starts empty (§6.10).
  if (c.speculative && !was_speculative && c.plain_since_spec) {
    c.drop_clean_locked();
    c.plain_since_spec = false;
  }
  c.consensus_only = false;
  c.open = Core::Open{};
  c.cv.notify_all();
  return reply;
}

void SpecBackend::set_model_bytes(std::uint64_t bytes) {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.model.set_memory_bound(bytes);
}

void SpecBackend::abort() {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.dumping = false;
}

void SpecBackend::finish() {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.speculative) return;
  c.seal_locked(false);
  c.stretch += 1;
  c.max_used = std::max(c.max_used, c.stretch);
  c.speculative = false;
  c.open = Core::Open{};
  c.cv.notify_all();
}

std::optional<spec::ReadyForRestore> SpecBackend::rollback(const spec::Rollback& r) {
  Core& c = *core_;
  std::deque<Core::Plain> dropped;
  std::uint64_t rerun = 0;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (!c.failure_reported || c.sealed.empty() || c.sealed.front().stretch != r.epoch) return std::nullopt;
    const std::uint64_t failed = c.sealed.front().epoch;
    c.sealed.clear();
    c.failure_reported = false;
    c.log.failed(failed);
    c.model.rollback_to(c.log.last_committed());
    for (auto it = c.creates_by_epoch.lower_bound(failed); it != c.creates_by_epoch.end();) {
      c.creates -= it->second;
      it = c.creates_by_epoch.erase(it);
    }
    // The clean facts go now, before the restore window: the lie that failed the epoch is among them (a first
    // reply's facts stay in the store), and CRIU's requests in the window would be answered from it again.
    c.drop_clean_locked();
    dropped = std::move(c.plain_queue);
    c.plain_queue.clear();
    ++c.generation;
    c.window = true;
    c.speculative = false;
    c.consensus_only = true;
    c.stretch = ++c.max_used;
    c.open = Core::Open{};
    rerun = c.stretch;
    c.cv.notify_all();
  }
  // Requests the killed tree made after a seal without a dump: never sent, and nobody waits for them any more.
  for (Core::Plain& p : dropped) p.callbacks.on_final(refused("rolled back"));
  return spec::ReadyForRestore{rerun};
}

spec::WindowClosed SpecBackend::restored(const spec::Restored& r) {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  c.window = false;
  c.speculative = r.next == spec::Next::kSpeculative;
  c.open = Core::Open{};
  // What the restore itself changed (CRIU recreating an open-unlinked file) must apply before anything the
  // re-run sends non-speculatively.
  if (!c.speculative && c.log.open_entries() > 0) c.seal_locked(true);
  c.cv.notify_all();
  return spec::WindowClosed{c.stretch};
}

bool SpecBackend::all_committed() const {
  const Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.sealed.empty() && c.plain_queue.empty() && c.plain_tags.empty();
}

std::optional<spec::Waits> SpecBackend::take_waits() {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.speculative || c.window) return std::nullopt;
  spec::Waits w{c.waited_us, c.hideable_us, c.waited_requests};
  c.waited_us = c.hideable_us = 0;
  c.waited_requests = 0;
  return w;
}

bool SpecBackend::speculative() const {
  const Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  return c.speculative || c.window;
}

std::string SpecBackend::close_stream() {
  fs::Request r{{spec::stream_op(fs::OpCode::kStreamClose, core_->opt.stream)}};
  const Final f = call_and_wait(core_->relay, r, false);
  if (f.status == FinalStatus::kRefused) return "STREAM_CLOSE refused: " + f.reason;
  if (f.result.outcome != fs::Outcome::kDone) return "STREAM_CLOSE failed";
  return "";
}

std::string SpecBackend::stats_text() const {
  const Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  const Core::Stats& s = c.stats;
  std::ostringstream o;
  o << "model        " << s.entries << " entries answered, " << s.plain << " requests sent without speculating\n"
    << "fetches      " << s.fetches << " (1-reply " << s.first_used << ", first replies found wrong " << s.first_wrong
    << ", inconsistent facts " << s.inconsistent << ")\n"
    << "batches      " << s.sealed << " sealed, " << s.committed << " applied, " << s.failed << " failed; " << s.stages
    << " staged parts, " << s.reserves << " reserves\n"
    << "latency      " << s.hidden_us / 1000 << " ms hidden by the model; smoothed ordered "
    << static_cast<std::uint64_t>(c.ordered_us / 1000) << " ms, read-only " << static_cast<std::uint64_t>(c.read_only_us / 1000)
    << " ms\n";
  return o.str();
}

void SpecBackend::close() {
  Core& c = *core_;
  std::deque<Core::Plain> dropped;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.closed.load()) return;
    c.closed.store(true);
    c.events = nullptr;
    dropped = std::move(c.plain_queue);
    c.plain_queue.clear();
    c.cv.notify_all();
  }
  for (Core::Plain& p : dropped) p.callbacks.on_final(refused("the run ended"));
}

}  // namespace bftfs::client
