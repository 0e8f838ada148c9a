// Supervisor: starting the tree, moving its bytes, noticing its end (supervisor_epochs.cc has the epochs).
#include "criu-hooks/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/assert.h"
#include "common/log.h"
#include "criu-hooks/supervisor_impl.h"
#include "criu-hooks/tree_spawn.h"
#include "os/clock.h"

namespace bftfs::criu {
namespace {

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
// The user's stdin is read only while less than this much waits to be written into the tree: the rest waits in
// the user's pipe or terminal.
constexpr std::size_t kInputBacklogMax = 1 << 20;
// Held output beyond this stops the reading of the tree's output: its writes block until commits free room.
constexpr std::size_t kHeldOutputMax = 64u << 20;
constexpr const char* kCriuConfig = "/run/bftfs-criu.conf";  // on the boundary's /run tmpfs
// The tree's init, copied onto the boundary's /run tmpfs: its own path may be hidden by the boundary's mounts
// (a build directory under /tmp), and what the init executes must lie on a mount of the tree's namespace, where
// CRIU finds it when it dumps the init's executable mapping.
constexpr const char* kInitCopy = "/run/bftfs-run-init";

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

std::string write_criu_config(const char* path) {
  UniqueFd conf(::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!conf.valid()) return errno_text(std::string("create ") + path);
  // The default validation reads every open file's build id, which hangs when a read blocks (a FUSE file).
  const std::string text = "file-validation filesize\n";
  if (::write(conf.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return errno_text(std::string("write ") + path);
  return "";
}

// Copies the open file `from` to a new executable file `path`.
std::string copy_executable(int from, const char* path) {
  struct stat st{};
  if (::fstat(from, &st) != 0) return errno_text("stat the tree's init");
  UniqueFd to(::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755));
  if (!to.valid()) return errno_text(std::string("create ") + path);
  off_t offset = 0;
  while (offset < st.st_size) {
    const ssize_t n = ::sendfile(to.get(), from, &offset, static_cast<std::size_t>(st.st_size - offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_text(std::string("copy the tree's init to ") + path);
  }
  return "";
}

std::uint64_t now_us() { return mono_ns() / 1000; }

// The resident memory of `pid` and of every process below it.
std::uint64_t resident_bytes_below(pid_t pid, int depth) {
  if (depth > 64) return 0;
  std::uint64_t total = 0;
  const std::string proc = "/proc/" + std::to_string(pid);
  UniqueFd statm(::open((proc + "/statm").c_str(), O_RDONLY | O_CLOEXEC));
  char buf[256] = {};
  if (statm.valid() && ::read(statm.get(), buf, sizeof buf - 1) > 0) {
    unsigned long long size = 0, resident = 0;
    if (std::sscanf(buf, "%llu %llu", &size, &resident) == 2)
      total += resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  DIR* tasks = ::opendir((proc + "/task").c_str());
  if (tasks == nullptr) return total;
  while (const dirent* t = ::readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    UniqueFd children(::open((proc + "/task/" + t->d_name + "/children").c_str(), O_RDONLY | O_CLOEXEC));
    std::string text;
    char cbuf[4096];
    for (ssize_t n; children.valid() && (n = ::read(children.get(), cbuf, sizeof cbuf)) > 0;) {
      text.append(cbuf, static_cast<std::size_t>(n));
    }
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t end = std::min(text.find(' ', pos), text.size());
      if (end > pos) {
        const auto child = static_cast<pid_t>(std::atoi(text.substr(pos, end - pos).c_str()));
        total += resident_bytes_below(child, depth + 1);
      }
      pos = end + 1;
    }
  }
  ::closedir(tasks);
  return total;
}

}  // namespace

std::string epoch_dir_name(EpochId epoch) { return "epoch-" + std::to_string(epoch); }

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// size: one sequence of start-up steps whose order matters (each comment says why it comes where it does).
std::string Supervisor::start(const SupervisorOptions& options, const SupervisorHooks& hooks,
                              std::unique_ptr<Supervisor>& out) {
  BFT_ASSERT(!options.argv.empty());
  BFT_ASSERT(hooks.attach);
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
  // Opened now and copied below, once the boundary's /run exists (kInitCopy says why).
  const UniqueFd init_fd(::open(options.init_binary.c_str(), O_RDONLY | O_CLOEXEC));
  if (!init_fd.valid()) return errno_text(options.init_binary);

  // The pty comes from the host's /dev/pts, before anything changes.
  if (std::string err = TreeChannels::create(options.pty, options.terminal_input, STDOUT_FILENO, s.channels);
      !err.empty())
    return err;
  if (options.terminal_input) {
    if (std::string err = s.make_user_terminal_raw(); !err.empty()) return err;
  }
  if (std::string err = Boundary::enter(options.boundary, s.boundary); !err.empty()) return err;
  if (std::string err = write_criu_config(kCriuConfig); !err.empty()) return err;
  if (std::string err = copy_executable(init_fd.get(), kInitCopy); !err.empty()) return err;
  s.criu = std::make_unique<CriuService>(options.criu_binary, kCriuConfig);

  // The init exists (its pid namespace named in ATTACH) before the spec session is mounted, because nothing can
  // reach the session before the daemon serves it; the init starts only once the mounts below are in place.
  PendingTree pending;
  if (std::string err = fork_tree(kInitCopy, kInitPark, options.argv, options.boundary.cwd,
                                  s.channels->tree_stdio(), pending);
      !err.empty())
    return err;
  s.root = pending.init;  // killed by the destructor if anything below fails
  UniqueFd fuse;
  if (options.boundary.spec_session) {
    if (std::string err = s.boundary->mount_spec_session(fuse); !err.empty()) return err;
  }
  if (std::string err = hooks.attach(pending.pidns_ino, fuse.get()); !err.empty()) return err;
  fuse.reset();  // the daemon holds it now
  if (std::string err = s.boundary->finish(); !err.empty()) return err;
  if (std::string err = release_tree(pending, s.exec_errno); !err.empty()) return err;
  s.channels->close_tree_ends();
  LOG_INFO("run", "tree started: init pid %d, %s", static_cast<int>(s.root),
           options.terminal_input ? "pty for stdin, stdout and stderr" : options.pty ? "pty for output" : "pipes");
  out.reset(new Supervisor(std::move(impl)));
  return "";
}

Supervisor::~Supervisor() {
  Impl& s = *impl_;
  s.kill_tree();
  if (s.user_terminal_saved) ::tcsetattr(STDIN_FILENO, TCSADRAIN, &s.user_terminal);
}

int Supervisor::exec_errno() const { return impl_->exec_errno; }
const Boundary& Supervisor::boundary() const { return *impl_->boundary; }
void Supervisor::pump(int timeout_ms, int extra_fd) { impl_->pump(timeout_ms, extra_fd); }
bool Supervisor::tree_running() const { return impl_->root > 0; }
bool Supervisor::tree_finished() const { return impl_->finished; }
int Supervisor::exit_code() const { return impl_->exit_code; }
void Supervisor::kill_tree() { impl_->kill_tree(); }
std::string Supervisor::checkpoint(EpochId id, const std::function<std::string(const DumpFacts&)>& seal,
                                   CheckpointCost& cost) {
  return impl_->checkpoint(id, seal, cost);
}
std::vector<EpochId> Supervisor::commit_through(EpochId epoch) { return impl_->commit_through(epoch); }
std::string Supervisor::rollback(EpochId failed, bool speculative, const RollbackHooks& hooks, RestoreCost& cost) {
  return impl_->rollback(failed, speculative, hooks, cost);
}
std::vector<EpochId> Supervisor::uncommitted() const { return impl_->epochs.ids(); }
const Supervisor::Stats& Supervisor::stats() const { return impl_->stats; }
void Supervisor::set_release_observer(std::function<void(EpochId, int, std::size_t)> observer) {
  impl_->release_observer = std::move(observer);
}

std::uint64_t Supervisor::tree_memory_bytes() const {
  return impl_->root > 0 ? resident_bytes_below(impl_->root, 0) : 0;
}

void Supervisor::images_usage(std::uint64_t& used, std::uint64_t& size) const {
  struct statvfs st{};
  used = size = 0;
  if (::fstatvfs(impl_->boundary->images_root(), &st) != 0) return;
  size = static_cast<std::uint64_t>(st.f_blocks) * st.f_frsize;
  used = size - static_cast<std::uint64_t>(st.f_bfree) * st.f_frsize;
}

void Supervisor::set_outside_input_allowed(bool allowed) {
  impl_->outside_allowed = allowed;
  impl_->forward_outside_input();
}

bool Supervisor::outside_input_pending() const {
  const Impl& s = *impl_;
  if (!s.keystrokes.empty() || !s.pending_signals.empty()) return true;
  if (!s.options.terminal_input || s.root <= 0) return false;
  std::size_t unread = 0;
  if (!s.channels->stdin_unread(unread).empty() || unread > 0) return true;
  return s.channels->partial_line_after(s.last_forwarded);
}

std::string Supervisor::Impl::make_user_terminal_raw() {
  if (::tcgetattr(STDIN_FILENO, &user_terminal) != 0) return errno_text("tcgetattr on stdin");
  termios raw = user_terminal;
  // Keystrokes go to the tree's pty one by one; its line discipline echoes and edits lines as the user's
  // terminal would. ISIG stays: Ctrl-C signals the supervisor, which forwards it like other input.
  raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ECHONL | IEXTEN);
  raw.c_cc[VMIN] = 1;
  raw.c_cc[VTIME] = 0;
  if (::tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) != 0) return errno_text("tcsetattr on stdin");
  user_terminal_saved = true;
  return "";
}

void Supervisor::Impl::pump(int timeout_ms, int extra_fd) {
  std::vector<pollfd> fds;
  fds.push_back({signal_fd.get(), POLLIN, 0});
  const bool want_input = user_stdin_open && input.unwritten().size() < kInputBacklogMax &&
                          keystrokes.size() < kInputBacklogMax;
  if (want_input) fds.push_back({STDIN_FILENO, POLLIN, 0});
  const int writer = channels->stdin_writer();
  if (writer >= 0 && !input.unwritten().empty()) fds.push_back({writer, POLLOUT, 0});
  const auto outputs = channels->outputs();
  if (epochs.held_bytes() < kHeldOutputMax) {
    for (const auto& [fd, stream] : outputs) fds.push_back({fd, POLLIN, 0});
  }
  if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0});
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n <= 0) return;  // timeout, or EINTR (nothing to do: signals arrive through signal_fd)
  for (const pollfd& p : fds) {
    if (p.revents == 0 || p.fd == extra_fd) continue;
    if (p.fd == signal_fd.get()) {
      on_signals();
    } else if (p.fd == STDIN_FILENO && want_input) {
      read_user_stdin();
    } else if (p.fd == writer && (p.events & POLLOUT)) {
      write_tree_stdin();
    } else {
      // The current channels, not those polled: the tree's exit (on_signals, above) may have drained and closed
      // them, and a closed descriptor's number may already be reused.
      for (const auto& [fd, stream] : channels->outputs()) {
        if (fd == p.fd) read_output(fd, stream);
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
    } else {
      pending_signals.push_back(sig);
    }
  }
  forward_outside_input();
}

