// One control connection (control_connection.h): the event queue, and the thread that reads requests, runs the
// session and writes replies and events.
#include "client/control_connection.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/assert.h"
#include "common/log.h"
#include "os/clock.h"

namespace bftfs::client {
namespace {

// Room for a few descriptors: a peer that sends more than one is refused, and the ones it sent must be received
// to be closed (the kernel closes only those that do not fit, and flags MSG_CTRUNC).
constexpr std::size_t kFdsMax = 4;
// One read: the largest frame, so a request never needs more than two reads.
constexpr std::size_t kReadBytes = 4 + spec::kControlBodyBytesMax;

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string type_text(spec::ControlType t) { return std::to_string(static_cast<int>(t)); }

// Moves every descriptor of the control messages of `msg` into `fds` (so that each is closed whatever happens).
// Returns "" or why the control data is not what the protocol allows (only SCM_RIGHTS is).
std::string take_descriptors(msghdr& msg, std::vector<UniqueFd>& fds) {
  std::string why;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      why = "unexpected control data (level " + std::to_string(c->cmsg_level) + ", type " +
            std::to_string(c->cmsg_type) + ")";
      continue;  // later messages may still hold descriptors to close
    }
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; i++) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.emplace_back(fd);
    }
  }
  if (!why.empty()) return why;
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return "control data truncated (too many descriptors)";
  if (fds.size() > 1) return std::to_string(fds.size()) + " descriptors in one message";
  return "";
}

}  // namespace

// ---- ControlOutbox ----

std::shared_ptr<ControlOutbox> ControlOutbox::make() {
  UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return nullptr;
  return std::shared_ptr<ControlOutbox>(new ControlOutbox(std::move(wake)));
}

void ControlOutbox::push(const spec::DaemonMsg& m) {
  BFT_ASSERT(spec::is_event(m));
  // Encoded here, on the producer's thread, so the bound counts bytes and the connection only copies.
  const Bytes frame = spec::encode_control_frame(m);
  std::lock_guard lock(mu_);
  if (closed_ || overflow_) return;
  const bool was_empty = queued_.empty();
  if (queued_.size() + frame.size() > kControlQueueBytesMax) {
    overflow_ = true;
  } else {
    queued_.insert(queued_.end(), frame.begin(), frame.end());
  }
  // Wake the connection once per batch; it clears the eventfd when it takes the batch.
  if (was_empty || overflow_) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);  // EAGAIN only if already woken
  }
}

void ControlOutbox::take(Bytes& out) {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(wake_.get(), &count, sizeof count);  // clears the wake-up, if any
  std::lock_guard lock(mu_);
  out.insert(out.end(), queued_.begin(), queued_.end());
  queued_.clear();
}

bool ControlOutbox::overflowed() {
  std::lock_guard lock(mu_);
  return overflow_;
}

std::size_t ControlOutbox::queued_bytes() {
  std::lock_guard lock(mu_);
  return queued_.size();
}

void ControlOutbox::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  queued_.clear();
  wake_.reset();  // sinks may live on for long; they need no descriptor to drop events
}

// ---- ControlConnection: life ----

ControlConnection::ControlConnection(std::uint64_t id, UniqueFd sock, int stop_fd,
                                     std::shared_ptr<ControlOutbox> outbox, std::unique_ptr<ControlSession> session,
                                     std::atomic<std::size_t>& live)
    : id_(id), stop_fd_(stop_fd), outbox_(std::move(outbox)), live_(live), sock_(std::move(sock)),
      session_(std::move(session)) {
  BFT_ASSERT(sock_.valid());
  BFT_ASSERT(session_ != nullptr);
  BFT_ASSERT(outbox_ != nullptr);
}

ControlConnection::~ControlConnection() {
  if (thread_.joinable()) thread_.join();
}

void ControlConnection::start() {
  BFT_ASSERT(!thread_.joinable());
  thread_ = std::thread([this] { run(); });
}

void ControlConnection::stop() {
  std::lock_guard lock(mu_);
  if (stopped_) return;
  stopped_ = true;
  // The supervisor reads EOF at once, even while handle() blocks; the connection's thread sees the server's
  // stop descriptor when it polls next.
  if (sock_.valid()) ::shutdown(sock_.get(), SHUT_RDWR);
  if (session_ != nullptr) session_->interrupt();
}

void ControlConnection::join() {
  if (thread_.joinable()) thread_.join();
}

void ControlConnection::run() {
  const std::string why = serve();
  // A connection the server ends may fail on its way out (its socket was shut down under it): not worth a warning.
  if (!why.empty() && !server_stopping())
    LOG_WARN("", "control connection %llu closed: %s", static_cast<unsigned long long>(id_), why.c_str());
  outbox_->close();
  {
    std::lock_guard lock(mu_);
    session_.reset();  // may push events: the outbox is closed, so they are dropped
    sock_.reset();
  }
  live_.fetch_sub(1);
  done_.store(true);
}

