// SpecBackend's request path (client/spec_backend.h): a tree request executed on the local model, with FETCHes
// for what the model lacks (docs/SPECULATION.md §6.4, §6.5), or sent as a non-speculative request (§6.10). The
// epochs' side (seals, verdicts, rollback) is client/spec_epochs.cc.
#include "client/spec_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <ctime>
#include <sstream>
#include <utility>

#include "client/spec_core.h"
#include "common/assert.h"
#include "spec/entry_builder.h"

namespace bftfs::client {

namespace {

constexpr std::uint32_t kFirstReplyRounds = 2;   // FETCH rounds of one request that may use a first reply
constexpr std::uint32_t kFetchRoundsMax = 16;    // then the request fails with EIO (the relay keeps refusing)
constexpr std::size_t kComparedMax = 1000;       // first replies the cap's lie rate is measured over (§6.5)
constexpr std::uint32_t kCapMax = 64;
constexpr std::uint32_t kCapAdviseMin = 8;      // ADVICE(cap) only for a cap of at least this many predictions
constexpr std::size_t kLogWaitFactor = 2;        // tree requests wait for a seal past this many times the log bound
constexpr double kSmoothing = 0.1;               // weight of a new latency sample
constexpr std::uint64_t kFutureSlackNs = 1'000'000'000;  // seen times further ahead of the clock are ignored
constexpr auto kClosedPoll = std::chrono::milliseconds(100);
constexpr auto kRecentWindow = std::chrono::seconds(1);  // the mount's attribute and name cache timeout

std::uint64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t us_since(SteadyTime start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
}

bool creates_inode(fs::OpCode code) {
  return code == fs::OpCode::kCreate || code == fs::OpCode::kMkdir || code == fs::OpCode::kSymlink ||
         code == fs::OpCode::kMknod;
}

std::uint64_t creates_of(const fs::Request& r) {
  return static_cast<std::uint64_t>(
      std::count_if(r.ops.begin(), r.ops.end(), [](const fs::Op& op) { return creates_inode(op.code); }));
}

// A request that only writes data: write() never waited for it in a non-speculative run either (write-behind),
// so it hides no latency (§10).
bool write_only(const fs::Request& r) {
  return std::all_of(r.ops.begin(), r.ops.end(), [](const fs::Op& op) { return op.code == fs::OpCode::kWrite; });
}

bool any_shared(const std::vector<fs::ObjectKey>& a, const std::vector<fs::ObjectKey>& b) {
  return std::any_of(a.begin(), a.end(),
                     [&](const fs::ObjectKey& k) { return std::find(b.begin(), b.end(), k) != b.end(); });
}

bool reads_data(const fs::Request& r) {
  return std::any_of(r.ops.begin(), r.ops.end(), [](const fs::Op& op) {
    return op.code == fs::OpCode::kRead || op.code == fs::OpCode::kReaddir || op.code == fs::OpCode::kReaddirPlus ||
           op.code == fs::OpCode::kReadlink;
  });
}

bool usable_fetch(const fs::Result& r) {
  return r.outcome == fs::Outcome::kDone && r.results.size() == 1 && r.results[0].code == fs::OpCode::kFetch &&
         r.results[0].err == 0;
}

}  // namespace

Final refused(std::string why) {
  Final f;
  f.status = FinalStatus::kRefused;
  f.reason = std::move(why);
  return f;
}

std::optional<fs::OpResult> stream_result(const Final& f, fs::OpCode code) {
  if (f.status == FinalStatus::kRefused) return std::nullopt;
  const fs::Result& r = f.result;
  if (r.outcome != fs::Outcome::kDone || r.results.size() != 1 || r.results[0].code != code ||
      r.results[0].err != 0) {
    return std::nullopt;
  }
  return r.results[0];
}

Final call_and_wait(Backend& backend, const fs::Request& request, bool read_only) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Final> fin;
  };
  auto w = std::make_shared<Wait>();
  SubmitOptions so;
  so.read_only = read_only;
  Callbacks cb;
  cb.on_final = [w](Final f) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->fin = std::move(f);
    }
    w->cv.notify_all();
  };
  (void)backend.submit(request, so, std::move(cb));
  std::unique_lock<std::mutex> lock(w->mu);
  w->cv.wait(lock, [&] { return w->fin.has_value(); });
  return std::move(*w->fin);
}

// ---- the engine's helpers (spec_core.h) ----

