#include "client/relay_backend.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "common/assert.h"
#include "common/log.h"
#include "relay/relay_wire.h"

namespace bftfs::client {

namespace {

constexpr int kBackoffMsMin = 50;
constexpr int kBackoffMsMax = 2000;

// A non-blocking, close-on-exec Unix stream socket connected to `path`, or -1 (errno set).
int connect_unix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  const int fl = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  return fd;
}

void append(Bytes& out, const Bytes& frame) { out.insert(out.end(), frame.begin(), frame.end()); }

}  // namespace

RelayBackend::RelayBackend(std::string socket_path) : path_(std::move(socket_path)) {
  int p[2];
  BFT_ASSERT(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
  wake_read_.reset(p[0]);
  wake_write_.reset(p[1]);
  io_ = std::thread([this] { run(); });
}

RelayBackend::~RelayBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake();
  io_.join();
}

void RelayBackend::wake() {
  const char c = 1;
  // A full pipe already holds a wakeup: EAGAIN is fine.
  (void)!::write(wake_write_.get(), &c, 1);
}

std::uint64_t RelayBackend::submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) {
  BFT_ASSERT(callbacks.on_final != nullptr);
  InFlight f;
  f.request = fs::encode_request(request);
  BFT_ASSERT(f.request.size() <= relay::kSubmitRequestBytesMax);
  f.flags = static_cast<std::uint8_t>((options.read_only ? relay::kFlagReadOnly : 0) |
                                      (options.want_first ? relay::kFlagReportFirst : 0));
  f.deps = options.deps;
  f.callbacks = std::move(callbacks);
  std::uint64_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tag = next_tag_++;
    inflight_.emplace(tag, std::move(f));
    to_send_.push_back(tag);
  }
  wake();
  return tag;
}

void RelayBackend::cancel(std::uint64_t tag) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inflight_.erase(tag) == 0) return;  // already final
    to_cancel_.push_back(tag);
  }
  wake();
}

std::uint32_t RelayBackend::client_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return client_id_;
}

bool RelayBackend::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_;
}

std::string RelayBackend::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out << "backend relay " << path_ << "\nconnected " << (ready_ ? 1 : 0) << "\nconnections " << connections_
      << "\nclient_id " << client_id_ << "\nreplicas " << n_ << "\nf " << f_ << "\nin_flight " << inflight_.size()
      << "\nfinals " << finals_ << "\n";
  return out.str();
}

void RelayBackend::drain_wake() {
  char buf[64];
  while (::read(wake_read_.get(), buf, sizeof(buf)) > 0) {
  }
}

void RelayBackend::run() {
  int backoff_ms = kBackoffMsMin;
  bool warned = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    const int fd = connect_unix(path_);
    if (fd >= 0) {
      backoff_ms = kBackoffMsMin;
      warned = false;
      serve_connection(fd);
      ::close(fd);
      continue;
    }
    if (!warned) {
      LOG_WARN("", "relay backend: cannot connect to %s (%s); retrying", path_.c_str(), std::strerror(errno));
      warned = true;
    }
    // Sleep, but wake for stop.
    pollfd p{wake_read_.get(), POLLIN, 0};
    (void)::poll(&p, 1, backoff_ms);
    drain_wake();
    backoff_ms = std::min(backoff_ms * 2, kBackoffMsMax);
  }
}

void RelayBackend::serve_connection(int fd) {
  Bytes out = relay::encode_relay_frame(relay::MountMsg{relay::Hello{}});
  std::size_t out_pos = 0;
  relay::FrameSplitter splitter;
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
    connections_ += 1;
  }
  for (;;) {
    if (!take_outgoing(ready, out)) return;
    pollfd p[2] = {{fd, static_cast<short>(POLLIN | (out_pos < out.size() ? POLLOUT : 0)), 0},
                   {wake_read_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG_WARN("", "relay backend: poll: %s", std::strerror(errno));
      return;
    }
    if ((p[1].revents & POLLIN) != 0) drain_wake();
    if ((p[0].revents & POLLOUT) != 0 && out_pos < out.size() && !send_some(fd, out, out_pos)) return;
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !receive(fd, splitter, ready)) return;
  }
}

bool RelayBackend::take_outgoing(bool ready, Bytes& out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  if (!ready) return true;  // nothing but HELLO goes before HELLO_OK
  // New submissions and cancellations go out in the order they were made.
  for (const std::uint64_t tag : to_cancel_) {
    append(out, relay::encode_relay_frame(relay::MountMsg{relay::Cancel{tag}}));
  }
  to_cancel_.clear();
  for (const std::uint64_t tag : to_send_) {
    auto it = inflight_.find(tag);
    if (it == inflight_.end()) continue;  // cancelled before it went out
    relay::Submit s;
    s.tag = tag;
    s.flags = it->second.flags;
    s.deps = it->second.deps;
    s.request = it->second.request;
    append(out, relay::encode_relay_frame(relay::MountMsg{std::move(s)}));
  }
  to_send_.clear();
  return true;
}

