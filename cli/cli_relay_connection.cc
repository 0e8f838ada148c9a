#include "cli/cli_relay_connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "os/clock.h"

namespace bftfs::cli {

std::string RelayConnection::connect(const std::string& path, std::uint64_t deadline_ms) {
  deadline_ms_ = deadline_ms;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return "socket path too long";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd_.valid()) return std::string("socket: ") + std::strerror(errno);
  if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return "connect " + path + ": " + std::strerror(errno);
  }
  if (std::string err = send(relay::Hello{}); !err.empty()) return err;
  relay::RelayMsg m;
  if (std::string err = receive(m); !err.empty()) return err;
  if (!std::holds_alternative<relay::HelloOk>(m)) return "the relay did not answer HELLO with HELLO_OK";
  hello_ = std::get<relay::HelloOk>(m);
  return "";
}

std::string RelayConnection::send(const relay::MountMsg& m) {
  const Bytes frame = relay::encode_relay_frame(m);
  std::size_t off = 0;
  while (off < frame.size()) {
    const ssize_t w = ::send(fd_.get(), frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return std::string("send: ") + std::strerror(errno);
    off += static_cast<std::size_t>(w);
  }
  return "";
}

std::string RelayConnection::receive(relay::RelayMsg& out) {
  for (;;) {
    Bytes body;
    relay::RelayWireError why = relay::RelayWireError::kOk;
    const auto next = splitter_.next(body, why);
    if (next == relay::FrameSplitter::Next::kBroken) return "relay sent a bad frame length: " + std::string(to_string(why));
    if (next == relay::FrameSplitter::Next::kFrame) {
      if (const auto e = relay::decode_relay_body(body, out); e != relay::RelayWireError::kOk) {
        return "relay sent a malformed frame: " + std::string(to_string(e));
      }
      return "";
    }
    const std::uint64_t now = mono_ms();
    if (now >= deadline_ms_) return "timed out waiting for the relay";
    pollfd pfd{fd_.get(), POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::min<std::uint64_t>(deadline_ms_ - now, 1000)));
    if (r < 0 && errno != EINTR) return std::string("poll: ") + std::strerror(errno);
    if (r <= 0) continue;
    std::uint8_t buf[65536];
    const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::string("recv: ") + std::strerror(errno);
    if (n == 0) return "the relay closed the connection";
    splitter_.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
  }
}

}  // namespace bftfs::cli
