// The control socket of the mount's daemon (control_server.h): binding it, the accept thread, and the shutdown
// that ends every connection. One connection's own work is in control_connection.cc.
#include "client/control_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "client/control_connection.h"
#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {
namespace {

// How often the accept thread wakes without a connection, to join the threads of connections that ended.
constexpr int kReapIntervalMs = 1000;

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Removes the socket file at `path` if nobody serves it (a daemon that died left it). Returns "" or why the path
// cannot be used: a live process serves it, or it is not a socket.
std::string clear_stale(const std::string& path, const sockaddr_un& addr) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : errno_text("stat " + path);
  if (!S_ISSOCK(st.st_mode)) return path + " exists and is not a socket";
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return errno_text("socket");
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0)
    return "another process serves the control socket " + path;
  if (errno != ECONNREFUSED) return errno_text("probe the control socket " + path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_text("remove the stale socket " + path);
  return "";
}

// Binds and listens at `path` with mode 0600. The mode is set on the socket before bind (Linux gives the file
// the socket inode's mode, less the umask), so the file is never open to others, not even for a moment; the
// chmod after bind makes it exactly 0600 whatever the umask.
std::string bind_listener(const std::string& path, UniqueFd& out, struct stat& bound) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return "control socket path must be 1.." + std::to_string(sizeof addr.sun_path - 1) + " bytes: '" + path + "'";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (std::string err = clear_stale(path, addr); !err.empty()) return err;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_text("socket");
  if (::fchmod(fd.get(), 0600) != 0) return errno_text("fchmod the control socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    return errno_text("bind " + path);
  if (::chmod(path.c_str(), 0600) != 0 || ::lstat(path.c_str(), &bound) != 0 || ::listen(fd.get(), 16) != 0) {
    const std::string err = errno_text("set up the control socket " + path);
    ::unlink(path.c_str());
    return err;
  }
  out = std::move(fd);
  return "";
}

}  // namespace

struct ControlServer::Impl {
  std::string path;
  Factory factory;
  UniqueFd listener;
  struct stat bound{};  // the socket file as bound: removed at the end only if it is still this one
  UniqueFd stop;        // an eventfd, readable once the server stops; every thread polls it
  std::thread acceptor;
  std::atomic<std::size_t> accepted{0};
  std::atomic<std::size_t> live{0};
  std::mutex mu;                                           // guards connections
  std::list<std::unique_ptr<ControlConnection>> connections;  // started, not yet joined

  void accept_loop();
  void accept_one();
  void reap();
  void remove_socket_file();
};

void ControlServer::Impl::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener.get(), POLLIN, 0}, {stop.get(), POLLIN, 0}};
    if (::poll(fds, 2, kReapIntervalMs) < 0 && errno != EINTR) {
      LOG_WARN("", "control socket %s: poll: %s; no longer accepting", path.c_str(), std::strerror(errno));
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    reap();
    if ((fds[0].revents & POLLIN) != 0) accept_one();
  }
}

// Accepts one connection, if one is waiting, and starts its thread with the session the factory makes for it.
void ControlServer::Impl::accept_one() {
  UniqueFd sock(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!sock.valid()) {
    // EAGAIN: someone else's connect was withdrawn; EMFILE and the like: the next poll tries again.
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      LOG_WARN("", "control socket %s: accept: %s", path.c_str(), std::strerror(errno));
    return;
  }
  const std::uint64_t id = accepted.fetch_add(1) + 1;
  std::shared_ptr<ControlOutbox> outbox = ControlOutbox::make();
  if (outbox == nullptr) {
    LOG_WARN("", "control connection %llu refused: eventfd: %s", static_cast<unsigned long long>(id),
             std::strerror(errno));
    return;
  }
  std::unique_ptr<ControlSession> session = factory([outbox](spec::DaemonMsg m) { outbox->push(m); });
  if (session == nullptr) {
    LOG_WARN("", "control connection %llu refused by the daemon", static_cast<unsigned long long>(id));
    return;
  }
  live.fetch_add(1);
  auto conn = std::make_unique<ControlConnection>(id, std::move(sock), stop.get(), std::move(outbox),
                                                  std::move(session), live);
  conn->start();
  std::lock_guard lock(mu);
  connections.push_back(std::move(conn));
}

// Joins the threads of the connections that ended.
void ControlServer::Impl::reap() {
  std::lock_guard lock(mu);
  for (auto it = connections.begin(); it != connections.end();) {
    if ((*it)->done()) {
      (*it)->join();
      it = connections.erase(it);
    } else {
      ++it;
    }
  }
}

void ControlServer::Impl::remove_socket_file() {
  struct stat st{};
  // Another daemon may have replaced a file we lost (someone removed ours): leave its file alone.
  if (::lstat(path.c_str(), &st) == 0 && st.st_dev == bound.st_dev && st.st_ino == bound.st_ino)
    ::unlink(path.c_str());
}

std::string ControlServer::start(const std::string& path, Factory factory, std::unique_ptr<ControlServer>& out) {
  BFT_ASSERT(factory != nullptr);
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->factory = std::move(factory);
  impl->stop.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->stop.valid()) return errno_text("eventfd");
  if (std::string err = bind_listener(path, impl->listener, impl->bound); !err.empty()) return err;
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->accept_loop(); });
  out.reset(new ControlServer(std::move(impl)));
  return "";
}

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ControlServer::~ControlServer() {
  Impl& s = *impl_;
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(s.stop.get(), &one, sizeof one);  // never drained: stays readable
  s.acceptor.join();
  // No supervisor connects from here on: the path is gone, and the listener with it.
  s.remove_socket_file();
  s.listener.reset();
  // The acceptor has ended, so the list no longer changes; the lock is for form's sake and short.
  std::list<std::unique_ptr<ControlConnection>> connections;
  {
    std::lock_guard lock(s.mu);
    connections.swap(s.connections);
  }
  for (auto& c : connections) c->stop();
  for (auto& c : connections) c->join();
  BFT_ASSERT(s.live.load() == 0);
}

const std::string& ControlServer::path() const { return impl_->path; }
std::size_t ControlServer::accepted() const { return impl_->accepted.load(); }
std::size_t ControlServer::live() const { return impl_->live.load(); }

}  // namespace bftfs::client
