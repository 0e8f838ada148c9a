// The supervised tree's standard streams as the supervisor holds them.
//
// stdin is always a pipe: the supervisor writes into it what the user typed or piped, and can tell at a
// checkpoint how much the tree had consumed (what it wrote minus what still sits in the pipe). stdout and stderr
// are one pty when the user's stdout is a terminal (programs then behave as on a terminal: line buffering,
// colours), else two pipes. The supervisor reads them and decides when the bytes reach the user. The pty is not the
// tree's controlling terminal: CRIU restores a session whose terminal is external without one, so the tree never
// has one and behaves the same before and after a rollback (opening /dev/tty fails with ENXIO).
//
// CRIU sees the supervisor's ends as outside the tree. At a dump a pty is named as external (`tty[rdev:dev]`);
// pipes need nothing. At a restore the image's files are replaced by the supervisor's (--inherit-fd): the same
// pty, and fresh pipes, so nothing the killed tree left in the old pipes reaches the restored one.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "criu-hooks/epoch_log.h"
#include "criu-hooks/tree_spawn.h"
#include "os/unique_fd.h"

namespace bftfs::criu {

class TreeChannels {
 public:
  // Creates the channels; with `pty`, stdout and stderr are a new pty whose settings and size are copied from
  // the terminal `terminal_fd` (output post-processing turned off, so bytes reach the user unchanged and the
  // user's own terminal translates newlines as it would for the command run directly).
  [[nodiscard]] static std::string create(bool pty, int terminal_fd, std::unique_ptr<TreeChannels>& out);

  bool pty() const { return pty_; }
  // The tree's ends, for spawn_tree: the caller gives them to the tree and then calls close_tree_ends().
  TreeStdio tree_stdio() const;
  // After the tree received its ends (spawn or restore): closes this process's copies of the tree's stdout and
  // stderr pipes, so that their end of file means the tree is gone, and marks what it keeps close-on-exec. It keeps
  // the read end of stdin (to count what the tree has not read, and so a write never raises SIGPIPE) and the pty
  // slave (so the master never sees a hang-up while the tree is being replaced).
  void close_tree_ends();

  // The supervisor's end of the tree's stdin (non-blocking), or -1 once closed.
  int stdin_writer() const { return stdin_w_.get(); }
  // Closes the tree's stdin: the tree reads end of file once the pipe is empty.
  void close_stdin() { stdin_w_.reset(); }
  // Bytes written to the tree's stdin that it has not read yet.
  [[nodiscard]] std::string stdin_unread(std::size_t& out) const;

  // The readable output channels: (fd, stream). A pty is reported as stdout.
  std::vector<std::pair<int, Stream>> outputs() const;
  // Reads whatever the output channel `fd` holds now, without blocking, appending it to `out`. Returns false once
  // the channel is at its end (every writer is gone); the channel is then closed and no longer in outputs().
  bool read_available(int fd, std::string& out);

  // The CRIU keys of the tree's stdin, stdout and stderr now (EpochRecord's stdin_key, stdout_key, stderr_key).
  void keys(std::string& stdin_key, std::string& stdout_key, std::string& stderr_key) const;
  // What a dump must be told is outside the tree: the pty slave, when there is one.
  std::vector<std::string> dump_externals() const;

  // Prepares a restore of an image whose channels had the given keys: with pipes, new pipes replace the current
  // ones (whatever the old ones still hold is lost, as it belongs to the tree being replaced); `inherit` receives
  // the tree's new ends with the image's keys, with FD_CLOEXEC cleared so CRIU inherits them; close_tree_ends()
  // afterwards.
  [[nodiscard]] std::string prepare_restore(const EpochRecord& image,
                                            std::vector<std::pair<int, std::string>>& inherit);

  // Copies the user's terminal size to the pty (after SIGWINCH). No-op without a pty.
  void copy_window_size(int terminal_fd) const;

 private:
  TreeChannels() = default;
  [[nodiscard]] std::string make_pipes();
  [[nodiscard]] std::string make_pty(int terminal_fd);

  [[nodiscard]] std::string make_stdin();

  bool pty_ = false;
  UniqueFd stdin_r_, stdin_w_;  // the tree reads stdin_r_
  UniqueFd out_r_, out_w_;      // pipes: the tree writes out_w_
  UniqueFd err_r_, err_w_;
  UniqueFd master_, slave_;     // pty: the tree's stdout and stderr are the slave
  std::string stdin_key_, stdout_key_, stderr_key_;
};

}  // namespace bftfs::criu
