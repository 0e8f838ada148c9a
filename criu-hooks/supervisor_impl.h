// Supervisor::Impl: private to supervisor.cc (start, I/O, the tree's end) and supervisor_epochs.cc
// (checkpoints, commits, rollbacks).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <termios.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "criu-hooks/boundary.h"
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
  std::unique_ptr<Boundary> boundary;
  std::unique_ptr<CriuService> criu;
  UniqueFd signal_fd;     // SIGCHLD, the forwarded signals and SIGWINCH, blocked and read here
  sigset_t handled{};     // the signals signal_fd reads
  pid_t root = -1;        // the tree's init while it runs
  bool finished = false;  // the root exited by itself
  int exit_code = 0;
  int exec_errno = 0;
  bool user_stdin_open = true;
  InputLog input;
  EpochLog epochs;
  Stats stats;
  std::function<void(EpochId, int, std::size_t)> release_observer;
  // The user's terminal as it was, when terminal input made it raw (put back by the destructor).
  bool user_terminal_saved = false;
  termios user_terminal{};
  // Input that cannot be replayed waits here until nothing speculative is outstanding.
  bool outside_allowed = true;
  std::string keystrokes;           // read from the user's terminal, not yet forwarded
  char last_forwarded = '\n';       // the last keystroke forwarded (a partial line may wait in the pty)
  std::deque<int> pending_signals;  // received, not yet forwarded
  // When each epoch holding output got its first byte (for the longest hold).
  std::map<EpochId, std::uint64_t> first_output_us;
  bool run_frozen = false;          // /run was made read-only after the first dump

  // supervisor.cc
  void pump(int timeout_ms, int extra_fd);
  void on_signals();
  void forward_outside_input();
  void reap();
  // The tree's init was reaped with `status`: its last output is read and the exit code kept.
  void on_tree_exit(int status);
  void read_user_stdin();
  void write_tree_stdin();
  // Reads what the output channel `fd` holds now and delivers it. Returns false at its end.
  bool read_output(int fd, Stream stream);
  // Reads every output channel until nothing is left (the tree frozen or gone) and delivers it.
  void drain_outputs();
  // Output of the tree: held in the newest epoch, or written out when no epoch is uncommitted.
  void deliver(Stream stream, std::string_view bytes);
  void release(EpochId epoch, Stream stream, std::string_view bytes);
  std::string make_user_terminal_raw();

  // supervisor_epochs.cc
  std::string checkpoint(EpochId id, const std::function<std::string(const DumpFacts&)>& seal, CheckpointCost& cost);
  std::vector<EpochId> commit_through(EpochId epoch);
  std::string rollback(EpochId failed, bool speculative, const RollbackHooks& hooks, RestoreCost& cost);
  // Kills the tree (if it runs) and reaps it: no task of its pid namespace remains when this returns.
  void kill_tree();
  void remove_epoch_dir(EpochId epoch);
};

std::string epoch_dir_name(EpochId epoch);

}  // namespace bftfs::criu
