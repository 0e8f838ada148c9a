// When `bftfs run` takes checkpoints (docs/SPECULATION.md §10): speculation starts where the latency it would
// hide pays for the checkpoints, epochs end when they hid enough to pay for the next one, and speculation turns
// itself off where it does not pay or keeps failing. Pure: the caller feeds it the daemon's measurements (WAITS,
// SEALED, ADVICE), its own (dump and restore costs, the tree's memory) and the time, and asks what to do.
//
// The rule (share = --checkpoint-share, T_max = --max-epoch-ms, D = the checkpoint cost):
//   - D is the smoothed wall time of the last dumps that closed a speculative stretch (the dump competes with the
//     tree for the cores, so all of it counts; on_checkpoint says why the others are left out); before the first,
//     15 ms plus 1 ms per MiB of the tree's resident memory;
//   - start (or keep) speculating when lambda * T_max >= 3 D, lambda being the latency per second that
//     speculation hides: from WAITS (what would have been hidden) over the last 2 s before starting, from the
//     sealed epochs' hidden latency while speculating. An epoch then gains at least twice what its checkpoint
//     costs, a margin for what the estimate overstates (a make -j2's overlapping waits count twice). The
//     earlier rule, D / share (ten times the cost), turned off a build across a WAN that hid seven times its
//     checkpoints: 1.1 s hidden per 1 s epoch against 160 ms dumps;
//   - end an epoch at ADVICE(prediction cap or log near full), at ADVICE(hide target D / share reached) once it
//     has also run D / share of wall time, or after T_max; but never while 4 sealed epochs are uncommitted, the
//     images budget is full, or input waits to be forwarded. The wall-time floor keeps checkpoints at most
//     `share` of the run: hidden latency is the sum of every request's latency, and a tree that issues requests
//     faster than one latency apart (an unpack on a LAN) reaches D / share of it in a few tens of milliseconds;
//     ending its epochs there made checkpoints most of the run (measured: 126 checkpoints, 62% of a 9.5 s unpack);
//   - turn off for a backoff (1 s, doubling up to 60 s) when an epoch ended without paying, when the last 8
//     epochs whose fate is known hid less than their checkpoints and rollbacks cost (restore time plus the
//     discarded run time), or after two failed epochs in a row; a window of 8 epochs that pays resets the
//     backoff.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace bftfs::criu {

struct PolicyOptions {
  bool speculate = true;                     // false: never checkpoint (--no-speculate)
  double checkpoint_share = 0.1;             // checkpoints cost at most this share of the latency they hide
  std::uint64_t max_epoch_us = 1'000'000;    // T_max: also bounds how long output is held
  std::size_t max_uncommitted = 4;           // sealed epochs not yet committed, at most
  std::uint64_t backoff_min_us = 1'000'000;
  std::uint64_t backoff_max_us = 60'000'000;
  std::uint64_t waits_window_us = 2'000'000;  // lambda from WAITS is smoothed over this
  std::size_t judged_epochs = 8;
};

// What the supervisor is doing now, as the policy needs it.
struct PolicyView {
  std::uint64_t now_us = 0;
  bool tree_running = false;
  bool speculating = false;          // the open stretch is a speculative epoch
  std::uint64_t open_since_us = 0;   // when the open stretch began (its checkpoint or seal)
  std::size_t sealed_uncommitted = 0;
  bool images_full = false;          // a checkpoint would not fit in the images budget
  bool input_pending = false;        // terminal input or a signal waits until nothing speculative is outstanding
};

enum class PolicyAction : std::uint8_t {
  kNone,        // carry on
  kStart,       // not speculating: checkpoint and start an epoch
  kCheckpoint,  // speculating: end the epoch with a checkpoint and start the next
  kStop,        // speculating: seal without a dump and run on without speculation
};

class Policy {
 public:
  explicit Policy(PolicyOptions options);