bool ControlConnection::server_stopping() const {
  pollfd p{stop_fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

// ---- ControlConnection: the loop ----

std::string ControlConnection::serve() {
  const int sock = sock_.get();  // stays open until run() resets it after serve() returns
  std::uint64_t next_tick = mono_ms() + kControlTickMs;
  for (;;) {
    const std::uint64_t now = mono_ms();
    const int timeout = now >= next_tick ? 0 : static_cast<int>(next_tick - now);
    // While a batch is being written, new events wait in the outbox (and its wake-up is not polled, or it would
    // spin): POLLOUT says when the supervisor reads again. So a supervisor that stops reading makes them pile up
    // there, and the bound below closes the connection.
    const bool writing = out_pos_ < out_.size();
    pollfd fds[3] = {{sock, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0},
                     {writing ? -1 : outbox_->wake_fd(), POLLIN, 0},
                     {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 3, timeout) < 0 && errno != EINTR) return errno_text("poll");
    if ((fds[2].revents & POLLIN) != 0) return "";  // the server stops: not the peer's fault, nothing to log
    if (outbox_->overflowed() || out_.size() - out_pos_ + outbox_->queued_bytes() > kControlQueueBytesMax)
      return "the supervisor does not read (over " + std::to_string(kControlQueueBytesMax) + " bytes queued)";
    if (!writing && (fds[1].revents & POLLIN) != 0) {
      out_.clear();
      out_pos_ = 0;
      outbox_->take(out_);
    }
    if (std::string err = flush(); !err.empty()) return err;
    if (!peer_closed_ && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      if (std::string err = read_some(); !err.empty()) return err;
    }
    if (peer_closed_) return "";  // the supervisor exited or closed: the normal end of a run
    if (mono_ms() >= next_tick) {
      session_->tick();
      next_tick = mono_ms() + kControlTickMs;
    }
  }
}

// Writes what the socket takes now, without waiting. Returns "" (and sets peer_closed_ when the supervisor is
// gone: it exited with events still on their way, the normal end of a run) or why the connection is unusable.
std::string ControlConnection::flush() {
  while (!peer_closed_ && out_pos_ < out_.size()) {
    const ssize_t n = ::send(sock_.get(), out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      peer_closed_ = true;
      return "";
    }
    if (n < 0) return errno_text("write to the supervisor");
    out_pos_ += static_cast<std::size_t>(n);
  }
  return "";
}

// Reads once (the socket said it is readable), with any descriptor that came along, and runs the frames that
// are complete. Returns "" (and sets peer_closed_ when the supervisor closed the connection) or why it broke.
std::string ControlConnection::read_some() {
  std::vector<std::uint8_t> buf(kReadBytes);
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(kFdsMax * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(sock_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return "";
  if (n < 0 && errno == ECONNRESET) {
    peer_closed_ = true;
    return "";
  }
  if (n < 0) return errno_text("read from the supervisor");
  std::vector<UniqueFd> fds;
  if (std::string why = take_descriptors(msg, fds); !why.empty()) return why;
  if (n == 0) {
    peer_closed_ = true;
    return "";
  }
  const std::uint64_t from = received_;
  received_ += static_cast<std::uint64_t>(n);
  if (!fds.empty()) {
    // One request at a time: a second descriptor before the first one's frame is complete is not the protocol.
    if (pending_fd_.valid()) return "a descriptor arrived while another still waited for its frame";
    pending_fd_ = std::move(fds.front());
    fd_from_ = from;
    fd_until_ = received_;
  }
  splitter_.append(std::span<const std::uint8_t>(buf.data(), static_cast<std::size_t>(n)));
  return dispatch_frames();
}

// Runs every complete frame in the splitter, in order, while the supervisor is there to read the replies.
std::string ControlConnection::dispatch_frames() {
  while (!peer_closed_) {
    Bytes body;
    spec::ControlWireError why = spec::ControlWireError::kOk;
    const auto step = splitter_.next(body, why);
    if (step == spec::ControlFrameSplitter::Step::kBroken)
      return "bad frame length: " + std::string(spec::to_string(why));
    if (step == spec::ControlFrameSplitter::Step::kNeedMore) break;
    const std::uint64_t start = next_frame_;
    next_frame_ += spec::kControlLengthBytes + body.size();
    UniqueFd fd;
    if (std::string err = claim_descriptor(start, next_frame_, fd); !err.empty()) return err;
    spec::SupervisorMsg m;
    if (const auto e = spec::decode_supervisor_body(body, m); e != spec::ControlWireError::kOk)
      return "bad frame: " + std::string(spec::to_string(e));
    if (std::string err = dispatch(m, std::move(fd)); !err.empty()) return err;
  }
  return "";
}

// The descriptor that belongs to the frame at stream offsets [start, end), if one does (into `fd`).
//
// Which frame a descriptor came with: the kernel hands a descriptor over with the read that reaches the first
// byte of the message that carried it, and ends that read with that message, so it is the last message in the
// read; bytes of earlier messages may precede it in the same read. The supervisor sends each frame, with its
// descriptor, in one message. So the descriptor belongs to the frame holding the read's last byte, and that
// frame must start within the read (else the descriptor came with no frame's first byte).
std::string ControlConnection::claim_descriptor(std::uint64_t start, std::uint64_t end, UniqueFd& fd) {
  if (!pending_fd_.valid()) return "";
  const std::uint64_t last = fd_until_ - 1;
  if (last < start || last >= end) return "";
  if (start < fd_from_) return "a descriptor arrived without the start of a frame";
  fd = std::move(pending_fd_);
  return "";
}

// One decoded request: the transport's rules, the session, and its reply queued behind the events before it.
std::string ControlConnection::dispatch(const spec::SupervisorMsg& m, UniqueFd fd) {
  const spec::ControlType type = spec::control_type(m);
  if (!hello_seen_ && type != spec::ControlType::kHello) return "request " + type_text(type) + " before HELLO";
  hello_seen_ = true;
  if (fd.valid() && type != spec::ControlType::kAttach)
    return "a descriptor came with request " + type_text(type) + " (only ATTACH carries one)";
  std::optional<spec::DaemonMsg> reply = session_->handle(m, std::move(fd));
  if (!reply.has_value()) return "";
  // Events pushed before (and during) handle() go first: the reply is the last frame of this batch.
  // (The bound on what waits to be written is checked by serve() before it reads the next request.)
  outbox_->take(out_);
  const Bytes frame = spec::encode_control_frame(*reply);
  out_.insert(out_.end(), frame.begin(), frame.end());
  return flush();
}

}  // namespace bftfs::client