std::uint64_t SpecBackend::Core::next_time_locked() {
  const std::uint64_t now = realtime_ns();
  std::uint64_t t = std::max(now, last_time_ns + 1);
  if (newest_seen_ns != 0 && newest_seen_ns <= now + kFutureSlackNs) t = std::max(t, newest_seen_ns + 1);
  last_time_ns = t;
  return t;
}

void SpecBackend::Core::note_times_locked(const fs::Result& r) {
  for (const fs::OpResult& op : r.results) {
    if (op.err != 0 || !fs::returns_attr(op.code)) continue;
    newest_seen_ns = std::max({newest_seen_ns, op.attr.mtime_ns, op.attr.ctime_ns});
  }
}

// N_cap = min(64, floor(ln 0.95 / ln(1 - q))), q = (m + 0.1) / (n + 100): an epoch's 1-reply predictions all hold
// with probability at least 95% at the observed lie rate (§6.5).
std::uint32_t SpecBackend::Core::cap_locked() const {
  const double q = (mismatches + 0.1) / (static_cast<double>(compared.size()) + 100.0);
  if (q >= 1.0) return 0;
  const double cap = std::floor(std::log(0.95) / std::log(1.0 - q));
  return static_cast<std::uint32_t>(std::clamp(cap, 0.0, static_cast<double>(kCapMax)));
}

bool SpecBackend::Core::one_reply_allowed_locked() const {
  return speculative && !consensus_only && open.one_reply < cap_locked();
}

void SpecBackend::Core::note_latency_locked(bool read_only, SteadyTime start) {
  const double us = static_cast<double>(us_since(start));
  double& l = read_only ? read_only_us : ordered_us;
  l = l == 0 ? us : (1 - kSmoothing) * l + kSmoothing * us;
}

void SpecBackend::Core::send_stream_locked(fs::Request r, std::function<void(const Final&)> then, bool sample) {
  auto self = shared_from_this();
  const SteadyTime start = std::chrono::steady_clock::now();
  Callbacks cb;
  cb.on_final = [self, start, sample, then = std::move(then)](Final f) {
    if (sample) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->note_latency_locked(false, start);
    }
    if (then) then(f);
  };
  (void)relay.submit(r, SubmitOptions{}, std::move(cb));
}

void SpecBackend::Core::drop_clean_locked() {
  model.drop_clean();
  if (creates >= pool.size()) return;
  fs::OpResult r;
  r.code = fs::OpCode::kReserve;
  r.pool_first = pool_first + creates;
  r.reserved.assign(pool.begin() + static_cast<std::ptrdiff_t>(creates), pool.end());
  model.insert_reserved(r);
}

void SpecBackend::Core::ensure_pool_locked() {
  if (reserving || !reserve_error.empty() || reserved - creates >= opt.pool_low) return;
  reserving = true;
  ++stats.reserves;
  fs::Op op = spec::stream_op(fs::OpCode::kReserve, opt.stream);
  op.reserve = opt.reserve_batch;
  auto self = shared_from_this();
  send_stream_locked(fs::Request{{std::move(op)}}, [self](const Final& f) {
    std::lock_guard<std::mutex> lock(self->mu);
    self->reserving = false;
    if (const std::optional<fs::OpResult> r = stream_result(f, fs::OpCode::kReserve)) {
      self->model.insert_reserved(*r);
      if (self->pool.empty()) self->pool_first = r->pool_first;
      if (r->pool_first == self->pool_first + self->pool.size()) {
        self->pool.insert(self->pool.end(), r->reserved.begin(), r->reserved.end());
      }
      self->reserved += r->reserved.size();
    } else {
      self->reserve_error = f.status == FinalStatus::kRefused ? f.reason : "RESERVE failed";
    }
    self->cv.notify_all();
  }, true);
}

// ---- FETCH ----

namespace {

struct FetchWait {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<fs::Result> first;
  std::optional<Final> fin;
  bool used_first = false;
};

}  // namespace

