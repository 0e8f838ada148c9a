#include "os/clock.h"
#include "replica/replica_runtime.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/assert.h"
#include "common/crypto.h"
#include "common/log.h"
#include "common/prng.h"
#include "storage/data_dir_lock.h"
#include "storage/file_snapshot_store.h"
#include "runtime/loop_stop.h"
#include "runtime/service_factory.h"
#include "runtime/status_file.h"

namespace bftfs {
namespace {

constexpr std::uint64_t kTickCatchUpMax = 100;
constexpr std::uint32_t kTickTimerPeriods = 5;

timeval ms_to_tv(std::uint32_t ms) {
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

// A pass that produced this many pending items flushes at once instead of waiting for the end of the pass,
// which bounds memory and the delay of the first sends when a flood of input is readable at once.
constexpr std::size_t kPendingFlushThreshold = 4096;
// Records buffered without a send are written once the buffer is this large (bounded memory).
constexpr std::size_t kLazySyncRecordsMax = 1024;
// Groups up to this size are written on the loop instead of the sync thread (start_group).
constexpr std::size_t kInlineGroupBytesMax = 64 * 1024;
// Batch hold (ReplicaOptions::batch_hold): how long the primary waits for the clients it has just answered before
// it sends the next batch without them. The timer is armed after the pass's flush, so it starts when their
// replies have left (behind the log write); a client on the same host or LAN is back within 0.1-0.3 ms, so this
// waits out a returning cohort while a client that stopped costs one such wait. The core's second tick ends a hold too.
constexpr std::uint32_t kBatchHoldUs = 500;

// A data directory holds one service configuration for life: restarted with another service, or with the shim
// switched on or off, a replica would read another configuration's snapshots and log as its own. The first
// start records the configuration (durably, in the snapshot store); later starts must match it.
std::string check_service_identity(SnapshotStore& store, const ReplicaRuntimeOptions& options) {
  const std::string want = "service=" + options.service + " shim=" + (options.shim ? "1" : "0");
  Bytes have;
  if (!store.get("service.id", have)) {
    store.put("service.id", Bytes(want.begin(), want.end()));
    return "";
  }
  const std::string got(have.begin(), have.end());
  if (got == want) return "";
  return "data directory " + options.data_dir + " holds a replica of '" + got + "', not '" + want +
         "': start it with the options it was created with (--service, --shim), or give it a new data directory";
}

// The log's sync thread: writes one Wal::Group at a time (Wal::write_group, the only step that waits for the
// disk) while the event loop goes on, and wakes the loop through an eventfd when the group is durable. The
// loop owns the Wal; this thread touches only the group it was handed.
class SyncThread {
 public:
  explicit SyncThread(Wal& wal) : wal_(wal) {
    wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    BFT_ASSERT(wake_fd_.valid());
    thread_ = std::thread([this] { run(); });
  }
  ~SyncThread() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // a group still queued is written first (run() leaves only when idle)
  }
  SyncThread(const SyncThread&) = delete;
  SyncThread& operator=(const SyncThread&) = delete;

  int fd() const { return wake_fd_.get(); }
  // Hands over the group to write; none may be in flight.
  void start(Wal::Group&& g) {
    {
      std::lock_guard<std::mutex> l(mu_);
      BFT_ASSERT(!job_ && !done_);
      job_ = std::move(g);
    }
    cv_.notify_all();
  }
  // The written group, if the write finished (the loop calls this when fd() is readable).
  std::optional<Wal::Group> take_done() {
    std::uint64_t count = 0;
    while (::read(wake_fd_.get(), &count, sizeof count) < 0 && errno == EINTR) {
    }
    std::lock_guard<std::mutex> l(mu_);
    return std::exchange(done_, std::nullopt);
  }
  // Blocks until the group in flight is written, and returns it (shutdown).
  Wal::Group wait_done() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return done_.has_value(); });
    Wal::Group g = std::move(*done_);
    done_.reset();
    return g;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return stop_ || job_.has_value(); });
      if (!job_) return;  // stop_ and idle
      Wal::Group g = std::move(*job_);
      job_.reset();
      l.unlock();
      wal_.write_group(g);  // aborts the process on an I/O error: nothing waiting on it may be sent
      l.lock();
      done_ = std::move(g);
      cv_.notify_all();
      const std::uint64_t one = 1;
      while (::write(wake_fd_.get(), &one, sizeof one) < 0 && errno == EINTR) {
      }
    }
  }

  Wal& wal_;
  UniqueFd wake_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Wal::Group> job_;
  std::optional<Wal::Group> done_;
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace

struct ReplicaRuntime::Impl {
  ReplicaRuntimeOptions options;
  ClusterConfig config;
  DataDirLock lock;   // released last
  EventBasePtr base;  // destroyed after every event that refers to it
  std::unique_ptr<Crypto> crypto;
  std::unique_ptr<FileSnapshotStore> store;
  ServiceStack service;  // the shim (if any) is destroyed before the service it wraps
  std::unique_ptr<Wal> wal;
  std::unique_ptr<SyncThread> syncer;  // with fsync on; destroyed (joined) before the log it writes
  std::unique_ptr<Replica> replica;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<LoopStop> stopper;
  EventPtr tick_ev;
  EventPtr status_ev;
  EventPtr sync_done_ev;
  EventPtr hold_ev;  // one-shot: ends a batch hold (arm_batch_hold)
  bool hold_armed = false;
  Effects pending;
  std::size_t unsynced_records = 0;
  // Asynchronous group commit. Every flush that appends records is a generation; a send waits until the log is
  // durable up to the generation it depends on (send_waits_for_log: the latest must-sync record appended before
  // it, else the latest ViewRecord), held in `held` in core order until then.
  struct Held {
    std::uint64_t gen = 0;
    Send send;
  };
  std::deque<Held> held;
  std::uint64_t appended_gen = 0;  // flushes that appended records
  std::uint64_t must_gen = 0;      // the latest of them that appended a record_must_sync() record
  std::uint64_t view_gen = 0;      // the latest of them that appended a ViewRecord
  std::uint64_t durable_gen = 0;   // every record of the flushes up to this one is durable
  std::uint64_t flight_gen = 0;    // the group being written covers the flushes up to this one (0: none)
  std::uint64_t peer_held_gen = 0; // the highest generation a held send to the replicas waits for
  std::string ctx;  // log prefix
  std::string status_path;
  std::uint64_t started_ns = 0;
  std::uint64_t last_tick_ns = 0;

  // Loop statistics for status.json and tuning.
  std::uint64_t flushes = 0;
  std::uint64_t flush_sends = 0;
  std::uint64_t flush_persists = 0;
  std::uint64_t lazy_syncs = 0;
  std::uint64_t batch_holds = 0;           // batch holds that armed the timer
  std::uint64_t batch_holds_timed_out = 0;  // ... and ended by it (a client did not come back in time)
  std::uint64_t sends_held = 0;       // sends that waited for a group to become durable
  std::uint64_t sends_overtook = 0;   // sends that left while a group they need not wait for was in flight
  std::uint64_t held_max = 0;
  std::uint64_t roll_syncs = 0;       // groups written on the loop so that the log could roll over

  std::atomic<std::uint64_t> snap_view{0};
  std::atomic<std::uint64_t> snap_executed{0};
  std::atomic<std::uint64_t> snap_committed{0};
  std::atomic<std::uint64_t> snap_stable{0};
  std::atomic<bool> snap_vc{false};
  std::atomic<std::uint64_t> snap_transfers{0};
  std::atomic<std::uint64_t> snap_transfer_bytes{0};
  std::atomic<std::uint64_t> snap_damaged{0};
  std::atomic<bool> snap_running{false};

  void collect() {
    Effects e = replica->take_effects();
    if (options.check_invariants) replica->check_invariants();
    if (e.empty()) return;
    for (auto& r : e.persist) pending.persist.push_back(std::move(r));
    for (auto& s : e.sends) pending.sends.push_back(std::move(s));
    if (pending.persist.size() + pending.sends.size() >= kPendingFlushThreshold) flush();
  }

  static bool is_speculative_reply(const Send& s) {
    const auto* r = std::get_if<Reply>(&s.message);
    return r != nullptr && (r->flags & kReplySpeculative) != 0;
  }

