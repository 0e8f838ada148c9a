// A blocking client connection to a relay's Unix socket (the protocol is docs/RELAY.md), for `bftfs fsop`:
// HELLO at connect, then frames in and out, every wait bounded by one deadline.
#pragma once

#include <cstdint>
#include <string>

#include "os/unique_fd.h"
#include "relay/relay_wire.h"

namespace bftfs::cli {

class RelayConnection {
 public:
  // Connects to `path` and exchanges HELLO / HELLO_OK; every later wait ends at `deadline_ms` (os/clock.h
  // mono_ms). Returns "" or why it failed.
  [[nodiscard]] std::string connect(const std::string& path, std::uint64_t deadline_ms);
  // Sends one frame. Returns "" or why it failed.
  [[nodiscard]] std::string send(const relay::MountMsg& m);
  // Waits for the next frame from the relay (until the deadline). Returns "" or why none came.
  [[nodiscard]] std::string receive(relay::RelayMsg& out);
  const relay::HelloOk& hello() const { return hello_; }

 private:
  UniqueFd fd_;
  relay::FrameSplitter splitter_;
  relay::HelloOk hello_;
  std::uint64_t deadline_ms_ = 0;
};

}  // namespace bftfs::cli