SpecBackend::Core::Fetched SpecBackend::Core::fetch(fs::Request request, bool first_ok) {
  auto w = std::make_shared<FetchWait>();
  auto self = shared_from_this();
  Callbacks cb;
  if (first_ok) {
    cb.on_first = [w](const fs::Result& r) {
      {
        std::lock_guard<std::mutex> lock(w->mu);
        w->first = r;
      }
      w->cv.notify_all();
    };
  }
  cb.on_final = [w, self](Final f) {
    bool compare = false, differs = false;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      if (w->used_first) {
        compare = true;
        differs = f.status == FinalStatus::kRefused || !(f.result == *w->first);
      }
      w->fin = std::move(f);
    }
    w->cv.notify_all();
    if (compare) self->first_compared(differs);
  };
  SubmitOptions so;
  so.read_only = true;
  so.want_first = first_ok;
  const SteadyTime start = std::chrono::steady_clock::now();
  (void)relay.submit(request, so, std::move(cb));
  Fetched out;
  std::unique_lock<std::mutex> lock(w->mu);
  while (!w->fin && !(w->first && usable_fetch(*w->first))) {
    if (closed.load()) return out;
    w->cv.wait_for(lock, kClosedPoll);
  }
  out.waited_us = us_since(start);
  if (w->fin) {
    out.result = stream_result(*w->fin, fs::OpCode::kFetch);
    std::lock_guard<std::mutex> l2(mu);
    note_latency_locked(true, start);
  } else {
    w->used_first = true;
    out.used_first = true;
    out.result = w->first->results[0];
  }
  return out;
}

void SpecBackend::Core::first_compared(bool differs) {
  std::lock_guard<std::mutex> lock(mu);
  compared.push_back(differs);
  mismatches += differs ? 1 : 0;
  stats.first_wrong += differs ? 1 : 0;
  if (compared.size() > kComparedMax) {
    mismatches -= compared.front() ? 1 : 0;
    compared.pop_front();
  }
}

// ---- a tree request ----

// Executes `request` on the model in the open epoch, fetching what it lacks; answers `cb` with the model's result
// once the entry is logged. Called and returns with `lk` held... except that it unlocks before any callback.
void SpecBackend::Core::run_speculative(std::unique_lock<std::mutex>& lk, const fs::Request& request,
                                        const SubmitOptions& options, Callbacks& cb) {
  const std::uint64_t need = creates_of(request);
  const std::uint64_t gen = generation;
  const bool writes = write_only(request);
  std::uint64_t waited_us = 0;
  std::uint32_t rounds = 0;
  std::vector<fs::ObjectKey> last_missing;
  for (;;) {
    // A wait below must never hold a task of a tree that is about to be killed (failure_reported): the kernel
    // cannot abandon a FUSE request the daemon has read, even for SIGKILL, so the kill would never complete.
    // A write never waits for a seal: the spec session sends the write it holds while holding the lock that the
    // seal's own send of it takes (client/write_merge.cc); the bound is soft, and the advice is out.
    const bool log_full = !dumping && !writes && log.open_entries() >= kLogWaitFactor * opt.log_entries_max;
    const bool must_wait = !window && (log_full || (need > 0 && reserved - creates < need && reserve_error.empty()));
    if (closed.load() || generation != gen || rounds > kFetchRoundsMax || (must_wait && failure_reported)) {
      const bool dead = generation != gen || failure_reported;
      lk.unlock();
      return cb.on_final(refused(dead ? "rolled back" : closed.load() ? "the run ended" : "FETCH keeps failing"));
    }
    if (!speculative && !window) {
      submit_plain_locked(Plain{next_tag++, request, options, std::move(cb)});
      lk.unlock();
      answer_refused();
      return;
    }
    if (!window && log.open_entries() + 1 >= fs::kEntriesMax) {
      // The batch cannot take more (EpochLog's limit): a dump is under way and will seal it, or nothing will.
      lk.unlock();
      return cb.on_final(refused("the epoch's log is full"));
    }
    if (!window && log_full) {
      // Far past the advised bound (§6.11): wait for the seal. Not during a dump, whose freeze could not reach a
      // task held here; the advice went out at 3/4 of the bound, so the supervisor is checkpointing.
      emit_unlocked(lk, advice_locked());
      cv.wait(lk);
      continue;
    }
    if (need > 0 && reserved - creates < need && reserve_error.empty()) {
      ensure_pool_locked();
      cv.wait(lk);
      continue;
    }
    const std::uint64_t epoch = log.open_epoch();
    fs::Request entry = spec::with_time(request, next_time_locked());
    fs::EntryRun run = model.execute(epoch, entry);
    if (run.inconsistent) {
      ++stats.inconsistent;
      drop_clean_locked();
    }
    if (run.complete()) return answer_locked(lk, request, options, std::move(entry), run.result, need, waited_us, cb);
    const bool first_ok = rounds < kFirstReplyRounds && one_reply_allowed_locked();
    // The trace while it brings new facts, then the keys still missing (a trace runs on the replicas' state,
    // which the tree's uncommitted changes have left behind): a key missing twice in a row ends the tracing.
    const bool repeated = any_shared(run.missing, last_missing);
    last_missing = run.missing;
    fs::Request f = spec::fetch_request(opt.stream, entry, run.missing, rounds == 0 && !repeated);
    ++stats.fetches;
    lk.unlock();
    Fetched got = fetch(std::move(f), first_ok);
    lk.lock();
    ++rounds;
    waited_us += got.waited_us;
    if (got.used_first) {
      ++open.one_reply;
      ++stats.first_used;
    }
    if (got.result && generation == gen) model.insert(got.result->facts);
  }
}

