// Stopping an event loop from anywhere: another thread (tests), a signal handler, or libevent's own signal
// events (SIGTERM/SIGINT in daemons). request() only writes to an eventfd, which is async-signal-safe and
// thread-safe; the loop wakes up and breaks at its next iteration.
#pragma once

#include <atomic>

#include "runtime/event_raii.h"
#include "os/unique_fd.h"

namespace bftfs {

class LoopStop {
 public:
  explicit LoopStop(event_base* base);
  LoopStop(const LoopStop&) = delete;
  LoopStop& operator=(const LoopStop&) = delete;

  void request();
  bool requested() const { return requested_.load(std::memory_order_acquire); }
  // Makes SIGTERM and SIGINT request a stop (libevent signal events: one base per process may do this).
  void handle_signals();

 private:
  static void on_wake(int fd, short what, void* arg);
  event_base* base_;
  UniqueFd fd_;
  EventPtr ev_;
  EventPtr sigterm_;
  EventPtr sigint_;
  std::atomic<bool> requested_{false};
};

}  // namespace bftfs