  // Called after every loop pass (run()), and within a pass when much is pending.
  void flush() {
    if (pending.empty()) return;
    ++flushes;
    flush_persists += pending.persist.size();
    flush_sends += pending.sends.size();
    // PBFT-CS early replies (NSDI'09 §3.1) promise nothing, so they do not wait for this pass's fdatasync: over
    // a WAN the next request of a speculating client arrives in the same pass as the previous batch's PREPAREs,
    // whose PreparedRecord must be synced. Sending them first keeps each client's order for a request (its
    // early reply always precedes its vote), and replies to different requests may leave in any order.
    bool speculative_sent = false;
    for (const auto& s : pending.sends) {
      if (!is_speculative_reply(s)) continue;
      if (!speculative_sent) transport->cork();
      speculative_sent = true;
      transport->send(s);
    }
    if (speculative_sent) transport->uncork();
    if (!pending.persist.empty()) {
      ++appended_gen;
      for (const auto& r : pending.persist) {
        wal->append(r);
        if (record_must_sync(r)) must_gen = appended_gen;
        if (std::holds_alternative<ViewRecord>(r)) view_gen = appended_gen;
      }
      unsynced_records += pending.persist.size();
    }
    // Durable before sent (effects.h): the group with this flush's records starts now, or as soon as the one in
    // flight is durable; the sends that depend on it wait in `held` (send_waits_for_log), the others leave now.
    // A group is needed only when a record backs a promise; pre-prepare and committed records ride along with
    // the next one (or the lazy-sync timer), which keeps one log write per batch on the critical path instead
    // of three.
    start_group(false);
    // Replies to clients leave first: with tentative execution the client is waiting for them, while the
    // commits sent in the same flush are not on its critical path. Reordering sends to different
    // destinations is harmless (each destination keeps the core's order among the sends that wait, and every
    // send is behind what it depends on).
    transport->cork();
    for (auto& s : pending.sends) {
      if (s.to != kAllReplicas && s.to >= config.n && !is_speculative_reply(s)) dispatch(std::move(s));
    }
    for (auto& s : pending.sends) {
      if (s.to == kAllReplicas || s.to < config.n) dispatch(std::move(s));
    }
    transport->uncork();
    pending.clear();
    // Log housekeeping (a bounded step of preallocating the next segment, or a roll-over between groups) after
    // the sends, so that it never delays a promise.
    wal->maintain();
  }

  // Sends `s` now if the log is durable as far as it depends on, else holds it. A PRE-PREPARE or PREPARE that
  // need not wait still queues behind a held send to the replicas: the core puts its deferred COMMITs just
  // before it (Replica::Impl::defer_commit), and both then leave in one write per peer when the group is durable
  // instead of the PREPARE now and the COMMIT alone a moment later. It waits at most for the group in flight.
  void dispatch(Send&& s) {
    std::uint64_t need = send_waits_for_log(s) ? must_gen : view_gen;
    const bool to_replicas = s.to == kAllReplicas || s.to < config.n;
    if (to_replicas && peer_held_gen > durable_gen &&
        (std::holds_alternative<PrePrepare>(s.message) || std::holds_alternative<Prepare>(s.message))) {
      need = std::max(need, peer_held_gen);
    }
    if (need <= durable_gen) {
      if (flight_gen != 0) ++sends_overtook;
      transport->send(s);
      return;
    }
    ++sends_held;
    if (to_replicas) peer_held_gen = std::max(peer_held_gen, need);
    held.push_back(Held{need, std::move(s)});
    held_max = std::max<std::uint64_t>(held_max, held.size());
  }

  // Sends every held send whose generation is durable, in the order they were held.
  void release_held() {
    if (held.empty()) return;
    transport->cork();
    std::deque<Held> keep;
    for (auto& h : held) {
      if (h.gen <= durable_gen) {
        transport->send(h.send);
      } else {
        keep.push_back(std::move(h));
      }
    }
    held.swap(keep);
    transport->uncork();
  }

