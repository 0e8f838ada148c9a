// `bftfs run` end to end (docs/SPECULATION.md §8-§10): connects to the mount's daemon, starts the tree under a
// Supervisor, and drives the epochs from the control protocol's events and the policy's decisions:
//
//   HELLO -> HELLO_OK                  the run directory and the spec session's mount options
//   ATTACH(pidns, fd) -> ATTACHED      the spec session mounted, the tree forked (not yet running)
//   PREPARE(k) -> PREPARED, dump, and in the post-dump notification SEAL(k) -> SEALED: epoch k+1 begins with
//                                      a checkpoint (k may be the non-speculative stretch before it)
//   SEAL(k, not speculative) -> SEALED without a dump: speculation pauses (input, signals, policy)
//   COMMITTED(e)                       output of every epoch <= e released
//   DOOMED(d)                          the tree is killed at once; FAILED follows
//   FAILED(j): kill, ROLLBACK(j) -> READY_FOR_RESTORE(j'), restore, and in the pre-resume notification
//              RESTORED -> WINDOW_CLOSED: the tree runs on as epoch j' from j's checkpoint
//   FINISH when the tree's root ends; once every epoch committed, DETACH -> DETACHED and the exit status.
// When nobody serves the control socket (a daemon that does not speak the protocol), the tree runs in the same
// boundary without a spec session and without checkpoints, and `-v` says why.
// Epoch numbers: the stretch after SEAL(k) is k+1; a re-run gets the number READY_FOR_RESTORE names, above every
// number used before. Every daemon message is checked against this state; one that does not fit ends the run.
#pragma once

#include <cstdint>
#include <string>

#include "criu-hooks/policy.h"
#include "criu-hooks/supervisor.h"

namespace bftfs::criu {

struct RunOptions {
  SupervisorOptions supervisor;
  std::string control_socket;  // the daemon's control socket
  PolicyOptions policy;
  std::string trace_path;      // --trace: one line per seal, commit, rollback and release, monotonic microseconds
  bool stats = false;          // --stats: the report on stderr at the end
  std::string stats_json_path; // --stats-json
  bool verbose = false;        // -v: the boundary and the policy's reasons on stderr
  std::uint32_t model_mb = 512; // --model-mb, for the daemon (ATTACH)
  std::string criu_missing;    // why CRIU cannot run here, or "": fatal only when a daemon offers speculation
};

// The exit status of `bftfs run` for its own failures (no mount, CRIU missing, the daemon lost, a restore that
// failed), as env(1) and timeout(1) use it.
inline constexpr int kExitRunFailure = 125;

// Runs options.supervisor.argv as the header describes and returns the exit status: the command's (128 + N if
// signal N ended it), reported after its last epoch committed, or kExitRunFailure. Errors go to stderr.
int run_speculatively(const RunOptions& options);

}  // namespace bftfs::criu
