// RAII owners for the libevent objects the runtime uses. Each frees its object exactly once; none is copyable.
// They hold no logic: the transport and runtimes decide what the events do.
#pragma once

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include <memory>

namespace bftfs {

struct EventBaseDeleter {
  void operator()(event_base* b) const { event_base_free(b); }
};
struct EventDeleter {
  void operator()(event* e) const { event_free(e); }  // event_free also removes a pending event
};
struct BufferEventDeleter {
  void operator()(bufferevent* b) const { bufferevent_free(b); }  // closes the socket (BEV_OPT_CLOSE_ON_FREE)
};
struct EventConfigDeleter {
  void operator()(event_config* c) const { event_config_free(c); }
};
struct ListenerDeleter {
  void operator()(evconnlistener* l) const { evconnlistener_free(l); }
};

using EventBasePtr = std::unique_ptr<event_base, EventBaseDeleter>;
using EventPtr = std::unique_ptr<event, EventDeleter>;
using BufferEventPtr = std::unique_ptr<bufferevent, BufferEventDeleter>;
using ListenerPtr = std::unique_ptr<evconnlistener, ListenerDeleter>;
using EventConfigPtr = std::unique_ptr<event_config, EventConfigDeleter>;

// Event priorities of every runtime's event_base (event_base_priority_init(base, kPriorityCount)). libevent
// runs only the most urgent non-empty priority per loop iteration, so work at kPriorityLate (freeing closed
// connections) happens after every socket and timer callback of the pass that may still refer to it. The
// group-commit flush itself is not an event: the runtimes run one pass at a time (EVLOOP_ONCE) and flush
// after it.
inline constexpr int kPriorityIo = 0;
inline constexpr int kPriorityLate = 1;
inline constexpr int kPriorityCount = 2;

// A base with the priorities above. Returns null on failure (out of memory or no backend).
//
// Timer precision. By default libevent reads CLOCK_MONOTONIC_COARSE (one jiffy, 4 ms on this kernel) and
// rounds epoll timeouts up to whole milliseconds, which is fine for ticks and retransmissions but not for
// emulating a 2.5 ms wide-area delay (runtime/wan.h). `precise_timer` sets EVENT_BASE_FLAG_PRECISE_TIMER:
// libevent then reads CLOCK_MONOTONIC and waits on a timerfd with nanosecond resolution, at the cost of one
// timerfd_settime per loop pass. The runtimes ask for it only when WAN emulation is on, so LAN runs keep the
// loop exactly as it was.
EventBasePtr make_event_base(bool precise_timer = false);

}  // namespace bftfs
