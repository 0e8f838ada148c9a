// Supervisor: starting the tree, moving its bytes, noticing its end (supervisor_epochs.cc has the epochs).
#include "criu-hooks/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/assert.h"
#include "common/log.h"
#include "criu-hooks/supervisor_impl.h"
#include "criu-hooks/tree_copy.h"
#include "criu-hooks/tree_spawn.h"

namespace bftfs::criu {
namespace {

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// The user's stdin is read only while less than this much waits to be written into the tree: the rest waits in
// the user's pipe or terminal.
constexpr std::size_t kInputBacklogMax = 1 << 20;
constexpr const char* kDefaultImages = "/run/bftfs-run";  // on the private /run
constexpr const char* kCriuConfig = "/run/bftfs-criu.conf";

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Writes all of `bytes` to `fd`, waiting when it is non-blocking and full. Errors (a closed pipe) drop the rest:
// the user stopped reading, which is not the tree's concern.
void write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (!(n < 0 && errno == EINTR)) {
      return;
    }
  }
}

// fds 0, 1 and 2 exist (on /dev/null if the caller closed them), so no pipe or pty of the supervisor takes their
// numbers.
std::string ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) continue;
    const int n = ::open("/dev/null", O_RDWR);
    if (n != fd) return "cannot open /dev/null as fd " + std::to_string(fd);
  }
  return "";
}

std::string open_dir(const std::string& path, UniqueFd& out) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return errno_text("mkdir " + path);
  out.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!out.valid()) return errno_text("open " + path);
  return "";
}

std::string write_criu_config(const char* path) {
  UniqueFd conf(::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!conf.valid()) return errno_text(std::string("create ") + path);
  // The default validation reads every open file's build id, which hangs when a read blocks (a FUSE file).
  const std::string text = "file-validation filesize\n";
  if (::write(conf.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return errno_text(std::string("write ") + path);
  return "";
}

}  // namespace

std::string epoch_dir_name(EpochId epoch) { return "epoch-" + std::to_string(epoch); }

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::string Supervisor::start(const SupervisorOptions& options, std::unique_ptr<Supervisor>& out) {
  BFT_ASSERT(!options.argv.empty());
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.options = options;
  if (std::string err = ensure_standard_fds(); !err.empty()) return err;
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return errno_text("PR_SET_CHILD_SUBREAPER");
  ::signal(SIGPIPE, SIG_IGN);  // a user who stops reading our output must not kill the supervisor
  ::sigemptyset(&s.handled);
  for (int sig : kForwarded) ::sigaddset(&s.handled, sig);
  ::sigaddset(&s.handled, SIGCHLD);
  ::sigaddset(&s.handled, SIGWINCH);
  if (::sigprocmask(SIG_BLOCK, &s.handled, nullptr) != 0) return errno_text("sigprocmask");
  s.signal_fd.reset(::signalfd(-1, &s.handled, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!s.signal_fd.valid()) return errno_text("signalfd");

  if (::access(options.init_binary.c_str(), X_OK) != 0) return errno_text(options.init_binary);
  // A directory the user named is opened as the user sees it, before /run and /tmp become private.
  if (!options.images_dir.empty()) {
    if (std::string err = open_dir(options.images_dir, s.images_root); !err.empty()) return err;
  }
  if (std::string err = enter_private_mounts(); !err.empty()) return err;
  if (::access(options.init_binary.c_str(), X_OK) != 0)
    return errno_text(options.init_binary + " (hidden by the private /run or /tmp)");
  if (!s.images_root.valid()) {
    if (std::string err = open_dir(kDefaultImages, s.images_root); !err.empty()) return err;
  }
  if (std::string err = write_criu_config(kCriuConfig); !err.empty()) return err;
  s.criu = std::make_unique<CriuService>(options.criu_binary, kCriuConfig);
  s.tmp_dir.reset(::open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!s.tmp_dir.valid()) return errno_text("open /tmp");

  if (std::string err = TreeChannels::create(options.pty, STDOUT_FILENO, s.channels); !err.empty()) return err;
  const TreeStdio stdio = s.channels->tree_stdio();
  if (std::string err = spawn_tree(options.init_binary, options.argv, stdio, s.root, s.exec_errno); !err.empty())
    return err;
  s.channels->close_tree_ends();
  LOG_INFO("run", "tree started: init pid %d, %s", static_cast<int>(s.root), options.pty ? "pty" : "pipes");
  out.reset(new Supervisor(std::move(impl)));
  return "";
}

Supervisor::~Supervisor() {
  Impl& s = *impl_;
  s.kill_tree();
  for (EpochId id : s.epochs.ids()) s.remove_epoch_dir(id);
}

int Supervisor::exec_errno() const { return impl_->exec_errno; }
void Supervisor::pump(int timeout_ms) { impl_->pump(timeout_ms); }
bool Supervisor::tree_exited() const { return impl_->exited; }
std::string Supervisor::begin_epoch(EpochId& out) { return impl_->begin_epoch(out); }
void Supervisor::commit_epoch(EpochId epoch) { impl_->commit_epoch(epoch); }
std::string Supervisor::rollback_to(EpochId epoch) { return impl_->rollback_to(epoch); }
std::vector<EpochId> Supervisor::uncommitted() const { return impl_->epochs.ids(); }
const SupervisorStats& Supervisor::stats() const { return impl_->stats; }

int Supervisor::finish() {
  Impl& s = *impl_;
  BFT_ASSERT(s.epochs.empty());
  while (!s.exited) s.pump(-1);
  return s.exit_code;
}

void Supervisor::Impl::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  fds.push_back({signal_fd.get(), POLLIN, 0});
  const bool want_input = user_stdin_open && input.unwritten().size() < kInputBacklogMax;
  if (want_input) fds.push_back({STDIN_FILENO, POLLIN, 0});
  const int writer = channels->stdin_writer();
  if (writer >= 0 && !input.unwritten().empty()) fds.push_back({writer, POLLOUT, 0});
  const auto outputs = channels->outputs();
  for (const auto& [fd, stream] : outputs) fds.push_back({fd, POLLIN, 0});
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return;  // timeout, or EINTR (nothing to do: signals arrive through signal_fd)
  for (const pollfd& p : fds) {
    if (p.revents == 0) continue;
    if (p.fd == signal_fd.get()) {
      on_signals();
    } else if (p.fd == STDIN_FILENO && want_input) {
      read_user_stdin();
    } else if (p.fd == writer && (p.events & POLLOUT)) {
      write_tree_stdin();
    } else {
      for (const auto& [fd, stream] : outputs) {
        if (fd == p.fd && !exited) read_output(fd, stream);
      }
    }
  }
}

void Supervisor::Impl::on_signals() {
  signalfd_siginfo si{};
  while (::read(signal_fd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
    const int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) {
      reap();
    } else if (sig == SIGWINCH) {
      channels->copy_window_size(STDOUT_FILENO);
    } else if (root > 0) {
      // To the tree's process group, as a terminal would; the init itself ignores it (a pid namespace's init
      // only receives the signals it handles).
      LOG_INFO("run", "forwarding signal %d to the tree", sig);
      ::kill(-root, sig);
    }
  }
}

void Supervisor::Impl::reap() {
  for (;;) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, WNOHANG);
    if (p <= 0) return;
    // Anything else is an orphan that a subreaper inherits (CRIU's helpers): reaping is all it needs.
    if (p == root) on_tree_exit(status);
  }
}