void Supervisor::Impl::forward_outside_input() {
  if (!outside_allowed) return;
  while (!pending_signals.empty()) {
    const int sig = pending_signals.front();
    pending_signals.pop_front();
    if (root <= 0) continue;  // the tree already ended: nothing to interrupt
    // To the tree's process group, as a terminal would; the init itself ignores it (a pid namespace's init
    // only receives the signals it handles).
    LOG_INFO("run", "forwarding signal %d to the tree", sig);
    ::kill(-root, sig);
    ++stats.signals_forwarded;
  }
  if (!keystrokes.empty() && root > 0) {
    const std::size_t n = channels->forward_keystrokes(keystrokes);
    if (n > 0) last_forwarded = keystrokes[n - 1];
    keystrokes.erase(0, n);
    stats.keystroke_bytes_forwarded += n;
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
  finished = true;
  exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  LOG_INFO("run", "tree exited with %d", exit_code);
}

void Supervisor::Impl::read_user_stdin() {
  char buf[65536];
  const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (options.terminal_input) {
    // A terminal's end (a hang-up) ends nothing in the tree: its pty stays open.
    if (n <= 0) user_stdin_open = false;
    if (n > 0) keystrokes.append(buf, static_cast<std::size_t>(n));
    forward_outside_input();
    return;
  }
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
    release(0, stream, bytes);
    return;
  }
  first_output_us.try_emplace(epochs.newest().id, now_us());
  epochs.append_output(stream, bytes);
  if (epochs.held_bytes() > stats.output_bytes_held_max) stats.output_bytes_held_max = epochs.held_bytes();
}

void Supervisor::Impl::release(EpochId epoch, Stream stream, std::string_view bytes) {
  write_all(stream == Stream::kStderr ? STDERR_FILENO : STDOUT_FILENO, bytes);
  stats.output_bytes_released += bytes.size();
  if (release_observer) release_observer(epoch, stream == Stream::kStderr ? 2 : 1, bytes.size());
}

}  // namespace bftfs::criu
