#include "criu-hooks/control_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/assert.h"
#include "os/clock.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string type_name(spec::ControlType t) { return std::to_string(static_cast<int>(t)); }

// Sends all of `bytes`, the first piece carrying `pass_fd` (SCM_RIGHTS) if it is >= 0.
std::string send_all(int sock, const Bytes& bytes, int pass_fd) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    iovec iov{const_cast<std::uint8_t*>(bytes.data() + off), bytes.size() - off};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (off == 0 && pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_text("send to the daemon");
    off += static_cast<std::size_t>(n);
  }
  return "";
}

}  // namespace

std::string ControlClient::connect(const std::string& path, std::unique_ptr<ControlClient>& out,
                                   int* connect_errno) {
  if (connect_errno != nullptr) *connect_errno = 0;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return "control socket path too long: " + path;
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_text("socket");
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int saved = errno;
    if (connect_errno != nullptr) *connect_errno = saved;
    return "connect to the mount's daemon at " + path + ": " + std::strerror(saved);
  }
  out.reset(new ControlClient(std::move(fd)));
  return "";
}

std::unique_ptr<ControlClient> ControlClient::adopt(UniqueFd fd) {
  BFT_ASSERT(fd.valid());
  return std::unique_ptr<ControlClient>(new ControlClient(std::move(fd)));
}

std::string ControlClient::fail(std::string why) {
  if (broken_.empty()) broken_ = std::move(why);
  return broken_;
}

std::string ControlClient::send(const spec::SupervisorMsg& request) {
  if (!broken_.empty()) return broken_;
  if (std::string err = send_all(fd_.get(), spec::encode_control_frame(request), -1); !err.empty())
    return fail(err);
  return "";
}

std::string ControlClient::call(const spec::SupervisorMsg& request, spec::ControlType reply, spec::DaemonMsg& out,
                                int pass_fd, int timeout_ms) {
  if (!broken_.empty()) return broken_;
  if (std::string err = send_all(fd_.get(), spec::encode_control_frame(request), pass_fd); !err.empty())
    return fail(err);
  awaiting_ = true;
  awaited_ = reply;
  have_reply_ = false;
  const std::uint64_t deadline = mono_ms() + static_cast<std::uint64_t>(timeout_ms);
  while (!have_reply_ && broken_.empty()) {
    const std::uint64_t now = mono_ms();
    if (now >= deadline) {
      awaiting_ = false;
      return fail("the daemon did not answer request " + type_name(spec::control_type(request)) + " within " +
                  std::to_string(timeout_ms) + " ms");
    }
    read_once(static_cast<int>(deadline - now));
  }
  awaiting_ = false;
  if (!broken_.empty()) return broken_;
  out = std::move(reply_);
  return "";
}

std::string ControlClient::read_events() {
  if (!broken_.empty()) return broken_;
  return read_once(0);
}

bool ControlClient::next_event(spec::DaemonMsg& out) {
  if (events_.empty()) return false;
  out = std::move(events_.front());
  events_.pop_front();
  return true;
}

std::string ControlClient::read_once(int timeout_ms) {
  pollfd p{fd_.get(), POLLIN, 0};
  const int ready = ::poll(&p, 1, timeout_ms);
  if (ready < 0 && errno != EINTR) return fail(errno_text("poll the daemon"));
  if (ready <= 0) return "";
  std::uint8_t buf[65536];
  const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return "";
  if (n < 0) return fail(errno_text("read from the daemon"));
  if (n == 0) return fail("the daemon closed the control connection");
  splitter_.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
  for (;;) {
    Bytes body;
    spec::ControlWireError why = spec::ControlWireError::kOk;
    const auto step = splitter_.next(body, why);
    if (step == spec::ControlFrameSplitter::Step::kNeedMore) return "";
    if (step == spec::ControlFrameSplitter::Step::kBroken)
      return fail("bad frame from the daemon: " + std::string(spec::to_string(why)));
    spec::DaemonMsg msg;
    if (const auto e = spec::decode_daemon_body(body, msg); e != spec::ControlWireError::kOk)
      return fail("bad frame from the daemon: " + std::string(spec::to_string(e)));
    if (const auto* fatal = std::get_if<spec::Fatal>(&msg)) return fail("the daemon gave up: " + fatal->reason);
    if (spec::is_event(msg)) {
      events_.push_back(std::move(msg));
      continue;
    }
    if (!awaiting_ || have_reply_ || spec::control_type(msg) != awaited_)
      return fail("unexpected reply " + type_name(spec::control_type(msg)) + " from the daemon");
    reply_ = std::move(msg);
    have_reply_ = true;
  }
}

}  // namespace bftfs::criu
