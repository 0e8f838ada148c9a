// Supervisor::Impl: private to supervisor.cc (start, I/O, the tree's exit) and supervisor_epochs.cc
// (checkpoints, commits, rollbacks).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

#include "criu-hooks/channels.h"
#include "criu-hooks/criu_service.h"
#include "criu-hooks/epoch_log.h"
#include "criu-hooks/input_log.h"
#include "criu-hooks/supervisor.h"
#include "os/unique_fd.h"

namespace bftfs::criu {

struct Supervisor::Impl {
  SupervisorOptions options;
  std::unique_ptr<TreeChannels> channels;
  std::unique_ptr<CriuService> criu;
  UniqueFd signal_fd;     // SIGCHLD, the forwarded signals and SIGWINCH, blocked and read here
  sigset_t handled{};     // the signals signal_fd reads
  UniqueFd images_root;   // one directory per epoch ("epoch-<id>")
  UniqueFd tmp_dir;       // the tree's private /tmp
  pid_t root = -1;        // the tree's init while it runs
  bool exited = false;
  int exit_code = 0;
  int exec_errno = 0;
  bool user_stdin_open = true;
  InputLog input;
  EpochLog epochs;
  EpochId next_epoch = 1;
  SupervisorStats stats;

  // supervisor.cc
  void pump(int timeout_ms);
  void on_signals();
  void reap();
  // The tree's init was reaped with `status`: its last output is read and the exit code kept.
  void on_tree_exit(int status);
  void read_user_stdin();
  void write_tree_stdin();
  // Reads what the output channel `fd` holds now and delivers it. Returns false at its end.
  bool read_output(int fd, Stream stream);
  // Reads every output channel until nothing is left (the tree frozen or gone) and delivers it.
  void drain_outputs();
  // Output of the tree: held in the open epoch, or written out when no epoch is uncommitted.
  void deliver(Stream stream, std::string_view bytes);
  void release(Stream stream, std::string_view bytes);

  // supervisor_epochs.cc
  std::string begin_epoch(EpochId& out);
  void commit_epoch(EpochId epoch);
  std::string rollback_to(EpochId epoch);
  // Kills the tree (if it runs) and reaps its init: the whole pid namespace is gone when this returns.
  void kill_tree();
  void remove_epoch_dir(EpochId epoch);
};

std::string epoch_dir_name(EpochId epoch);

}  // namespace bftfs::criu