  // Starts writing what is buffered when something waits for it (or `force`, or too much is buffered), unless
  // a group is already in flight (its completion starts the next). Without fsync the write is a plain pwrite
  // and is done here. A small group is also written here, on the loop: handing it to the sync thread costs two
  // wake-ups (the thread's, then the loop's), which on this 2-core VM cost more than the loop loses by
  // blocking for one small durable write (A/B with benchmarks/ab_cpu.py: one sequential client -17..-29% p50
  // and -10..-24% CPU per request; 32 clients +7% throughput). Large groups (bulk file writes) still go to the
  // thread, so that the loop keeps reading and answering while megabytes reach the disk.
  void start_group(bool force) {
    if (wal->group_in_flight() || !wal->dirty()) return;
    const bool needed = must_gen > durable_gen || view_gen > durable_gen || unsynced_records >= kLazySyncRecordsMax;
    if (!needed && !force) return;
    unsynced_records = 0;
    if (syncer == nullptr || wal->buffered_bytes() <= kInlineGroupBytesMax) {
      wal->sync();
      durable_gen = appended_gen;
      release_held();  // sends held while an earlier group was in flight may depend on this one
      return;
    }
    flight_gen = appended_gen;
    syncer->start(wal->begin_group());
  }

  // The sync thread finished a group: its sends go, the log may roll, and the next group starts.
  void on_group_done() {
    std::optional<Wal::Group> g = syncer->take_done();
    if (!g) return;
    complete_flight(*g);
    if (wal->roll_waiting() && wal->dirty()) {
      // Once per segment: what was buffered meanwhile is written here, on the loop, so the log can roll.
      ++roll_syncs;
      unsynced_records = 0;
      wal->sync();
      durable_gen = appended_gen;
      release_held();
    }
    wal->maintain();
    start_group(false);
  }

  void complete_flight(const Wal::Group& g) {
    BFT_ASSERT(flight_gen != 0);
    wal->complete_group(g);
    durable_gen = flight_gen;
    flight_gen = 0;
    release_held();
  }

  // Makes everything appended durable and sends what waited for it (shutdown).
  void sync_all() {
    if (wal->group_in_flight()) complete_flight(syncer->wait_done());
    if (wal->dirty()) wal->sync();
    durable_gen = appended_gen;
    release_held();
  }

  void update_snapshot() {
    snap_view.store(replica->view(), std::memory_order_relaxed);
    snap_executed.store(replica->last_executed(), std::memory_order_relaxed);
    snap_committed.store(replica->last_committed(), std::memory_order_relaxed);
    snap_stable.store(replica->stable_checkpoint(), std::memory_order_relaxed);
    snap_vc.store(replica->in_view_change(), std::memory_order_relaxed);
    snap_transfers.store(replica->stats().state_transfers, std::memory_order_relaxed);
    snap_transfer_bytes.store(replica->stats().state_transfer_bytes, std::memory_order_relaxed);
    snap_damaged.store(replica->stats().service_damaged, std::memory_order_relaxed);
  }

  void on_message(NodeId from, Message&& m) {
    // With the slow idle timer (pace_ticks), the ticks that elapsed go in first, exactly as the fast timer
    // would have delivered them before this message: a timer the message starts runs its full length.
    if (ticks_slow) on_tick();
    replica->on_message(from, m);
    collect();
  }

  // After every pass: a batch the core holds back for returning clients gets at most kBatchHoldUs more (from the
  // first pass that held it); a hold that ended disarms its timer, so that it never cuts a later hold short.
  void arm_batch_hold() {
    const bool held = replica->batch_held();
    if (held == hold_armed) return;
    hold_armed = held;
    if (!held) {
      event_del(hold_ev.get());
      return;
    }
    ++batch_holds;
    const timeval tv{0, static_cast<suseconds_t>(kBatchHoldUs)};
    BFT_ASSERT(event_add(hold_ev.get(), &tv) == 0);
  }

  void on_batch_hold_timeout() {
    hold_armed = false;
    if (!replica->batch_held()) return;
    ++batch_holds_timed_out;
    replica->end_batch_hold();
    collect();
  }

  // The tick timer wakes every kTickTimerPeriods ticks while the core has something timed to do, and only every
  // status interval while it is idle (Replica::idle: then a tick only counts towards the next STATUS), which
  // saves most of an idle replica's wake-ups; on_tick delivers every elapsed tick either way.
  bool ticks_slow = false;
  void pace_ticks() {
    const bool slow = replica->idle();
    if (slow == ticks_slow) return;
    ticks_slow = slow;
    const std::uint64_t periods =
        slow ? std::min<std::uint64_t>(options.core.status_interval_ticks, kTickCatchUpMax) : kTickTimerPeriods;
    const timeval tv = ms_to_tv(static_cast<std::uint32_t>(options.tick_ms * periods));
    BFT_ASSERT(event_add(tick_ev.get(), &tv) == 0);
  }