void SpecBackend::Core::answer_locked(std::unique_lock<std::mutex>& lk, const fs::Request& request,
                                      const SubmitOptions& options, fs::Request entry, const fs::Result& result,
                                      std::uint64_t need, std::uint64_t waited_us, Callbacks& cb) {
  const std::uint64_t epoch = log.open_epoch();
  if (std::optional<fs::Request> stage = log.append(spec::build_entry(entry, result))) {
    ++stats.stages;
    send_stream_locked(std::move(*stage), nullptr);
  }
  if (result.outcome == fs::Outcome::kDone && need > 0) {
    creates += need;
    creates_by_epoch[epoch] += need;
  }
  ensure_pool_locked();
  note_times_locked(result);
  ++open.entries;
  ++stats.entries;
  if (!write_only(request)) {
    const double estimate = !options.read_only ? ordered_us
                            : reads_data(request) || !recently_read_locked(request) ? read_only_us : 0.0;
    const std::uint64_t hidden = estimate > static_cast<double>(waited_us)
                                     ? static_cast<std::uint64_t>(estimate) - waited_us : 0;
    open.hidden_us += hidden;
    stats.hidden_us += hidden;
  }
  std::vector<spec::DaemonMsg> advice = advice_locked();
  Final fin;
  fin.result = spec::without_time(result);
  lk.unlock();
  emit(std::move(advice));
  cb.on_final(std::move(fin));
}

// A lookup or stat that a non-speculating run would have had answered by the kernel's caches: the same object or
// name read within the mount's cache timeout (1 s). The kernel caches less while the tree speculates (a rollback
// drops its caches; a restore window runs with timeouts 0), and counting such reads as hidden latency would
// overstate what speculation saves.
bool SpecBackend::Core::recently_read_locked(const fs::Request& request) {
  const SteadyTime now = std::chrono::steady_clock::now();
  if (now - recent_pruned > kRecentWindow) {
    std::erase_if(recent_reads, [&](const auto& kv) { return now - kv.second > kRecentWindow; });
    recent_pruned = now;
  }
  bool all_recent = true;
  for (const fs::Op& op : request.ops) {
    std::string key = std::to_string(op.handle.ino) + "/" + op.name;
    auto [it, fresh] = recent_reads.try_emplace(std::move(key), now);
    if (!fresh && now - it->second <= kRecentWindow) continue;
    it->second = now;
    all_recent = false;
  }
  return all_recent;
}

std::vector<spec::DaemonMsg> SpecBackend::Core::advice_locked() {
  std::vector<spec::DaemonMsg> out;
  if (!speculative) return out;
  if (!open.advised_hide && hide_target_us > 0 && open.hidden_us >= hide_target_us) {
    open.advised_hide = true;
    out.push_back(spec::Advice{spec::AdviceKind::kHideTarget, stretch});
  }
  // A new epoch restores the cap's allowance; worth a checkpoint only when that allowance is several predictions
  // (at a few percent of lies the cap is 0 or 1, and the epoch goes on with consensus values instead).
  const std::uint32_t cap = cap_locked();
  if (!open.advised_cap && !consensus_only && cap >= kCapAdviseMin && open.one_reply >= cap) {
    open.advised_cap = true;
    out.push_back(spec::Advice{spec::AdviceKind::kPredictionCap, stretch});
  }
  const bool near_full =
      log.open_entries() * 4 >= opt.log_entries_max * 3 || log.open_bytes() * 4 >= opt.log_bytes_max * 3;
  if (!open.advised_log && near_full) {
    open.advised_log = true;
    out.push_back(spec::Advice{spec::AdviceKind::kLogNearFull, stretch});
  }
  return out;
}

// ---- non-speculative requests (§6.10) ----

void SpecBackend::Core::submit_plain_locked(Plain p) {
  if (failure_reported) {
    refused_plain.push_back(std::move(p));
    return;
  }
  if (!sealed.empty() || !plain_queue.empty()) {
    plain_queue.push_back(std::move(p));
    return;
  }
  send_plain_locked(std::move(p));
}

