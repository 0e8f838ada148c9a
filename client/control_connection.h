// One control connection of the mount's daemon (control_server.h): its event queue and its thread. Private to
// control_server.cc and control_connection.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/control_server.h"
#include "common/types.h"
#include "os/unique_fd.h"
#include "spec/control_wire.h"

namespace bftfs::client {

// The events pushed for one connection and not yet taken by its thread, encoded. Shared by the connection and
// every copy of its EventSink, which may outlive it: once closed, pushes are dropped. Producers never touch the
// socket; they append and wake the connection's thread through an eventfd.
class ControlOutbox {
 public:
  // Returns nullptr (errno set) when no eventfd can be made.
  static std::shared_ptr<ControlOutbox> make();

  // Any thread. Queues `m` (an event: asserted) unless the outbox is closed or full; the first push that would
  // pass kControlQueueBytesMax marks the outbox overflowed instead (the connection closes) and drops it.
  void push(const spec::DaemonMsg& m);
  // The connection's thread: appends every queued frame to `out` and clears the wake-up.
  void take(Bytes& out);
  // True once a push found the outbox full (that push and every later one were dropped).
  bool overflowed();
  std::size_t queued_bytes();
  // The connection's thread, at its end (it polls wake_fd() no more): every later push is dropped.
  void close();
  // Readable while frames are queued (or the outbox overflowed).
  int wake_fd() const { return wake_.get(); }

 private:
  explicit ControlOutbox(UniqueFd wake) : wake_(std::move(wake)) {}

  std::mutex mu_;
  UniqueFd wake_;  // written under mu_; closed by close()
  Bytes queued_;  // guarded by mu_
  bool closed_ = false;    // guarded by mu_
  bool overflow_ = false;  // guarded by mu_
};

// A connection: its socket, session and thread. The server makes it on the accept thread (with the session the
// factory made), starts its thread, asks it to stop from the destroying thread, and joins it.
class ControlConnection {
 public:
  // `stop_fd` is readable once the server stops (it outlives the connection); `live` is decremented when the
  // thread ends (the server's counter, which outlives it too).
  ControlConnection(std::uint64_t id, UniqueFd sock, int stop_fd, std::shared_ptr<ControlOutbox> outbox,
                    std::unique_ptr<ControlSession> session, std::atomic<std::size_t>& live);
  ~ControlConnection();  // joins the thread if start() ran and join() did not (a bug elsewhere otherwise)
  ControlConnection(const ControlConnection&) = delete;
  ControlConnection& operator=(const ControlConnection&) = delete;

  void start();
  // Any thread but the connection's: shuts the socket down and interrupts a blocked handle(). Idempotent.
  void stop();
  void join();
  // True once the thread has ended (its session is destroyed and its socket closed).
  bool done() const { return done_.load(); }

 private:
  // The thread: serve() until the connection ends, then tear down.
  void run();
  // Polls, writes, reads and ticks until the connection ends; returns why when it was the peer's fault.
  std::string serve();
  [[nodiscard]] std::string flush();
  [[nodiscard]] std::string read_some();
  [[nodiscard]] std::string dispatch_frames();
  [[nodiscard]] std::string dispatch(const spec::SupervisorMsg& m, UniqueFd fd);
  [[nodiscard]] std::string claim_descriptor(std::uint64_t start, std::uint64_t end, UniqueFd& fd);
  bool server_stopping() const;

  const std::uint64_t id_;
  const int stop_fd_;
  std::shared_ptr<ControlOutbox> outbox_;
  std::atomic<std::size_t>& live_;
  std::thread thread_;
  std::atomic<bool> done_{false};

  // Guards sock_ and session_ against stop() on another thread: the connection's thread resets both under it
  // at its end, so stop() never shuts down a reused descriptor number or interrupts a destroyed session.
  std::mutex mu_;
  UniqueFd sock_;
  std::unique_ptr<ControlSession> session_;
  bool stopped_ = false;  // guarded by mu_

  // The connection thread's own state.
  spec::ControlFrameSplitter splitter_;
  bool hello_seen_ = false;
  bool peer_closed_ = false;
  Bytes out_;                 // frames being written
  std::size_t out_pos_ = 0;   // bytes of out_ already written
  std::uint64_t received_ = 0;    // bytes read from the socket so far
  std::uint64_t next_frame_ = 0;  // stream offset of the next frame's length prefix
  // A descriptor that arrived with the bytes [fd_from_, fd_until_) of the stream, waiting for the frame it belongs
  // to (claim_descriptor) to be complete.
  UniqueFd pending_fd_;
  std::uint64_t fd_from_ = 0;
  std::uint64_t fd_until_ = 0;
};

}  // namespace bftfs::client