  // The core's timeouts count ticks of tick_ms. The timer may fire late (this machine's timers have a
  // 4 ms granularity under load), so every elapsed period is delivered: one on_tick per tick_ms of
  // monotonic time, at most kTickCatchUpMax at once (a stopped process does not replay a long pause).
  void on_tick() {
    const std::uint64_t now = mono_ns();
    const std::uint64_t period = static_cast<std::uint64_t>(options.tick_ms) * 1000000ull;
    std::uint64_t due = (now - last_tick_ns) / period;
    if (due == 0) return;
    last_tick_ns += due * period;
    due = std::min<std::uint64_t>(due, kTickCatchUpMax);
    replica->set_wall_clock_ns(realtime_ns());
    for (std::uint64_t i = 0; i < due; ++i) {
      replica->on_tick();
      collect();
    }
    update_snapshot();
  }

  // ---- set-up (create) ----

  // The cluster configuration, this replica's keys, and the crypto context built from them.
  std::string load_identity() {
    if (std::string err = load_cluster(options.config_path, config); !err.empty()) return err;
    if (!config.is_replica(options.id)) {
      return "replica id " + std::to_string(options.id) + " is not a replica of " + options.config_path + " (n=" +
             std::to_string(config.n) + ")";
    }
    SecretKeys secret;
    if (std::string err = load_secret(secret_path_for(options.config_path, options.id), secret); !err.empty()) {
      return err;
    }
    crypto = make_crypto(config, options.id, secret);
    if (crypto == nullptr) return "cannot build the crypto context of node " + std::to_string(options.id);
    ctx = "r" + std::to_string(options.id);
    return "";
  }

  // The data directory: its lock, the snapshot store (checked against the service it was made for), the
  // service stack on it, and the log, replayed into `records`.
  std::string open_storage(std::vector<PersistRecord>& records) {
    if (std::string err = lock.acquire(options.data_dir); !err.empty()) return err;
    status_path = options.data_dir + "/status.json";
    if (std::string err = FileSnapshotStore::open(options.data_dir + "/snapshots", store); !err.empty()) return err;
    if (std::string err = check_service_identity(*store, options); !err.empty()) return err;
    if (std::string err = make_service_stack(options.service, store.get(), options.data_dir, options.shim,
                                             static_cast<std::uint32_t>(config.clients.size()), service);
        !err.empty()) {
      return err;
    }
    return Wal::open(options.data_dir + "/wal", options.wal, wal, records);
  }

