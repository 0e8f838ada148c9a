// The supervisor of `bftfs run`: runs a command's process tree under checkpoint control, so that a speculation
// layer can take checkpoints, hold what the tree prints until the speculation it depends on commits, and roll
// the tree back to a checkpoint.
//
// The tree runs in its own pid namespace and in a mount namespace it shares with the supervisor and CRIU, with
// private tmpfs mounts on /run and /tmp (criu-hooks/tree_spawn.h). Its stdin is a pipe the supervisor feeds from
// the user's stdin, keeping every byte a rollback may need to replay; its stdout and stderr are a pty (when the
// user's stdout is a terminal) or pipes, which the supervisor reads (criu-hooks/channels.h).
//
// The interface the speculation layer drives, in epochs:
//   begin_epoch()   checkpoints the tree (CRIU dump, the tree keeps running) and opens a new epoch; from here on
//                   what the tree prints is held in the new epoch;
//   commit_epoch(e) the oldest uncommitted epoch e committed: its output is written out, its checkpoint dropped;
//                   with no uncommitted epoch left the tree runs unspeculated and its output flows straight out;
//   rollback_to(e)  the tree goes back to e's checkpoint: it is killed and reaped, the output of e and later epochs
//                   dropped, /tmp put back as it was, the tree restored, and the stdin it had not consumed at the
//                   checkpoint fed to it again; e is the open epoch again;
//   finish()        once nothing is uncommitted: runs the tree to its end and returns its exit code.
// In between, the owner calls pump() to move bytes and notice the tree's exit. Not thread-safe: one thread drives
// a supervisor, and a process has at most one (it changes the process's namespaces, signal mask and subreaper
// flag).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "criu-hooks/epoch_log.h"

namespace bftfs::criu {

struct SupervisorOptions {
  std::vector<std::string> argv;            // the command; argv[0] is looked up in PATH
  std::string init_binary;                  // the tree's init (criu-hooks/tree_init_main.cc), an absolute path
  std::string criu_binary = "bftfs-criu";   // CRIU's swrk service binary (scripts/install-criu.sh installs it)
  // Where checkpoint images go, one directory per epoch, deleted when no longer needed; a path as the caller sees
  // it (opened before /run and /tmp become private). Empty: a directory on the private /run tmpfs (memory, gone
  // with the supervisor).
  std::string images_dir;
  bool pty = false;        // stdout and stderr through a pty (set when the user's stdout is a terminal)
  int criu_log_level = 2;  // CRIU's log level for dump.log and restore.log (0-4)
};

struct CheckpointCost {
  EpochId epoch = 0;
  std::uint64_t wall_us = 0;       // the whole dump call, as the supervisor waited for it
  std::uint64_t frozen_us = 0;     // how long the tree stayed frozen (CRIU's statistics)
  std::uint64_t freezing_us = 0;   // how long freezing it took (CRIU's statistics)
  std::uint64_t frozen_work_us = 0;  // the supervisor's work while the tree was frozen (output cut, /tmp copy)
  std::uint64_t image_bytes = 0;   // the images, without the copy of /tmp
};

struct RestoreCost {
  EpochId epoch = 0;
  std::uint64_t total_us = 0;      // from the decision to roll back until the restored tree runs
  std::uint64_t kill_reap_us = 0;  // killing and reaping the old tree
  std::uint64_t tmp_us = 0;        // putting /tmp back
  std::uint64_t restore_us = 0;    // the restore call
};

struct SupervisorStats {
  std::vector<CheckpointCost> checkpoints;
  std::uint64_t checkpoint_failures = 0;
  std::vector<RestoreCost> restores;     // one per rollback
  std::uint64_t epochs_committed = 0;
  std::uint64_t epochs_discarded = 0;    // epochs after a rollback's target, thrown away with it
  std::uint64_t output_bytes_released = 0;
  std::uint64_t output_bytes_dropped = 0;
  std::uint64_t stdin_bytes_replayed = 0;
  std::uint64_t output_bytes_held_max = 0;
};

class Supervisor {
 public:
  // Enters the private namespaces, creates the channels and starts the tree. The calling process must be
  // single-threaded and must not have started a supervisor before. Returns "" or what failed.
  [[nodiscard]] static std::string start(const SupervisorOptions& options, std::unique_ptr<Supervisor>& out);
  // Kills and reaps the tree if it still runs, and deletes the images it made.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // The errno of a failed exec of the command (the tree then exits with 127 or 126), or 0.
  int exec_errno() const;

  // Moves bytes for up to `timeout_ms` (-1: until something happens; 0: what is ready now): the user's stdin into
  // the tree, the tree's output into the open epoch (or out, with no uncommitted epoch), forwards SIGINT, SIGTERM,
  // SIGHUP and SIGQUIT to the tree and window size changes to its pty, and reaps the tree when it exits.
  void pump(int timeout_ms);
  // True once the tree has exited (and until a rollback brings it back).
  bool tree_exited() const;

  // Checkpoints the running tree and opens epoch `out`. On failure the tree runs on unchanged and no epoch opens.
  // Returns "" or why the checkpoint failed.
  [[nodiscard]] std::string begin_epoch(EpochId& out);
  // Commits `epoch`, which must be the oldest uncommitted one: writes out its output, deletes its checkpoint.
  void commit_epoch(EpochId epoch);
  // Rolls the tree back to the checkpoint that began `epoch` (uncommitted), as the header describes. Returns ""
  // or why it failed; after a failure the tree is gone (tree_exited(), exit code 125).
  [[nodiscard]] std::string rollback_to(EpochId epoch);
  // The uncommitted epochs, oldest first.
  std::vector<EpochId> uncommitted() const;
  // Precondition: no uncommitted epoch. Runs the tree to its end, its output flowing out, and returns its exit
  // code (128+N if signal N ended it).
  int finish();

  const SupervisorStats& stats() const;

 private:
  struct Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::criu