bool RelayBackend::send_some(int fd, Bytes& out, std::size_t& out_pos) {
  const ssize_t n = ::send(fd, out.data() + out_pos, out.size() - out_pos, MSG_NOSIGNAL);
  if (n < 0 && errno != EAGAIN && errno != EINTR) {
    LOG_WARN("", "relay backend: send: %s; reconnecting", std::strerror(errno));
    return false;
  }
  if (n > 0) out_pos += static_cast<std::size_t>(n);
  if (out_pos == out.size()) {
    out.clear();
    out_pos = 0;
  }
  return true;
}

bool RelayBackend::receive(int fd, relay::FrameSplitter& splitter, bool& ready) {
  std::uint8_t buf[65536];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    LOG_WARN("", "relay backend: connection to %s closed; reconnecting", path_.c_str());
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
    return false;
  }
  if (n > 0) splitter.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
  for (;;) {
    Bytes body;
    relay::RelayWireError why = relay::RelayWireError::kOk;
    const auto next = splitter.next(body, why);
    if (next == relay::FrameSplitter::Next::kNeedMore) return true;
    if (next == relay::FrameSplitter::Next::kBroken) {
      LOG_ERROR("", "relay backend: bad frame from the relay (%s); reconnecting",
                std::string(relay::to_string(why)).c_str());
      return false;
    }
    if (ready) {
      if (!handle_frame(body)) return false;
      continue;
    }
    if (!handle_hello(body)) return false;
    ready = true;
  }
}

bool RelayBackend::handle_hello(const Bytes& body) {
  relay::RelayMsg m;
  const auto e = relay::decode_relay_body(body, m);
  const auto* ok = std::get_if<relay::HelloOk>(&m);
  if (e != relay::RelayWireError::kOk || ok == nullptr) {
    LOG_ERROR("", "relay backend: expected HELLO_OK from the relay; reconnecting");
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = true;
  client_id_ = ok->client_id;
  n_ = ok->n;
  f_ = ok->f;
  // Everything without a FINAL goes (again) to this relay, in tag order: the mount's order.
  to_send_.clear();
  to_cancel_.clear();
  for (const auto& kv : inflight_) to_send_.push_back(kv.first);
  LOG_INFO("", "relay backend: connected to %s (client %u, n=%u f=%u), %zu requests to (re)send",
           path_.c_str(), client_id_, n_, f_, to_send_.size());
  return true;
}

bool RelayBackend::handle_frame(const Bytes& body) {
  relay::RelayMsg m;
  const auto e = relay::decode_relay_body(body, m);
  if (e != relay::RelayWireError::kOk) {
    LOG_ERROR("", "relay backend: undecodable frame from the relay (%s); reconnecting",
              std::string(relay::to_string(e)).c_str());
    return false;
  }
  if (const auto* first = std::get_if<relay::First>(&m)) {
    std::function<void(const fs::Result&)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = inflight_.find(first->tag);
      if (it == inflight_.end()) return true;  // cancelled
      cb = it->second.callbacks.on_first;
    }
    if (!cb) return true;
    fs::Result r;
    if (fs::decode_result(first->result, r) != fs::FsDecodeError::kOk) {
      LOG_ERROR("", "relay backend: undecodable FIRST result for tag %llu",
                static_cast<unsigned long long>(first->tag));
      return true;
    }
    cb(r);
    return true;
  }
  if (const auto* fin = std::get_if<relay::Final>(&m)) {
    Callbacks cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = inflight_.find(fin->tag);
      if (it == inflight_.end()) return true;  // cancelled, or a FINAL from before a resubmission
      cb = std::move(it->second.callbacks);
      inflight_.erase(it);
      finals_ += 1;
    }
    Final out;
    if (fin->status == relay::FinalStatus::kRefused) {
      out.status = FinalStatus::kRefused;
      out.reason.assign(fin->result.begin(), fin->result.end());
    } else {
      out.status = fin->status == relay::FinalStatus::kCommitted ? FinalStatus::kCommitted : FinalStatus::kRolledBack;
      const auto de = fs::decode_result(fin->result, out.result);
      if (de != fs::FsDecodeError::kOk) {
        out.status = FinalStatus::kRefused;
        out.reason = "the relay forwarded an undecodable result (" + std::string(fs::to_string(de)) + ")";
      }
    }
    cb.on_final(std::move(out));
    return true;
  }
  if (std::holds_alternative<relay::StatusReply>(m)) return true;  // not asked by this backend today
  LOG_ERROR("", "relay backend: unexpected frame type from the relay; reconnecting");
  return false;
}

}  // namespace bftfs::client