  // The PBFT core over the service, seeded from the kernel (the clock if that fails), with the lying primary of
  // the fault experiment when asked for.
  void make_core() {
    ReplicaOptions core = options.core;
    core.n = config.n;
    core.f = config.f;
    std::uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed)) seed = started_ns ^ options.id;
    replica = std::make_unique<Replica>(core, options.id, *service.top(), *crypto, seed);
    if (options.corrupt_early_replies_ppm > 0) corrupt_early_replies(seed);
  }

  // The lying primary of the PBFT-CS fault experiment: a wrong result with a matching digest, so the client
  // can only find out from the consensus reply (§3.4). Its replies to read-only requests lie alike: a client
  // acts on the first one of those too (a speculating mount's FETCH, docs/SPECULATION.md §5.7), and at the
  // primary's site the primary's is the first. Only while this replica is the primary: the others' read-only
  // replies are the consensus a client checks the lie against.
  void corrupt_early_replies(std::uint64_t seed) {
    LOG_WARN(ctx, "fault injection: corrupting %u ppm of early replies", options.corrupt_early_replies_ppm);
    auto prng = std::make_shared<Prng>(seed ^ 0xBADC0FFEE0DDF00Dull);
    const std::uint32_t ppm = options.corrupt_early_replies_ppm;
    Replica* self = replica.get();
    replica->set_effects_filter([prng, ppm, self](Effects& e) {
      for (Send& s : e.sends) {
        auto* r = std::get_if<Reply>(&s.message);
        if (r == nullptr || (r->flags & kReplyHasResult) == 0) continue;
        const bool early = (r->flags & kReplySpeculative) != 0;
        if (!early && ((r->flags & kReplyReadOnly) == 0 || !self->is_primary())) continue;
        if (r->result.empty() || prng->below(1000000) >= ppm) continue;
        r->result.back() ^= 0x5A;
        r->result_digest = digest_of(r->result);
      }
    });
  }

  // The transport: listening on this replica's address, connecting to every other replica.
  std::string open_network() {
    transport = std::make_unique<Transport>(base.get(), config.n, *crypto, options.transport,
                                            [this](NodeId from, Message&& msg) { on_message(from, std::move(msg)); });
    if (std::string err = transport->listen(config.replicas[options.id]); !err.empty()) return err;
    for (NodeId r = 0; r < config.n; ++r) {
      if (r == options.id) continue;
      if (std::string err = transport->connect(r, config.replicas[r]); !err.empty()) return err;
    }
    return "";
  }

  // The loop's events: the tick, the status timer (which also bounds how long unsynced records wait), the
  // batch hold, and, with fsync, the sync thread's completions.
  void make_events() {
    tick_ev.reset(event_new(
        base.get(), -1, EV_PERSIST, [](int, short, void* a) { static_cast<Impl*>(a)->on_tick(); }, this));
    event_priority_set(tick_ev.get(), kPriorityIo);
    status_ev.reset(event_new(
        base.get(), -1, EV_PERSIST, [](int, short, void* a) { static_cast<Impl*>(a)->on_status_timer(); }, this));
    hold_ev.reset(event_new(base.get(), -1, 0,
                            [](int, short, void* a) { static_cast<Impl*>(a)->on_batch_hold_timeout(); }, this));
    event_priority_set(hold_ev.get(), kPriorityIo);
    BFT_ASSERT(tick_ev && status_ev && hold_ev);
    if (!options.wal.fsync) return;
    syncer = std::make_unique<SyncThread>(*wal);
    sync_done_ev.reset(event_new(
        base.get(), syncer->fd(), EV_READ | EV_PERSIST,
        [](int, short, void* a) { static_cast<Impl*>(a)->on_group_done(); }, this));
    BFT_ASSERT(sync_done_ev != nullptr);
    // As urgent as a socket: libevent runs only the most urgent priority per pass, and the sends it releases
    // are what the other replicas and the clients wait for.
    event_priority_set(sync_done_ev.get(), kPriorityIo);
    BFT_ASSERT(event_add(sync_done_ev.get(), nullptr) == 0);
  }

  void on_status_timer() {
    // Bound how long records appended without a send stay volatile.
    if (wal->dirty() && !wal->group_in_flight()) {
      ++lazy_syncs;
      start_group(true);
    }
    write_status(true);
  }

  // ---- status ----

  // The core's counters (protocol/replica.h ReplicaStats).
  JsonObject core_stats_json() const {
    const ReplicaStats& st = replica->stats();
    JsonObject stats;
    stats.add("requests_executed", st.requests_executed)
        .add("batches_committed", st.batches_committed)
        .add("read_only_executed", st.read_only_executed)
        .add("view_changes_started", st.view_changes_started)
        .add("view_changes_deferred_lagging", st.view_changes_deferred_lagging)
        .add("new_views_installed", st.new_views_installed)
        .add("state_transfers", st.state_transfers)
        .add("state_transfer_bytes", st.state_transfer_bytes)
        .add("recovered_checkpoints_adopted", st.recovered_checkpoints_adopted)
        .add("service_damaged", st.service_damaged)
        .add("rollbacks", st.rollbacks)
        .add("early_replies", st.early_replies)
        .add("quiet_batches", st.quiet_batches)
        .add("quiet_releases", st.quiet_releases)
        .add("open_batches_discarded", st.open_batches_discarded)
        .add("rejected_bad_authenticator", st.rejected_bad_authenticator)
        .add("rejected_bad_signature", st.rejected_bad_signature)
        .add("rejected_out_of_window", st.rejected_out_of_window)
        .add("rejected_wrong_view", st.rejected_wrong_view)
        .add("rejected_conflict", st.rejected_conflict)
        .add("rejected_invalid", st.rejected_invalid)
        .add("fetches_refused_repeat", st.fetches_refused_repeat);
    return stats;
  }

  // The transport's counters and the WAN emulation in force.
  JsonObject net_stats_json() const {
    const TransportStats& ts = transport->stats();
    JsonObject net;
    net.add("frames_received", ts.frames_received)
        .add("frames_sent", ts.frames_sent)
        .add("bytes_received", ts.bytes_received)
        .add("bytes_sent", ts.bytes_sent)
        .add("frames_rejected", ts.frames_rejected)
        .add("connections", static_cast<std::uint64_t>(transport->connection_count()))
        .add("connections_closed", ts.connections_closed)
        .add("reconnects_early", ts.reconnects_early)
        .add("closed_bad_header", ts.closed_bad_header)
        .add("closed_slow_peer", ts.closed_slow_peer)
        .add("sends_dropped_no_connection", ts.sends_dropped_no_connection)
        .add("hellos_received", ts.hellos_received)
        .add("frames_parked", ts.frames_parked)
        .add("parked_delivered", ts.parked_delivered)
        .add("parked_expired", ts.parked_expired)
        .add("direct_writes", ts.direct_writes)
        .add("direct_reads", ts.direct_reads)
        .add("corked_frames", ts.corked_frames)
        .add("wan", options.transport.wan.describe())
        .add("frames_delayed", ts.frames_delayed)
        .add("delay_dropped", ts.delay_dropped);
    return net;
  }

  // The log's counters and this loop's group-commit counters.
  JsonObject log_stats_json() const {
    const WalStats& ws = wal->stats();
    JsonObject log;
    log.add("wal_records", ws.records_appended)
        .add("wal_bytes", ws.bytes_appended)
        .add("wal_syncs", ws.syncs)
        .add("wal_direct_writes", ws.direct_writes)
        .add("wal_sync_us_avg", ws.syncs == 0 ? 0.0 : static_cast<double>(ws.sync_ns_total) / 1e3 / static_cast<double>(ws.syncs))
        .add("wal_sync_us_max", static_cast<double>(ws.sync_ns_max) / 1e3)
        .add("wal_syncs_past_prealloc", ws.syncs_past_prealloc)
        .add("wal_compactions", ws.compactions)
        .add("wal_rolls", ws.rolls)
        .add("wal_prealloc_step_us_max", static_cast<double>(ws.prealloc_ns_max) / 1e3)
        .add("wal_roll_us_max", static_cast<double>(ws.roll_ns_max) / 1e3)
        .add("wal_replayed_records", ws.replayed_records)
        .add("flushes", flushes)
        .add("flush_sends", flush_sends)
        .add("flush_persists", flush_persists)
        .add("lazy_syncs", lazy_syncs)
        .add("batch_holds", batch_holds)
        .add("batch_holds_timed_out", batch_holds_timed_out)
        .add("sends_held", sends_held)
        .add("sends_overtook", sends_overtook)
        .add("held_max", held_max)
        .add("roll_syncs", roll_syncs);
    return log;
  }

  // Rewrites status.json (runtime/status_file.h): where the replica is, and every counter, grouped.
  void write_status(bool running) {
    JsonObject status;
    status.add("role", "replica")
        .add("id", static_cast<std::uint64_t>(options.id))
        .add("pid", static_cast<std::uint64_t>(getpid()))
        .add("running", running)
        .add("service", options.service)
        .add("view", replica->view())
        .add("primary", replica->view() % config.n)
        .add("is_primary", replica->is_primary())
        .add("in_view_change", replica->in_view_change())
        .add("last_executed", replica->last_executed())
        .add("last_committed", replica->last_committed())
        .add("stable_checkpoint", replica->stable_checkpoint())
        .add("uptime_s", static_cast<double>(realtime_ns() - started_ns) / 1e9)
        .add("updated_unix_ms", realtime_ns() / 1000000)
        .add("stats", core_stats_json())
        .add("net", net_stats_json())
        .add("log", log_stats_json());
    if (std::string err = write_file_atomically(status_path, status.str() + "\n"); !err.empty()) {
      LOG_WARN(ctx, "status: %s", err.c_str());
    }
  }
};

