// How a waiting handler stops waiting: a FUSE interrupt (InterruptScope), the daemon's stop (Impl::stop, with
// its grace for writes in flight), or a caller that is exiting (thread_exiting, for FLUSH). Also the freply_*
// wrappers every reply goes through, because a reply must end the handler's InterruptScope first, and the
// interruptible lock of opens against removals (NsLock).
#include "client/fuse_client_impl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/assert.h"

namespace bftfs::client {

namespace {

constexpr unsigned long kPfExiting = 0x4;  // PF_EXITING in /proc/<tid>/stat's flags (include/linux/sched.h)

// The scope of the handler running on this thread (one at a time: handlers reply on the thread that runs them).
thread_local InterruptScope* tl_scope = nullptr;

void end_scope() {
  if (tl_scope != nullptr) tl_scope->end();
}

}  // namespace

InterruptScope::InterruptScope(fuse_req_t req, NodeTable& table, const std::atomic<bool>& stopping, bool ignore)
    : req_(req), table_(table), stopping_(stopping) {
  BFT_ASSERT(tl_scope == nullptr);  // one scope per handler
  tl_scope = this;
  if (ignore) return;
  registered_ = true;
  fuse_req_interrupt_func(req_, &InterruptScope::on_interrupt, this);
}

void InterruptScope::end() {
  if (ended_) return;
  ended_ = true;
  if (registered_) fuse_req_interrupt_func(req_, nullptr, nullptr);
  tl_scope = nullptr;
}

void InterruptScope::set_wakeup(std::mutex* mu, std::condition_variable* cv) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  mu_ = mu;
  cv_ = cv;
}

void InterruptScope::on_interrupt(fuse_req_t, void* data) {
  auto* self = static_cast<InterruptScope*>(data);
  self->flag_.store(true);
  {
    std::lock_guard<std::mutex> lock(self->wake_mu_);
    if (self->mu_ != nullptr) {
      { std::lock_guard<std::mutex> l2(*self->mu_); }
      self->cv_->notify_all();
    }
  }
  self->table_.notify_waiters();
}

int freply_err(fuse_req_t req, int err) { end_scope(); return fuse_reply_err(req, err); }
void freply_none(fuse_req_t req) { end_scope(); fuse_reply_none(req); }
int freply_entry(fuse_req_t req, const fuse_entry_param* e) { end_scope(); return fuse_reply_entry(req, e); }
int freply_create(fuse_req_t req, const fuse_entry_param* e, const fuse_file_info* fi) {
  end_scope();
  return fuse_reply_create(req, e, fi);
}
int freply_attr(fuse_req_t req, const struct stat* st, double timeout) {
  end_scope();
  return fuse_reply_attr(req, st, timeout);
}
int freply_readlink(fuse_req_t req, const char* link) { end_scope(); return fuse_reply_readlink(req, link); }
int freply_open(fuse_req_t req, const fuse_file_info* fi) { end_scope(); return fuse_reply_open(req, fi); }
int freply_write(fuse_req_t req, size_t count) { end_scope(); return fuse_reply_write(req, count); }
int freply_buf(fuse_req_t req, const char* buf, size_t size) { end_scope(); return fuse_reply_buf(req, buf, size); }
int freply_statfs(fuse_req_t req, const struct statvfs* st) { end_scope(); return fuse_reply_statfs(req, st); }

// Whether thread `tid` is exiting (PF_EXITING). A process killed while its writes are in flight closes its
// files from do_exit, and there FLUSH cannot be interrupted any more (the fatal signal is consumed, a second
// SIGKILL is ignored): the kernel waits for our answer, so FLUSH must not wait for a backend that may be
// unreachable. The answer goes to nobody; the writes still go on, and release waits for them. A thread that
// is gone counts as exiting.
bool thread_exiting(pid_t tid) {
  if (tid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // After the command name's closing parenthesis: state ppid pgrp session tty_nr tpgid flags.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return false;
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long flags = 0;
  if (std::sscanf(p + 1, " %c %ld %ld %ld %ld %ld %lu", &state, &ppid, &pgrp, &session, &tty, &tpgid, &flags) != 7) {
    return false;
  }
  return (flags & kPfExiting) != 0;
}

NsLock::NsLock(std::shared_timed_mutex& mu, InterruptScope& scope, bool exclusive) : mu_(mu), exclusive_(exclusive) {
  while (!scope.interrupted()) {
    if (exclusive ? mu.try_lock_for(std::chrono::milliseconds(20))
                  : mu.try_lock_shared_for(std::chrono::milliseconds(20))) {
      held_ = true;
      return;
    }
  }
}

NsLock::~NsLock() {
  if (!held_) return;
  if (exclusive_) {
    mu_.unlock();
  } else {
    mu_.unlock_shared();
  }
}

void FuseClient::Impl::stop() {
  stop_deadline_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                             (std::chrono::steady_clock::now() + kStopGrace).time_since_epoch())
                             .count());
  stopping.store(true);
  {
    std::lock_guard<std::mutex> lock(live_mu);
    for (const auto& w : live) {
      { std::lock_guard<std::mutex> l2(w->mu); }
      w->cv.notify_all();
    }
  }
  table.notify_waiters();
  wb.wake_waiters();
}

bool FuseClient::Impl::stop_grace_over() const {
  if (!stopping.load()) return false;
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch()).count();
  return now >= stop_deadline_ns.load();
}

}  // namespace bftfs::client
