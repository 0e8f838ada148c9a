#include "criu-hooks/channels.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/assert.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string set_flag(int fd, int get, int set, int flag, bool on) {
  const int flags = ::fcntl(fd, get);
  if (flags < 0) return errno_text("fcntl");
  if (::fcntl(fd, set, on ? (flags | flag) : (flags & ~flag)) != 0) return errno_text("fcntl");
  return "";
}

std::string make_pipe(UniqueFd& r, UniqueFd& w, std::string& key) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_text("pipe");
  r.reset(fds[0]);
  w.reset(fds[1]);
  struct stat st{};
  if (::fstat(r.get(), &st) != 0) return errno_text("fstat a pipe");
  key = "pipe:[" + std::to_string(st.st_ino) + "]";
  return "";
}

}  // namespace

std::string TreeChannels::create(bool pty, int terminal_fd, std::unique_ptr<TreeChannels>& out) {
  std::unique_ptr<TreeChannels> c(new TreeChannels());
  c->pty_ = pty;
  if (std::string err = c->make_stdin(); !err.empty()) return err;
  if (std::string err = pty ? c->make_pty(terminal_fd) : c->make_pipes(); !err.empty()) return err;
  out = std::move(c);
  return "";
}

std::string TreeChannels::make_stdin() {
  if (std::string err = make_pipe(stdin_r_, stdin_w_, stdin_key_); !err.empty()) return err;
  return set_flag(stdin_w_.get(), F_GETFL, F_SETFL, O_NONBLOCK, true);
}

std::string TreeChannels::make_pipes() {
  if (std::string err = make_pipe(out_r_, out_w_, stdout_key_); !err.empty()) return err;
  if (std::string err = make_pipe(err_r_, err_w_, stderr_key_); !err.empty()) return err;
  if (std::string err = set_flag(out_r_.get(), F_GETFL, F_SETFL, O_NONBLOCK, true); !err.empty()) return err;
  return set_flag(err_r_.get(), F_GETFL, F_SETFL, O_NONBLOCK, true);
}

std::string TreeChannels::make_pty(int terminal_fd) {
  master_.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!master_.valid()) return errno_text("posix_openpt");
  if (::grantpt(master_.get()) != 0 || ::unlockpt(master_.get()) != 0) return errno_text("unlock the pty");
  char name[64];
  if (::ptsname_r(master_.get(), name, sizeof name) != 0) return errno_text("ptsname");
  slave_.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!slave_.valid()) return errno_text(std::string("open ") + name);
  termios t{};
  if (::tcgetattr(terminal_fd, &t) == 0) {
    t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
    if (::tcsetattr(slave_.get(), TCSANOW, &t) != 0) return errno_text("set the pty's terminal settings");
  }
  copy_window_size(terminal_fd);
  struct stat st{};
  if (::fstat(slave_.get(), &st) != 0) return errno_text("fstat the pty");
  char key[64];
  std::snprintf(key, sizeof key, "tty[%llx:%llx]", static_cast<unsigned long long>(st.st_rdev),
                static_cast<unsigned long long>(st.st_dev));
  stdout_key_ = stderr_key_ = key;
  return set_flag(master_.get(), F_GETFL, F_SETFL, O_NONBLOCK, true);
}

TreeStdio TreeChannels::tree_stdio() const {
  TreeStdio s;
  s.in = stdin_r_.get();
  s.out = pty_ ? slave_.get() : out_w_.get();
  s.err = pty_ ? slave_.get() : err_w_.get();
  BFT_ASSERT(s.in >= 0 && s.out >= 0 && s.err >= 0);
  return s;
}

void TreeChannels::close_tree_ends() {
  out_w_.reset();
  err_w_.reset();
  BFT_ASSERT(set_flag(stdin_r_.get(), F_GETFD, F_SETFD, FD_CLOEXEC, true).empty());
  if (slave_.valid()) BFT_ASSERT(set_flag(slave_.get(), F_GETFD, F_SETFD, FD_CLOEXEC, true).empty());
}

std::string TreeChannels::stdin_unread(std::size_t& out) const {
  int n = 0;
  if (::ioctl(stdin_r_.get(), FIONREAD, &n) != 0) return errno_text("FIONREAD on the tree's stdin");
  BFT_ASSERT(n >= 0);
  out = static_cast<std::size_t>(n);
  return "";
}

std::vector<std::pair<int, Stream>> TreeChannels::outputs() const {
  std::vector<std::pair<int, Stream>> out;
  if (master_.valid()) out.emplace_back(master_.get(), Stream::kStdout);
  if (out_r_.valid()) out.emplace_back(out_r_.get(), Stream::kStdout);
  if (err_r_.valid()) out.emplace_back(err_r_.get(), Stream::kStderr);
  return out;
}

bool TreeChannels::read_available(int fd, std::string& out) {
  UniqueFd* channel = nullptr;
  for (UniqueFd* c : {&master_, &out_r_, &err_r_}) {
    if (c->valid() && c->get() == fd) channel = c;
  }
  BFT_ASSERT(channel != nullptr);
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    // End of file, or EIO from a pty master (cannot happen while the slave is held, but means the same).
    channel->reset();
    return false;
  }
}

void TreeChannels::keys(std::string& stdin_key, std::string& stdout_key, std::string& stderr_key) const {
  stdin_key = stdin_key_;
  stdout_key = stdout_key_;
  stderr_key = stderr_key_;
}

std::vector<std::string> TreeChannels::dump_externals() const {
  if (!pty_) return {};
  return {stdout_key_};
}

std::string TreeChannels::prepare_restore(const EpochRecord& image,
                                          std::vector<std::pair<int, std::string>>& inherit) {
  inherit.clear();
  if (std::string err = make_stdin(); !err.empty()) return err;
  inherit.emplace_back(stdin_r_.get(), image.stdin_key);
  if (pty_) {
    inherit.emplace_back(slave_.get(), image.stdout_key);
    BFT_ASSERT(image.stderr_key == image.stdout_key);
  } else {
    if (std::string err = make_pipes(); !err.empty()) return err;
    inherit.emplace_back(out_w_.get(), image.stdout_key);
    inherit.emplace_back(err_w_.get(), image.stderr_key);
  }
  for (const auto& [fd, key] : inherit) {
    if (std::string err = set_flag(fd, F_GETFD, F_SETFD, FD_CLOEXEC, false); !err.empty()) return err;
  }
  return "";
}

void TreeChannels::copy_window_size(int terminal_fd) const {
  if (!master_.valid()) return;
  winsize ws{};
  if (::ioctl(terminal_fd, TIOCGWINSZ, &ws) == 0) ::ioctl(master_.get(), TIOCSWINSZ, &ws);
}

}  // namespace bftfs::criu
