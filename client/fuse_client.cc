// The FUSE daemon's life (FuseClient, client/fuse_client.h): mount, serve -- the multithreaded FUSE loop with
// its helper threads (stop signals, kernel cache invalidations, the detach timer, the status file) -- and the
// drain after the loop (staged writes out, unmount, hidden files removed, writes in flight waited for). The
// handlers it serves are in handlers_*.cc; client/fuse_client_impl.h maps the rest.
#include "client/fuse_client.h"

#include "client/fuse_client_impl.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <optional>
#include <thread>
#include <utility>

#include "common/assert.h"
#include "common/log.h"
#include "os/unique_fd.h"
#include "runtime/status_file.h"

namespace bftfs::client {

namespace {

// Rewrites `path` with the counters every second until stopped, and once more at the end (RAII).
class StatusWriter {
 public:
  StatusWriter(const std::string& path, const ClientCounters& c) : path_(path), c_(c) {
    if (!path_.empty()) thread_ = std::thread([this] { loop(); });
  }
  ~StatusWriter() {
    if (path_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    write();
  }
  StatusWriter(const StatusWriter&) = delete;
  StatusWriter& operator=(const StatusWriter&) = delete;

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      write();
      lock.lock();
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  }
  void write() {
    if (std::string err = write_file_atomically(path_, c_.json()); !err.empty()) {
      LOG_WARN("", "client: status file: %s", err.c_str());
    }
  }
  const std::string path_;
  const ClientCounters& c_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Termination signals: the handler only marks the session as exited and writes one byte to a pipe (both
// async-signal-safe); a thread of serve() reads it and does the rest (FuseClient::Impl::stop()).
int g_stop_pipe_write = -1;
fuse_session* g_stop_session = nullptr;
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
// Sent to the thread running the FUSE loop after a stop: its wait for the workers (sem_wait) returns EINTR
// and it notices the session has exited, also when the termination signal hit another thread.
constexpr int kWakeSignal = SIGUSR2;

void on_stop_signal(int) {
  if (g_stop_session != nullptr) fuse_session_exit(g_stop_session);
  const char c = 1;
  const ssize_t n = ::write(g_stop_pipe_write, &c, 1);
  (void)n;
}

void on_wake_signal(int) {}

// The termination signals for the life of serve() (RAII): while installed, SIGTERM, SIGINT and SIGHUP end the
// FUSE session and run `on_stop` once on a thread of its own; SIGPIPE is ignored. The destructor ends that
// thread and restores the previous handlers.
class StopSignals {
 public:
  StopSignals() = default;
  ~StopSignals() {
    if (!installed_) return;
    const char zero = 0;  // tells the thread that serve() is done
    while (::write(write_.get(), &zero, 1) < 0 && errno == EINTR) {
    }
    stopper_.join();
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_stop_[i], nullptr);
    ::sigaction(kWakeSignal, &old_wake_, nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_stop_session = nullptr;
    g_stop_pipe_write = -1;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Makes the pipe from the signal handler to the thread. Returns false if it cannot.
  [[nodiscard]] bool open() {
    int fds[2] = {-1, -1};
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    read_.reset(fds[0]);
    write_.reset(fds[1]);
    return true;
  }

  // Installs the handlers for `se` (after open()) and starts the thread that runs `on_stop`.
  void install(fuse_session* se, std::function<void()> on_stop) {
    BFT_ASSERT(read_.get() >= 0);
    BFT_ASSERT(!installed_);
    ::fcntl(write_.get(), F_SETFL, O_NONBLOCK);
    g_stop_pipe_write = write_.get();
    g_stop_session = se;
    // No SA_RESTART: a blocking read of /dev/fuse or the loop's wait must return EINTR.
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &sa, &old_stop_[i]);
    struct sigaction wake {}, ign {};
    wake.sa_handler = on_wake_signal;
    sigemptyset(&wake.sa_mask);
    ::sigaction(kWakeSignal, &wake, &old_wake_);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
    installed_ = true;
    stopper_ = std::thread([this, on_stop = std::move(on_stop)] { wait_for_stop(on_stop); });
  }

 private:
  // Runs `on_stop` at the first byte 1 from the handler (later signals change nothing); returns at byte 0.
  void wait_for_stop(const std::function<void()>& on_stop) {
    bool stopped = false;
    for (;;) {
      char c = 0;
      const ssize_t n = ::read(read_.get(), &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == 0) return;  // serve() is done
      if (stopped) continue;
      stopped = true;
      on_stop();
    }
  }

  UniqueFd read_, write_;
  bool installed_ = false;
  struct sigaction old_stop_[std::size(kStopSignals)] = {};
  struct sigaction old_wake_ {}, old_pipe_ {};
  std::thread stopper_;
};

// Once the session has ended (unmounted), the rest of serve() may wait for the backend: handlers still
// waiting (a release waits for its file's writes) and then the writes in flight. While it does, this thread
// says every kDrainReportInterval how many writes are left and about how long they will take
// (Impl::report_drain), so a backlog behind a slow or unreachable cluster shows as progress, not as a silent
// wait. If the wait takes longer than `detach_after`, on_detached() tells the world this daemon no longer
// matters to a later mount. RAII: the destructor (serve() is done) ends the thread.
class Detacher {
 public:
  Detacher(FuseClient::Impl* impl, std::function<void()> on_detached, std::chrono::milliseconds detach_after)
      : impl_(impl), on_detached_(std::move(on_detached)), detach_after_(detach_after) {
    thread_ = std::thread([this] { run(); });
  }
  ~Detacher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      serve_done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Detacher(const Detacher&) = delete;
  Detacher& operator=(const Detacher&) = delete;

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<FuseClient::Impl::DrainProgress> progress;  // set when the session ended
    bool detached = false;
    while (!serve_done_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (serve_done_) return;
      const auto now = std::chrono::steady_clock::now();
      if (!progress && fuse_session_exited(impl_->se) != 0) progress = impl_->start_drain_report();
      if (!progress) continue;
      if (now - progress->last >= kDrainReportInterval) impl_->report_drain(*progress);
      if (!detached && now - progress->start >= detach_after_) {
        detached = true;
        LOG_WARN("", "mount: unmounted, still waiting for the backend (%llu writes, %llu bytes in flight); "
                 "umount need not wait", static_cast<unsigned long long>(impl_->table.writes_in_flight()),
                 static_cast<unsigned long long>(impl_->table.pending_bytes()));
        if (on_detached_) on_detached_();
      }
    }
  }

  FuseClient::Impl* const impl_;
  const std::function<void()> on_detached_;
  const std::chrono::milliseconds detach_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool serve_done_ = false;
  std::thread thread_;
};

// Runs the multithreaded FUSE loop until the session ends (unmount, or a stop signal). Returns its status.
int run_fuse_loop(fuse_session* se, unsigned max_threads) {
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, max_threads);
  fuse_loop_cfg_set_idle_threads(cfg, 4);
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  return rc;
}

}  // namespace

FuseClient::FuseClient(MountOptions options) : impl_(std::make_unique<Impl>(options)) {}

FuseClient::~FuseClient() {
  if (impl_->se != nullptr) {
    if (impl_->mounted.load()) fuse_session_unmount(impl_->se);
    fuse_session_destroy(impl_->se);
  }
}

std::string FuseClient::mount(const std::string& mountpoint, const std::string& fuse_options) {
  BFT_ASSERT(impl_->se == nullptr);
  std::string o = "fsname=bftfs,subtype=bftfs,noatime";
  if (impl_->opt.default_permissions) o += ",default_permissions";
  // Other users (and root) may use the mount, as with any network file system; only root may ask for that
  // unless /etc/fuse.conf has user_allow_other.
  if (geteuid() == 0) o += ",allow_other";
  if (!fuse_options.empty()) o += "," + fuse_options;
  std::vector<std::string> argv_s = {"bftfs", "-o", o};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  const fuse_lowlevel_ops& ops = fuse_operations();
  impl_->se = fuse_session_new(&args, &ops, sizeof(ops), impl_.get());
  if (impl_->se == nullptr) return "cannot create the FUSE session (bad -o options?)";
  if (fuse_session_mount(impl_->se, mountpoint.c_str()) != 0) {
    fuse_session_destroy(impl_->se);
    impl_->se = nullptr;
    return "cannot mount at " + mountpoint;
  }
  impl_->mountpoint = mountpoint;
  impl_->mounted.store(true);
  return "";
}

std::string ClientCounters::json() const {
  JsonObject j;
  j.add("pid", static_cast<std::uint64_t>(::getpid()))
      .add("fuse_lookup", fuse_lookup.load())
      .add("fuse_getattr", fuse_getattr.load())
      .add("fuse_setattr", fuse_setattr.load())
      .add("fuse_open", fuse_open.load())
      .add("fuse_create", fuse_create.load())
      .add("fuse_read", fuse_read.load())
      .add("fuse_write", fuse_write.load())
      .add("fuse_flush", fuse_flush.load())
      .add("fuse_release", fuse_release.load())
      .add("fuse_fsync", fuse_fsync.load())
      .add("fuse_readdir", fuse_readdir.load())
      .add("fuse_namespace", fuse_namespace.load())
      .add("fuse_other", fuse_other.load())
      .add("requests_read_only", requests_read_only.load())
      .add("requests_ordered", requests_ordered.load())
      .add("lookups_enoent", lookups_enoent.load())
      .add("getattr_cache_hits", getattr_cache_hits.load())
      .add("getattr_cache_misses", getattr_cache_misses.load())
      .add("open_prefetches", open_prefetches.load())
      .add("read_prefetch_hits", read_prefetch_hits.load())
      .add("writes_coalesced", writes_coalesced.load())
      .add("ops_joined", ops_joined.load())
      .add("write_behind_waits", write_behind_waits.load())
      .add("stage_sends_full", stage_sends_full.load())
      .add("stage_sends_timer", stage_sends_timer.load())
      .add("stage_sends_getattr", stage_sends_getattr.load())
      .add("stage_sends_read", stage_sends_read.load())
      .add("stage_sends_close", stage_sends_close.load())
      .add("stage_sends_fsync", stage_sends_fsync.load())
      .add("stage_sends_mutation", stage_sends_mutation.load())
      .add("stage_sends_other", stage_sends_other.load())
      .add("direct_writes", direct_writes.load())
      .add("direct_reads", direct_reads.load())
      .add("direct_invalidations", direct_invalidations.load());
  return j.str() + "\n";
}

const ClientCounters& FuseClient::counters() const { return impl_->stats; }

int FuseClient::serve(Backend& backend, std::function<void()> on_detached, std::chrono::milliseconds detach_after) {
  BFT_ASSERT(impl_->se != nullptr);
  BFT_ASSERT(g_stop_session == nullptr);  // one serving client per process
  impl_->backend = &backend;
  // Destroyed in reverse order when serve() returns: the detach timer, the stop signals, then the status
  // file's last write.
  StatusWriter status(impl_->opt.status_path, impl_->stats);
  StopSignals signals;
  if (!signals.open()) return -1;
  Impl* impl = impl_.get();
  impl->wb.start_flusher();
  signals.install(impl->se, [impl, loop_thread = pthread_self()] {
    LOG_INFO("", "mount: termination signal: stopping (writes in flight get %lld s)",
             static_cast<long long>(kStopGrace.count()));
    impl->stop();
    pthread_kill(loop_thread, kWakeSignal);
  });
  std::thread invalidator([impl] { impl->run_invalidations(); });
  Detacher detacher(impl, std::move(on_detached), detach_after);

  int rc = run_fuse_loop(impl->se, impl->opt.max_threads);
  impl->end_invalidations();
  invalidator.join();
  if (!impl->drain()) rc = -1;
  return rc == 0 ? 0 : -1;
}

void FuseClient::Impl::request_inval(FuseIno id) {
  {
    std::lock_guard<std::mutex> lock(inval_mu);
    inval_queue.push_back(id);
  }
  inval_cv.notify_one();
}

// The invalidation thread's body: drops the pages and attributes of each queued node (a node the kernel
// forgot meanwhile gives ENOENT: nothing to drop). Returns once inval_done is set and the queue is empty.
void FuseClient::Impl::run_invalidations() {
  std::unique_lock<std::mutex> lock(inval_mu);
  for (;;) {
    inval_cv.wait(lock, [this] { return inval_done || !inval_queue.empty(); });
    if (inval_queue.empty()) return;
    std::vector<FuseIno> batch;
    batch.swap(inval_queue);
    lock.unlock();
    for (const FuseIno id : batch) (void)fuse_lowlevel_notify_inval_inode(se, id, 0, 0);
    lock.lock();
  }
}

void FuseClient::Impl::end_invalidations() {
  {
    std::lock_guard<std::mutex> lock(inval_mu);
    inval_done = true;
  }
  inval_cv.notify_one();
}

bool FuseClient::Impl::drain() {
  // Nothing more will be served: let the mount point go now (a no-op after `bftfs umount`), then let the
  // writes answered but not yet final reach the service. They may wait as long as the backend retries (a hard
  // mount) unless the daemon was told to stop: then for kStopGrace at most.
  // Nothing stages any more: the stage flusher stops, and every staged write goes now, whatever the lane holds.
  wb.stop_flusher();
  wb.kick_all();
  fuse_session_unmount(se);
  mounted.store(false);
  // The kernel is gone and sends no more forgets: files it still referenced after their last unlink go now.
  for (const SillyName& hidden : table.take_all_silly()) remove_hidden(hidden);
  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t writes = table.writes_in_flight();
  if (!table.wait_all_writes([this] { return stop_grace_over(); })) {
    LOG_ERROR("", "mount: stopped with %llu writes still in flight (the backend did not answer in %lld s): "
              "their data is lost", static_cast<unsigned long long>(table.writes_in_flight()),
              static_cast<long long>(kStopGrace.count()));
    return false;
  }
  if (writes > 0) {
    LOG_INFO("", "unmount: the last %llu writes became final in %.1f s", static_cast<unsigned long long>(writes),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return true;
}

FuseClient::Impl::DrainProgress FuseClient::Impl::start_drain_report() {
  DrainProgress p;
  p.writes = table.writes_in_flight();
  p.bytes = table.pending_bytes();
  p.start = p.last = std::chrono::steady_clock::now();
  if (p.writes > 0) {
    LOG_INFO("", "unmount: waiting for %llu writes (%llu bytes) in flight to become final",
             static_cast<unsigned long long>(p.writes), static_cast<unsigned long long>(p.bytes));
  }
  return p;
}

// One progress line of an unmount that waits for writes in flight: how many are left, how fast they became
// final since the last line, and at that rate about how long the rest will take (by count and by bytes,
// whichever is longer); or that none became final (the cluster may be unreachable: a hard mount keeps trying).
void FuseClient::Impl::report_drain(DrainProgress& p) {
  const auto now = std::chrono::steady_clock::now();
  const std::uint64_t writes = table.writes_in_flight();
  const std::uint64_t bytes = table.pending_bytes();
  const double total_s = std::chrono::duration<double>(now - p.start).count();
  const double interval_s = std::chrono::duration<double>(now - p.last).count();
  if (writes == 0) {
    // Nothing left to report (drain() says when the last ones became final).
  } else if (interval_s > 0 && writes < p.writes) {
    const double writes_per_s = static_cast<double>(p.writes - writes) / interval_s;
    const double bytes_per_s = p.bytes > bytes ? static_cast<double>(p.bytes - bytes) / interval_s : 0;
    double left_s = static_cast<double>(writes) / writes_per_s;
    if (bytes_per_s > 0) left_s = std::max(left_s, static_cast<double>(bytes) / bytes_per_s);
    LOG_INFO("", "unmount: %llu writes (%llu bytes) still in flight after %.0f s; %.0f writes/s (%.0f KiB/s) "
             "became final in the last %.0f s: about %.0f s left",
             static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes), total_s, writes_per_s,
             bytes_per_s / 1024, interval_s, left_s);
  } else {
    LOG_WARN("", "unmount: %llu writes (%llu bytes) still in flight after %.0f s; none became final in the last "
             "%.0f s (is the cluster reachable? `bftfs status`)",
             static_cast<unsigned long long>(writes), static_cast<unsigned long long>(bytes), total_s, interval_s);
  }
  p.writes = writes;
  p.bytes = bytes;
  p.last = now;
}

}  // namespace bftfs::client