ReplicaRuntime::ReplicaRuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ReplicaRuntime::~ReplicaRuntime() {
  if (impl_ == nullptr) return;
  // Events before the objects their callbacks use; the base after them (members are destroyed in reverse).
  impl_->tick_ev.reset();
  impl_->status_ev.reset();
  impl_->sync_done_ev.reset();
  impl_->hold_ev.reset();
  impl_->syncer.reset();  // run() completed every group; joins the thread before the log goes
  impl_->stopper.reset();
  impl_->transport.reset();
}

std::string ReplicaRuntime::create(const ReplicaRuntimeOptions& options, std::unique_ptr<ReplicaRuntime>& out) {
  out.reset();
  ::signal(SIGPIPE, SIG_IGN);  // a peer that closes while we write must not kill the replica
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = options;
  m.started_ns = realtime_ns();
  if (std::string err = m.load_identity(); !err.empty()) return err;
  std::vector<PersistRecord> records;
  if (std::string err = m.open_storage(records); !err.empty()) return err;
  m.base = make_event_base(options.transport.wan.enabled());
  if (m.base == nullptr) return "cannot create an event base";
  m.stopper = std::make_unique<LoopStop>(m.base.get());
  if (options.handle_signals) m.stopper->handle_signals();
  m.make_core();
  if (std::string err = m.open_network(); !err.empty()) return err;
  m.make_events();
  if (options.transport.wan.enabled()) {
    LOG_INFO(m.ctx, "WAN emulation: %s; this replica is at site %u", options.transport.wan.describe().c_str(),
             options.transport.wan.site(options.id));
  }
  LOG_INFO(m.ctx, "recovering from %zu log records (service %s)", records.size(), options.service.c_str());
  m.replica->recover(records);
  if (options.check_invariants) m.replica->check_invariants();
  m.collect();
  m.update_snapshot();
  out.reset(new ReplicaRuntime(std::move(impl)));
  return "";
}