void Supervisor::Impl::on_tree_exit(int status) {
  root = -1;
  drain_outputs();  // every writer is gone: this reads the tree's last bytes
  exited = true;
  exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  LOG_INFO("run", "tree exited with %d", exit_code);
}

void Supervisor::Impl::read_user_stdin() {
  char buf[65536];
  const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    user_stdin_open = false;
    input.set_eof();
  } else {
    input.append(std::string_view(buf, static_cast<std::size_t>(n)));
  }
  write_tree_stdin();
}

void Supervisor::Impl::write_tree_stdin() {
  const int writer = channels->stdin_writer();
  if (writer < 0) return;
  while (!input.unwritten().empty()) {
    const std::string_view pending = input.unwritten();
    const ssize_t n = ::write(writer, pending.data(), pending.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // full (EAGAIN); the read end is ours too, so never EPIPE
    input.mark_written(static_cast<std::size_t>(n));
    if (epochs.empty()) input.trim(input.written());  // no checkpoint can need these bytes again
  }
  if (input.drained()) channels->close_stdin();
}

bool Supervisor::Impl::read_output(int fd, Stream stream) {
  std::string bytes;
  const bool open = channels->read_available(fd, bytes);
  deliver(stream, bytes);
  return open;
}

void Supervisor::Impl::drain_outputs() {
  for (const auto& [fd, stream] : channels->outputs()) read_output(fd, stream);
}

void Supervisor::Impl::deliver(Stream stream, std::string_view bytes) {
  if (bytes.empty()) return;
  if (epochs.empty()) {
    release(stream, bytes);
    return;
  }
  epochs.append_output(stream, bytes);
  if (epochs.held_bytes() > stats.output_bytes_held_max) stats.output_bytes_held_max = epochs.held_bytes();
}

void Supervisor::Impl::release(Stream stream, std::string_view bytes) {
  write_all(stream == Stream::kStderr ? STDERR_FILENO : STDOUT_FILENO, bytes);
  stats.output_bytes_released += bytes.size();
}

}  // namespace bftfs::criu
