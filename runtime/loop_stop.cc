#include "runtime/loop_stop.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "common/assert.h"

namespace bftfs {

LoopStop::LoopStop(event_base* base) : base_(base), fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  BFT_ASSERT(fd_.valid());
  ev_.reset(event_new(base_, fd_.get(), EV_READ | EV_PERSIST, &LoopStop::on_wake, this));
  BFT_ASSERT(ev_ != nullptr);
  event_priority_set(ev_.get(), kPriorityIo);
  BFT_ASSERT(event_add(ev_.get(), nullptr) == 0);
}

void LoopStop::request() {
  requested_.store(true, std::memory_order_release);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(fd_.get(), &one, sizeof one);
}

void LoopStop::on_wake(int fd, short, void* arg) {
  auto* self = static_cast<LoopStop*>(arg);
  std::uint64_t v = 0;
  [[maybe_unused]] const ssize_t r = ::read(fd, &v, sizeof v);
  self->requested_.store(true, std::memory_order_release);
  event_base_loopbreak(self->base_);
}

void LoopStop::handle_signals() {
  auto cb = [](int, short, void* arg) { static_cast<LoopStop*>(arg)->request(); };
  sigterm_.reset(evsignal_new(base_, SIGTERM, cb, this));
  sigint_.reset(evsignal_new(base_, SIGINT, cb, this));
  BFT_ASSERT(sigterm_ != nullptr && sigint_ != nullptr);
  BFT_ASSERT(event_add(sigterm_.get(), nullptr) == 0);
  BFT_ASSERT(event_add(sigint_.get(), nullptr) == 0);
  ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace bftfs