void SpecBackend::Core::send_plain_locked(Plain p) {
  fs::Request r = spec::with_time(p.request, next_time_locked());
  plain_since_spec = true;
  ++stats.plain;
  auto self = shared_from_this();
  const SteadyTime start = std::chrono::steady_clock::now();
  const bool read_only = p.options.read_only, counts = !write_only(p.request);
  const std::uint64_t tag = p.tag;
  Callbacks cb;
  cb.on_final = [self, tag, start, read_only, counts, user = std::move(p.callbacks.on_final)](Final f) {
    if (f.status != FinalStatus::kRefused && f.result.outcome != fs::Outcome::kMalformed && !f.result.results.empty()) {
      f.result = spec::without_time(f.result);
    }
    self->plain_final(tag, start, read_only, counts, f);
    user(std::move(f));
  };
  SubmitOptions so;
  so.read_only = read_only;
  plain_tags[tag] = relay.submit(r, so, std::move(cb));
}

void SpecBackend::Core::plain_final(std::uint64_t tag, SteadyTime start, bool read_only, bool counts, const Final& f) {
  std::lock_guard<std::mutex> lock(mu);
  plain_tags.erase(tag);
  note_latency_locked(read_only, start);
  if (f.status != FinalStatus::kRefused) note_times_locked(f.result);
  if (counts) {
    const std::uint64_t us = us_since(start);
    waited_us += us;
    hideable_us += us;
    ++waited_requests;
  }
  cv.notify_all();
}

void SpecBackend::Core::emit_unlocked(std::unique_lock<std::mutex>& lk, std::vector<spec::DaemonMsg> msgs) {
  if (msgs.empty()) return;
  lk.unlock();
  emit(std::move(msgs));
  lk.lock();
}

void SpecBackend::Core::emit(std::vector<spec::DaemonMsg> msgs) {
  if (msgs.empty()) return;
  SpecEventSink sink;
  {
    std::lock_guard<std::mutex> lock(mu);
    sink = events;
  }
  if (!sink) return;
  for (spec::DaemonMsg& m : msgs) sink(std::move(m));
}

// ---- SpecBackend ----

SpecBackend::SpecBackend(Backend& relay, SpecBackendOptions options, SpecEventSink events)
    : core_(std::make_shared<Core>(relay, options, std::move(events))) {}

SpecBackend::~SpecBackend() { close(); }

std::uint64_t SpecBackend::submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) {
  BFT_ASSERT(callbacks.on_final != nullptr);
  Core& c = *core_;
  std::unique_lock<std::mutex> lk(c.mu);
  const std::uint64_t tag = c.next_tag++;
  if (c.closed.load()) {
    lk.unlock();
    callbacks.on_final(refused("the run ended"));
    return tag;
  }
  if (!c.speculative && !c.window) {
    c.submit_plain_locked(Core::Plain{tag, request, options, std::move(callbacks)});
    lk.unlock();
    c.answer_refused();
    return tag;
  }
  // Free-space counts are advisory and change with every other client's write: a STATFS is read from the
  // replicas as it is (the read-only optimization), never predicted, logged or checked.
  if (request.ops.size() == 1 && request.ops[0].code == fs::OpCode::kStatfs) {
    lk.unlock();
    SubmitOptions so;
    so.read_only = true;
    (void)c.relay.submit(request, so, std::move(callbacks));
    return tag;
  }
  c.run_speculative(lk, request, options, callbacks);
  return tag;
}

void SpecBackend::cancel(std::uint64_t tag) {
  Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  const auto queued = std::find_if(c.plain_queue.begin(), c.plain_queue.end(),
                                   [&](const Core::Plain& p) { return p.tag == tag; });
  if (queued != c.plain_queue.end()) {
    c.plain_queue.erase(queued);
    return;
  }
  if (const auto it = c.plain_tags.find(tag); it != c.plain_tags.end()) c.relay.cancel(it->second);
}

std::string SpecBackend::describe() const {
  const Core& c = *core_;
  std::lock_guard<std::mutex> lock(c.mu);
  std::ostringstream s;
  s << "spec stream " << c.opt.stream << "\nstretch " << c.stretch << (c.speculative ? " speculative" : " plain")
    << "\nsealed_uncommitted " << c.sealed.size() << "\nplain_queued " << c.plain_queue.size() << "\n";
  return s.str();
}

}  // namespace bftfs::client
