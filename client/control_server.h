// The mount daemon's end of `bftfs run`'s control protocol (docs/SPECULATION.md §9): a Unix stream socket that
// the supervisor (criu-hooks/control_client.h) connects to, one connection per run. This file is the transport
// and the dispatch only: frames in and out (spec/control_wire.h), the descriptor that comes with ATTACH, the
// "HELLO first" rule, a 100 ms tick, and events queued from any thread. What each request means is the business
// of a ControlSession, which the server's owner makes for every connection.
//
// Threads: one accepts; each connection has its own, which runs the session's handle() and tick() and is the
// only one that writes to the connection's socket. A connection closes when the supervisor closes it, breaks the
// protocol (a frame that does not decode, a request before HELLO, a descriptor with anything but ATTACH or more
// than one descriptor at once), stops reading until its queue passes kControlQueueBytesMax, or when the server
// stops. Every such close that is the peer's fault is logged (LOG_WARN); none crashes the daemon.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "os/unique_fd.h"
#include "spec/control_wire.h"

namespace bftfs::client {

// Pushes a daemon event (COMMITTED, DOOMED, FAILED, ADVICE, WAITS, FATAL) to the supervisor. Thread-safe; may be
// called from any thread at any time, also after the connection closed (then it is dropped). Never blocks on the
// socket: events are queued and written by the connection's thread. Pushing a message that is not an event (a
// reply) is a bug of the caller (asserted): replies are what handle() returns.
//
// Order: events reach the supervisor in the order they were pushed. An event pushed while handle() runs goes out
// when handle() returns, before its reply (the connection's one thread is busy in handle(); the supervisor
// queues events that arrive while it awaits a reply anyway, so nothing it decides is delayed by this).
using EventSink = std::function<void(spec::DaemonMsg)>;

// Frames queued for one connection and not yet written (events, and replies behind them) beyond which the
// supervisor is taken to have stopped reading: the connection is closed rather than the daemon's memory spent.
inline constexpr std::size_t kControlQueueBytesMax = 4u * 1024 * 1024;

// The period of ControlSession::tick() (SPECULATION.md §9: WAITS every 100 ms).
inline constexpr int kControlTickMs = 100;

// One supervisor connection's run, made by the factory when the connection is accepted, destroyed when it closes
// (the supervisor exited or broke the protocol) or the server stops. handle(), tick() and the destructor run on
// the connection's thread; interrupt() is the only call from another thread.
class ControlSession {
 public:
  virtual ~ControlSession() = default;
  // One request; returns its reply (nullopt for ABORT and FINISH, which have none). `fuse` is the descriptor that
  // came with ATTACH (invalid for every other request, and for an ATTACH that came without one). Runs on the
  // connection's thread and may block (it waits for final results of the file service). The first request is
  // always HELLO (the server closes a connection that starts otherwise); everything after it is the session's
  // to judge. A reply should be the one §9 pairs with the request, or FATAL.
  virtual std::optional<spec::DaemonMsg> handle(const spec::SupervisorMsg& m, UniqueFd fuse) = 0;
  // Every kControlTickMs on the connection's thread, between requests, from the connection's start (also before
  // HELLO: the session decides when WAITS make sense). Ticks are not made up: after a long handle() one tick
  // comes at once, the next a period later.
  virtual void tick() = 0;
  // Called once by ~ControlServer from its own thread, possibly while handle() blocks on the connection's
  // thread: make a blocked handle() return soon (the server then destroys the session on the connection's
  // thread). Never called concurrently with the destructor. Default: nothing (handle() is then awaited).
  virtual void interrupt() {}
};

class ControlServer {
 public:
  // Makes the session of a newly accepted connection, with the sink for its events. Called on the accept thread,
  // one connection at a time (so it needs no lock of its own for that), before the connection's thread starts.
  // A nullptr refuses the connection (it is closed at once).
  using Factory = std::function<std::unique_ptr<ControlSession>(EventSink)>;

  // Listens at `path` (mode 0600: root only; a stale socket file nobody serves is replaced; one a live process
  // serves is an error, and so is a path that exists and is not a socket). Returns "" and sets `out`, or the
  // reason (then `out` is untouched and nothing is left at `path` that was not there before).
  [[nodiscard]] static std::string start(const std::string& path, Factory factory, std::unique_ptr<ControlServer>& out);

  // Stops accepting and removes the socket file (if it is still the one this server bound), then ends every
  // connection: shuts its socket down (the supervisor reads EOF), calls its session's interrupt(), and joins its
  // thread, which destroys the session. A handle() in progress is waited for: it returns when the session's
  // interrupt() makes it, or when what it waits for ends (the coordinator's sessions end their waits when the
  // backend stops, which their owner does before destroying the server). Events pushed meanwhile are dropped.
  ~ControlServer();

  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // The socket's path, as given to start().
  const std::string& path() const;
  // Connections accepted so far, and those whose thread still runs (tests wait on these; the server reaps ended
  // connections at least once a second and at each accept).
  std::size_t accepted() const;
  std::size_t live() const;

 private:
  struct Impl;
  explicit ControlServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::client
