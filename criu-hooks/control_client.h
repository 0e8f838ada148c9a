// The supervisor's end of the control connection to the mount's daemon (docs/SPECULATION.md §9;
// spec/control_wire.h): one request at a time, whose reply it waits for; the daemon's events (COMMITTED,
// FAILED, ADVICE, WAITS, ...) may arrive at any time, also while a reply is awaited, and are queued in order.
// A frame that does not decode, a reply nobody asked for, or FATAL breaks the connection for good: every later
// call fails with the first reason.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "os/unique_fd.h"
#include "spec/control_wire.h"

namespace bftfs::criu {

class ControlClient {
 public:
  // Connects to the daemon's control socket (a Unix stream socket at `path`). Returns "" or what failed; then
  // `connect_errno` (if given) holds the errno of the failed socket call (ENOENT, ECONNREFUSED: nobody serves it).
  [[nodiscard]] static std::string connect(const std::string& path, std::unique_ptr<ControlClient>& out,
                                           int* connect_errno = nullptr);
  // Adopts a connected stream socket (tests: one end of a socket pair).
  static std::unique_ptr<ControlClient> adopt(UniqueFd fd);

  // Sends `request` (with `pass_fd` attached, if >= 0) and waits up to `timeout_ms` for the reply of type
  // `reply`, queueing the events that arrive meanwhile. Returns "" or why there is no reply.
  [[nodiscard]] std::string call(const spec::SupervisorMsg& request, spec::ControlType reply, spec::DaemonMsg& out,
                                 int pass_fd = -1, int timeout_ms = kReplyTimeoutMs);
  // Sends a request that has no reply (ABORT, FINISH).
  [[nodiscard]] std::string send(const spec::SupervisorMsg& request);
  // Reads whatever has arrived, without waiting, into the event queue. Returns "" or why the connection broke.
  [[nodiscard]] std::string read_events();
  // The oldest queued event, if any.
  bool next_event(spec::DaemonMsg& out);
  // The descriptor to poll for readability.
  int fd() const { return fd_.get(); }
  // Why the connection is broken, or "".
  const std::string& broken() const { return broken_; }

  // A reply is due quickly: the daemon answers from its own state (HELLO waits for one RESERVE's final).
  static constexpr int kReplyTimeoutMs = 60'000;

 private:
  explicit ControlClient(UniqueFd fd) : fd_(std::move(fd)) {}
  // Reads once (waiting up to timeout_ms for data) and splits frames: replies go to `reply_slot` when awaited.
  std::string read_once(int timeout_ms);
  std::string fail(std::string why);

  UniqueFd fd_;
  spec::ControlFrameSplitter splitter_;
  std::deque<spec::DaemonMsg> events_;
  bool awaiting_ = false;
  spec::ControlType awaited_ = spec::ControlType::kHelloOk;
  bool have_reply_ = false;
  spec::DaemonMsg reply_;
  std::string broken_;
};

}  // namespace bftfs::criu