  // ---- measurements ----
  // A WAITS report: in the 100 ms before `now_us`, the tree waited `waited_us` and speculation would have hidden
  // `hideable_us`.
  void on_waits(std::uint64_t now_us, std::uint64_t waited_us, std::uint64_t hideable_us);
  // The tree's resident memory, for the cost of a checkpoint before the first one is measured.
  void on_tree_memory(std::uint64_t bytes);
  // A checkpoint took `dump_us` of wall time; it begins a new epoch at `now_us`. `closed_speculative`: the stretch
  // it closed speculated. One that did not is left out of D: it is the run's first CRIU run or follows a pause,
  // and it pays once what the others do not (CRIU's kernel probes, cached in /run from then on; the write-behind
  // made final before it, across a WAN an agreement round per file); its cost still counts against the epoch it
  // began.
  void on_checkpoint(std::uint64_t now_us, std::uint64_t dump_us, bool closed_speculative = true);
  // The open epoch was sealed (its SEALED reply): it ran `duration_us` and hid `hidden_us`.
  void on_sealed(std::uint64_t duration_us, std::uint64_t hidden_us);
  // ADVICE for the open epoch: end it at the next opportunity, or, for the hide target (`hide_target`), once it
  // has run D / share.
  void on_advice(bool hide_target);
  // The oldest sealed epoch committed: its hidden latency paid off.
  void on_committed(std::uint64_t now_us);
  // The oldest sealed epoch (or the open one) failed and the tree was restored: `restore_us` to restore,
  // `discarded_us` of run time thrown away; every sealed epoch after it is discarded too, and the open one if
  // `open_discarded` (it was speculative). Call after speculate_after_failure().
  void on_rollback(std::uint64_t now_us, std::uint64_t restore_us, std::uint64_t discarded_us, bool open_discarded);

  // ---- decisions ----
  PolicyAction decide(const PolicyView& view);
  // An epoch failed: the mode of the stretch the restore begins. Speculative, unless this is the second failure
  // in a row (then the backoff starts). Call once per failure, before the restore.
  bool speculate_after_failure(std::uint64_t now_us);
  // What PREPARE asks the daemon to signal with ADVICE(hide target): D / share.
  std::uint64_t hide_target_us() const;
  // What an epoch of T_max must hide for speculation to pay: 3 D.
  std::uint64_t pays_target_us() const;
  // The checkpoint cost D now.
  std::uint64_t checkpoint_cost_us() const;
  // Latency per second speculation would hide, from the WAITS of the last window.
  std::uint64_t hideable_per_s(std::uint64_t now_us) const;
  // Why the last decision was what it was, with the numbers (for `bftfs run -v`).
  const std::string& reason() const { return reason_; }
  // Times the policy turned speculation off for a backoff.
  std::uint64_t backoffs() const { return backoffs_; }

 private:
  struct Judged {
    std::uint64_t hidden_us = 0;
    std::uint64_t cost_us = 0;
  };
  struct Waited {
    std::uint64_t at_us = 0;
    std::uint64_t hideable_us = 0;
  };
  struct Ran {
    std::uint64_t duration_us = 0;
    std::uint64_t hidden_us = 0;
  };
  PolicyAction decide_speculating(const PolicyView& view);
  PolicyAction decide_not_speculating(const PolicyView& view);
  bool pays(std::uint64_t per_s) const;
  void back_off(std::uint64_t now_us, const std::string& why);
  void judge(std::uint64_t now_us);
  std::string numbers(std::uint64_t per_s) const;

  PolicyOptions options_;
  std::deque<Waited> waits_;
  std::uint64_t memory_bytes_ = 0;
  std::uint64_t dump_us_smoothed_ = 0;  // 0 until the first dump
  std::uint64_t last_dump_us_ = 0;      // the dump that began the open epoch
  bool advised_ = false;       // the cap or the log: now
  bool advised_hide_ = false;  // the hide target: once the epoch is D / share old
  std::deque<Judged> pending_;   // sealed epochs whose fate is not known yet, oldest first
  std::deque<Judged> judged_;    // the last epochs whose fate is known
  std::deque<Ran> recent_;       // the last sealed epochs, for lambda while speculating
  std::size_t failures_in_a_row_ = 0;
  std::uint64_t backoff_us_ = 0;
  std::uint64_t backoff_until_us_ = 0;
  bool backoff_requested_ = false;  // a judgment turned speculation off: stop at the next decision
  std::uint64_t backoffs_ = 0;
  std::string reason_;
};

}  // namespace bftfs::criu