void ReplicaRuntime::run() {
  Impl& m = *impl_;
  // The timer wakes every kTickTimerPeriods ticks and on_tick() delivers every tick that elapsed: the core's
  // timeouts are tens to hundreds of ticks, so they keep their meaning, and four idle wake-ups in five are saved
  // (four replicas and the clients share two cores, where every wake-up costs).
  const timeval tick = ms_to_tv(m.options.tick_ms * kTickTimerPeriods);
  const timeval status = ms_to_tv(m.options.status_interval_ms);
  BFT_ASSERT(event_add(m.tick_ev.get(), &tick) == 0);
  BFT_ASSERT(event_add(m.status_ev.get(), &status) == 0);
  m.snap_running.store(true);
  m.last_tick_ns = mono_ns();
  m.write_status(true);
  LOG_INFO(m.ctx, "replica %u running: listening on %s:%u, n=%u f=%u", m.options.id,
           m.config.replicas[m.options.id].host.c_str(), m.config.replicas[m.options.id].port, m.config.n, m.config.f);
  // One iteration per pass: EVLOOP_ONCE waits for events and returns once every callback that became active
  // (all readable sockets, due timers) has run, so the flush below is the group-commit boundary and costs
  // no extra epoll_wait.
  while (!m.stopper->requested()) {
    if (event_base_loop(m.base.get(), EVLOOP_ONCE) < 0) break;
    m.flush();
    m.arm_batch_hold();
    m.pace_ticks();
  }
  m.flush();
  m.sync_all();
  m.snap_running.store(false);
  m.write_status(false);
  event_del(m.tick_ev.get());
  event_del(m.status_ev.get());
  LOG_INFO(m.ctx, "replica %u stopped", m.options.id);
}

void ReplicaRuntime::stop() { impl_->stopper->request(); }

ReplicaSnapshot ReplicaRuntime::snapshot() const {
  ReplicaSnapshot s;
  s.view = impl_->snap_view.load(std::memory_order_relaxed);
  s.last_executed = impl_->snap_executed.load(std::memory_order_relaxed);
  s.last_committed = impl_->snap_committed.load(std::memory_order_relaxed);
  s.stable_checkpoint = impl_->snap_stable.load(std::memory_order_relaxed);
  s.in_view_change = impl_->snap_vc.load(std::memory_order_relaxed);
  s.state_transfers = impl_->snap_transfers.load(std::memory_order_relaxed);
  s.state_transfer_bytes = impl_->snap_transfer_bytes.load(std::memory_order_relaxed);
  s.service_damaged = impl_->snap_damaged.load(std::memory_order_relaxed);
  s.running = impl_->snap_running.load(std::memory_order_relaxed);
  return s;
}

}  // namespace bftfs
