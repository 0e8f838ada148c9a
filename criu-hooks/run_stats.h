// What `bftfs run --stats` reports at the end (docs/SPECULATION.md §15): the run and its speculation, the
// checkpoints and rollbacks with their costs, the latency hidden, the held output; `--stats-json FILE` writes the
// same with every checkpoint and rollback listed. Pure: the driver fills RunStats, these functions format it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bftfs::criu {

struct CheckpointStat {
  std::uint64_t epoch = 0;  // the epoch it began
  std::uint64_t wall_us = 0;
  std::uint64_t frozen_us = 0;
  std::uint64_t freezing_us = 0;
  std::uint64_t frozen_work_us = 0;
  std::uint64_t seal_us = 0;
  std::uint64_t image_bytes = 0;
};

struct RollbackStat {
  std::uint64_t epoch = 0;  // the failed epoch
  std::uint64_t rerun = 0;
  std::uint8_t cause = 0;   // spec::FailCause
  std::string detail;
  std::uint64_t restore_us = 0;    // from the decision until the restored tree runs
  std::uint64_t kill_reap_us = 0;
  std::uint64_t tmp_us = 0;
  std::uint64_t restore_call_us = 0;
  std::uint64_t discarded_us = 0;  // run time thrown away
  bool rerun_speculative = true;
};

struct RunStats {
  std::uint64_t run_us = 0;
  int exit_code = 0;
  // Time by mode.
  std::uint64_t speculating_us = 0;
  std::uint64_t warmup_us = 0;         // not speculating before the first checkpoint
  std::uint64_t input_us = 0;          // paused for terminal input or a signal
  std::uint64_t after_rollback_us = 0; // re-runs without speculation after failures
  std::uint64_t policy_off_us = 0;     // speculation did not pay (backoffs, --no-speculate)
  // Epochs.
  std::uint64_t epochs_committed = 0;
  std::uint64_t epochs_discarded = 0;  // failed ones and those after them
  std::vector<CheckpointStat> checkpoints;
  std::uint64_t checkpoint_failures = 0;
  std::vector<RollbackStat> rollbacks;
  // From the daemon.
  std::uint64_t entries = 0;
  std::uint64_t one_reply = 0;
  std::uint64_t log_bytes = 0;
  std::uint64_t cap_advices = 0;
  std::uint64_t hidden_us = 0;
  std::uint64_t waited_us = 0;
  std::string daemon_text;  // STATS_REPLY, one line per item
  // Input and output.
  std::uint64_t output_bytes_released = 0;
  std::uint64_t output_bytes_dropped = 0;
  std::uint64_t output_bytes_held_max = 0;
  std::uint64_t output_hold_us_max = 0;
  std::uint64_t stdin_bytes_replayed = 0;
  std::uint64_t signals_forwarded = 0;
  std::uint64_t keystroke_bytes_forwarded = 0;
  std::uint64_t backoffs = 0;
};

// The lines `--stats` prints, each starting with a label padded to 13 columns.
std::string format_stats_text(const RunStats& s);
// The same as one JSON object (every checkpoint and rollback listed).
std::string format_stats_json(const RunStats& s);
// The value at quantile q (0..1) of `v`, 0 if empty.
std::uint64_t quantile(std::vector<std::uint64_t> v, double q);

}  // namespace bftfs::criu
