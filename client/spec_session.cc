// The spec session of a `bftfs run` (client/spec_session.h): a second FuseClient::Impl on a descriptor the
// supervisor mounted, with its own loop, invalidation thread and write-behind flusher.
#include "client/spec_session.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/fuse_client_impl.h"
#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {

namespace {

// Sent to the loop's thread after fuse_session_exit, so that its wait for the workers returns (fuse_client.cc
// uses the same signal for the mount's own loop and installs the same no-op handler for the daemon's life).
constexpr int kWakeSignal = SIGUSR2;

void on_wake(int) {}

void ensure_wake_handler() {
  struct sigaction old {};
  ::sigaction(kWakeSignal, nullptr, &old);
  if (old.sa_handler != SIG_DFL) return;  // the daemon's serve() installed it
  struct sigaction sa {};
  sa.sa_handler = on_wake;  // no SA_RESTART: the loop's sem_wait must return EINTR
  sigemptyset(&sa.sa_mask);
  ::sigaction(kWakeSignal, &sa, nullptr);
}

}  // namespace

struct SpecSession::State {
  std::unique_ptr<FuseClient::Impl> impl;
  std::thread loop;
  std::thread invalidator;
  pthread_t loop_thread{};
  std::atomic<bool> loop_started{false};  // loop_thread is set
  std::atomic<bool> ended{false};
};

SpecSession::SpecSession() : s_(std::make_unique<State>()) {}

std::string SpecSession::start(UniqueFd fuse, const MountOptions& base, Backend& backend,
                               std::unique_ptr<SpecSession>& out) {
  if (!fuse.valid()) return "ATTACH came without the spec session's /dev/fuse descriptor";
  MountOptions o = base;  // the cache timeouts are the mount's while not speculating (set_zero_timeouts)
  o.status_path.clear();
  std::unique_ptr<SpecSession> session(new SpecSession());
  State& st = *session->s_;
  st.impl = std::make_unique<FuseClient::Impl>(o);
  FuseClient::Impl& impl = *st.impl;
  impl.ignore_interrupts = true;
  impl.track_entries = true;
  impl.merge_writes = true;
  impl.statfs_cache_s = 2.0;
  impl.backend = &backend;
  std::vector<std::string> argv_s = {"bftfs-spec"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  const fuse_lowlevel_ops& ops = fuse_operations();
  impl.se = fuse_session_new(&args, &ops, sizeof(ops), &impl);
  if (impl.se == nullptr) return "cannot create the spec session's FUSE session";
  // libfuse's "/dev/fd/N" form: serve a descriptor that is already mounted; the session owns it from now on.
  const std::string path = "/dev/fd/" + std::to_string(fuse.get());
  if (fuse_session_mount(impl.se, path.c_str()) != 0) {
    fuse_session_destroy(impl.se);
    impl.se = nullptr;
    return "cannot serve the spec session's descriptor";
  }
  (void)fuse.release();
  impl.mounted.store(false);  // the supervisor's mount: unmounted with its namespace, never by this daemon
  ensure_wake_handler();
  impl.wb.start_flusher();
  st.invalidator = std::thread([&impl] { impl.run_invalidations(); });
  st.loop = std::thread([&st] {
    st.loop_thread = pthread_self();
    st.loop_started.store(true);
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, st.impl->opt.max_threads);
    fuse_loop_cfg_set_idle_threads(cfg, 4);
    const int rc = fuse_session_loop_mt(st.impl->se, cfg);
    fuse_loop_cfg_destroy(cfg);
    LOG_INFO("", "spec session: the FUSE loop ended (%d)", rc);
    st.ended.store(true);
  });
  out = std::move(session);
  return "";
}

SpecSession::~SpecSession() {
  State& st = *s_;
  FuseClient::Impl& impl = *st.impl;
  if (impl.se != nullptr) {
    fuse_session_exit(impl.se);
    // Wake the loop's wait for its workers until it notices (the signal may arrive before it waits).
    while (st.loop.joinable() && !st.ended.load()) {
      if (st.loop_started.load()) pthread_kill(st.loop_thread, kWakeSignal);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (st.loop.joinable()) st.loop.join();
  LOG_INFO("", "spec session: counters %s", impl.stats.json().c_str());
  impl.stop();
  impl.wb.stop_flusher();
  impl.end_invalidations();
  if (st.invalidator.joinable()) st.invalidator.join();
  if (impl.se != nullptr) fuse_session_destroy(impl.se);
  impl.se = nullptr;
}

void SpecSession::set_synchronous_writes(bool on) { s_->impl->synchronous_writes.store(on); }

void SpecSession::flush_writes() {
  FuseClient::Impl& impl = *s_->impl;
  impl.send_merged();
  impl.wb.kick_all();
  while (impl.wb.in_flight() > 0 && !s_->ended.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void SpecSession::set_zero_timeouts(bool on) { s_->impl->zero_timeouts.store(on); }

void SpecSession::invalidate_entries() {
  FuseClient::Impl& impl = *s_->impl;
  std::set<std::pair<FuseIno, std::string>> entries;
  {
    std::lock_guard<std::mutex> lock(impl.entries_mu);
    entries.swap(impl.cached_entries);
  }
  if (s_->ended.load()) return;
  for (const auto& [parent, name] : entries) {
    // Expire, not invalidate: invalidating unhashes the kernel's dentry, and a directory that is some task's
    // working directory (the tree's, its parents) then has no path: getcwd() fails ENOENT for good. An expired
    // entry is looked up again at its next use, and dropped only if the answer differs.
    const int rc = fuse_lowlevel_notify_expire_entry(impl.se, parent, name.data(), name.size(), FUSE_LL_EXPIRE_ONLY);
    if (rc != 0 && rc != -ENOENT) {
      LOG_WARN("", "spec session: invalidating entry %s of node %llu failed: %d", name.c_str(),
               static_cast<unsigned long long>(parent), rc);
    }
  }
}

void SpecSession::kick_writes() {
  s_->impl->drop_merged();  // written by the tree that was just killed, in an epoch that failed
  s_->impl->wb.kick_all();
}

void SpecSession::invalidate_all() {
  FuseClient::Impl& impl = *s_->impl;
  if (s_->ended.load()) return;
  for (const FuseIno id : impl.table.ids()) {
    impl.table.drop_data_version(id);
    const int rc = fuse_lowlevel_notify_inval_inode(impl.se, id, 0, 0);
    if (rc != 0 && rc != -ENOENT) {
      LOG_WARN("", "spec session: invalidating node %llu failed: %d", static_cast<unsigned long long>(id), rc);
    }
  }
  // Attributes the node table holds from before now are no longer answered from its cache.
  impl.raise_attr_barrier(impl.next_seq.load());
  {
    std::lock_guard<std::mutex> lock(impl.pf_mu);
    impl.prefetched.clear();
  }
  invalidate_entries();
}

bool SpecSession::ended() const { return s_->ended.load(); }

}  // namespace bftfs::client
