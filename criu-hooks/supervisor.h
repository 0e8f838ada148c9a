// The supervisor's mechanism (docs/SPECULATION.md §8): runs a command's process tree inside the boundary of
// speculation (criu-hooks/boundary.h) in pid and IPC namespaces of its own, checkpoints it with CRIU, holds what
// it prints per epoch, and rolls it back to a checkpoint. What the steps say to the mount's daemon (the control
// protocol, §9) is the caller's: the steps call hooks at the moments the protocol needs, and the caller
// (criu-hooks/run_driver.h) decides when to take them (criu-hooks/policy.h).
//
//   start()        boundary, channels, the tree forked; hooks.attach(pidns, fuse) before anything reaches the mount;
//   checkpoint()   a dump that leaves the tree running; in CRIU's post-dump notification (every task frozen, the
//                  image complete) the output is cut, stdin's consumption and the pty's state noted, a private
//                  /tmp copied, the spec session synced, and then seal() (SEAL) runs: from there on, output belongs
//                  to the new epoch, whose record holds the checkpoint;
//   commit_through(e)  output of every epoch <= e released, their checkpoints deleted;
//   rollback()     kill and reap the tree, drop the output of the failed epoch and later ones, put the pty (and a
//                  private /tmp) back, hooks.before_restore() (ROLLBACK), restore; in CRIU's pre-resume
//                  notification (tasks restored, not running) a fresh stdin pipe is filled from the log and
//                  hooks.pre_resume() (RESTORED) runs;
//   pump()         moves bytes: the user's stdin into the tree (terminal input and forwarded signals only while
//                  allowed), the tree's output into the newest epoch or out, and notices the tree's end.
// Not thread-safe: one thread drives a supervisor, and a process has at most one (it changes the process's
// namespaces, signal mask and subreaper flag).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "criu-hooks/boundary.h"
#include "criu-hooks/epoch_log.h"
#include "os/unique_fd.h"

namespace bftfs::criu {

struct SupervisorOptions {
  std::vector<std::string> argv;            // the command; argv[0] is looked up in PATH
  std::string init_binary;                  // the tree's init (criu-hooks/tree_init_main.cc), an absolute path
  std::string criu_binary = "bftfs-criu";   // CRIU's swrk service binary (scripts/install-criu.sh installs it)
  bool pty = false;             // stdout and stderr through a pty (set when the user's stdout is a terminal)
  bool terminal_input = false;  // stdin through that pty too (set when the user's stdin is a terminal as well)
  int criu_log_level = 2;       // CRIU's log level for dump.log and restore.log (0-4)
  BoundaryPlan boundary;
};

// What the checkpoint knows when it seals (in the post-dump notification; CRIU's own statistics come later).
struct DumpFacts {
  std::uint64_t dump_us = 0;    // since the dump began
  std::uint64_t frozen_us = 0;  // since the freeze began, an upper bound
  std::uint64_t image_bytes = 0;
};

struct CheckpointCost {
  EpochId epoch = 0;
  std::uint64_t wall_us = 0;         // the whole dump call, as the supervisor waited for it
  std::uint64_t frozen_us = 0;       // how long the tree stayed frozen (CRIU's statistics)
  std::uint64_t freezing_us = 0;     // how long freezing it took (CRIU's statistics)
  std::uint64_t frozen_work_us = 0;  // the supervisor's work while the tree was frozen, the seal included
  std::uint64_t seal_us = 0;         // of which the seal (SEAL and its reply)
  std::uint64_t image_bytes = 0;     // the images, without the copy of a private /tmp
};

struct RestoreCost {
  EpochId epoch = 0;                 // the failed epoch
  EpochId rerun = 0;                 // the epoch the restored tree runs in
  std::uint64_t total_us = 0;        // from the decision to roll back until the restored tree runs
  std::uint64_t kill_reap_us = 0;    // killing and reaping the old tree
  std::uint64_t tmp_us = 0;          // putting a private /tmp back
  std::uint64_t restore_us = 0;      // the restore call
};

struct SupervisorHooks {
  // After the tree's init is forked and, with a spec session, after it is mounted: tell the daemon (ATTACH).
  // `fuse` is the session's descriptor, or -1. Returns "" or what failed.
  std::function<std::string(std::uint64_t pidns_ino, int fuse)> attach;
};

struct RollbackHooks {
  // The tree is gone: ROLLBACK; sets `rerun` to the number of the epoch the restored tree runs in.
  std::function<std::string(EpochId& rerun)> before_restore;
  // Tasks restored, not yet running: RESTORED. `restore_us` so far.
  std::function<std::string(std::uint64_t pidns_ino, std::uint64_t restore_us)> pre_resume;
};

class Supervisor {
 public:
  // Creates the channels, enters the boundary, forks the tree, calls hooks.attach, sets up the temporary
  // directories and starts the tree. The calling process must be single-threaded and must not have started a
  // supervisor before. Returns "" or what failed.
  [[nodiscard]] static std::string start(const SupervisorOptions& options, const SupervisorHooks& hooks,
                                         std::unique_ptr<Supervisor>& out);
  // Kills and reaps the tree if it still runs.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // The errno of a failed exec of the command (the tree then exits with 127 or 126), or 0.
  int exec_errno() const;
  const Boundary& boundary() const;

  // Moves bytes for up to `timeout_ms` (-1: until something happens; 0: what is ready now), also watching
  // `extra_fd` (if >= 0) and returning when it is readable. Forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the
  // tree and terminal input to its pty only while set_outside_input_allowed(true); window size changes always.
  void pump(int timeout_ms, int extra_fd = -1);
  // Whether input that cannot be replayed (keystrokes, signals) may reach the tree now: nothing speculative is
  // outstanding.
  void set_outside_input_allowed(bool allowed);
  // Keystrokes or a signal wait to be forwarded, or forwarded keystrokes still wait in the pty (a checkpoint
  // then would make them speculative).
  bool outside_input_pending() const;

  // True while the tree runs; false once it exited (until a rollback brings it back) or was killed.
  bool tree_running() const;
  // True once the tree's root exited by itself (not killed for a rollback); its exit code. 128+N for signal N.
  bool tree_finished() const;
  int exit_code() const;
  // Kills the tree now (DOOMED): it is not finished; a rollback follows.
  void kill_tree();
  // The tree's resident memory, summed over its tasks.
  std::uint64_t tree_memory_bytes() const;

  // Checkpoints the running tree; `seal` runs last while it is frozen. On success epoch `id` is open with this
  // checkpoint; on failure (the dump, or seal, failed) nothing changed and the tree runs on. `cost` is filled.
  [[nodiscard]] std::string checkpoint(EpochId id, const std::function<std::string(const DumpFacts&)>& seal,
                                       CheckpointCost& cost);
  // Releases the output of every uncommitted epoch up to `epoch` and deletes their checkpoints.
  // Returns the epochs committed, oldest first.
  std::vector<EpochId> commit_through(EpochId epoch);
  // Rolls the tree back to the checkpoint that began `failed` (the oldest uncommitted epoch), as the header
  // describes. `speculative`: the re-run is a speculative epoch (keeping the checkpoint), else it runs without
  // speculation. Returns "" or why it failed; after a failure the tree is gone and the run must end (125).
  [[nodiscard]] std::string rollback(EpochId failed, bool speculative, const RollbackHooks& hooks, RestoreCost& cost);
  // The uncommitted epochs (with checkpoints), oldest first.
  std::vector<EpochId> uncommitted() const;
  // Bytes used in the images tmpfs, and its size.
  void images_usage(std::uint64_t& used, std::uint64_t& size) const;

  struct Stats {
    std::uint64_t checkpoint_failures = 0;
    std::uint64_t output_bytes_released = 0;
    std::uint64_t output_bytes_dropped = 0;
    std::uint64_t output_bytes_held_max = 0;
    std::uint64_t output_hold_us_max = 0;  // the longest time a byte waited for its commit
    std::uint64_t stdin_bytes_replayed = 0;
    std::uint64_t signals_forwarded = 0;
    std::uint64_t keystroke_bytes_forwarded = 0;
  };
  const Stats& stats() const;
  // Called with (epoch, stream 1 or 2, bytes) for every release of held output, for --trace.
  void set_release_observer(std::function<void(EpochId, int, std::size_t)> observer);

 private:
  struct Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs::criu
