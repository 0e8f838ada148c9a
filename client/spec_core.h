// Private to client/spec_backend.cc and client/spec_epochs.cc: the state of SpecBackend's epoch engine
// (client/spec_backend.h). One mutex guards all of it; callbacks of requests in flight hold a shared_ptr to it,
// so it outlives the backend while the relay still owes results.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/spec_backend.h"
#include "spec/entry_builder.h"
#include "spec/epoch_log.h"
#include "spec/local_model.h"

namespace bftfs::client {

using SteadyTime = std::chrono::steady_clock::time_point;

struct SpecBackend::Core : std::enable_shared_from_this<SpecBackend::Core> {
  Core(Backend& r, SpecBackendOptions o, SpecEventSink e)
      : relay(r), opt(o), events(std::move(e)), model(o.fs, o.client, o.stream), log(o.stream) {}

  Backend& relay;
  const SpecBackendOptions opt;
  SpecEventSink events;  // called only with `mu` unlocked (emit)

  mutable std::mutex mu;
  std::condition_variable cv;  // any change a waiter may look for
  std::atomic<bool> closed{false};
  // Bumped by every rollback: a tree request still running from before it belongs to the killed tree and is
  // neither executed nor logged any more.
  std::uint64_t generation = 0;

  spec::LocalModel model;
  spec::EpochLog log;

  // ---- stretches (the supervisor's numbering, §9) ----
  std::uint64_t stretch = 0;   // the open stretch
  std::uint64_t max_used = 0;  // the highest stretch number used
  bool speculative = false;    // the open stretch speculates
  bool window = false;         // a restore window is open (between ROLLBACK and RESTORED)
  bool consensus_only = false; // the open epoch makes no 1-reply predictions (the first after a rollback)
  bool plain_since_spec = false;  // non-speculative requests were sent since the model was last emptied

  // The open epoch's measurements (SEALED) and the advice already given in it.
  struct Open {
    std::uint32_t entries = 0;
    std::uint32_t one_reply = 0;
    std::uint64_t hidden_us = 0;
    bool advised_hide = false, advised_cap = false, advised_log = false;
  } open;
  std::uint64_t hide_target_us = 0;

  // ---- sealed epochs, oldest first (verdicts are taken in this order) ----
  struct Sealed {
    std::uint64_t stretch = 0;
    std::uint64_t epoch = 0;  // the EpochLog's number (the chain's)
    std::uint64_t entries = 0;
    bool internal = false;    // sealed by the daemon itself (a restore window's changes): no events
    bool final = false;
    std::optional<fs::OpResult> verdict;  // the EPOCH's result, when it carried one
    std::string refused;                  // why the relay refused it
  };
  std::deque<Sealed> sealed;
  bool failure_reported = false;  // FAILED(sealed.front()) was sent; waiting for ROLLBACK
  // Between PREPARE and SEAL or ABORT: a dump is freezing the tree, so no request may wait for a seal.
  bool dumping = false;

  // ---- the stream's pool of inode numbers (§5.6) ----
  std::uint64_t reserved = 0;  // inode numbers RESERVE put into the pool
  std::uint64_t creates = 0;   // ... that answered entries of epochs not rolled back took
  std::map<std::uint64_t, std::uint64_t> creates_by_epoch;
  bool reserving = false;
  std::string reserve_error;  // a RESERVE failed: creates fail with ENOSPC
  // Every inode number RESERVE put into the pool, by pool index (pool_first + i): after the model drops its clean
  // objects, those no create has taken yet (index >= pool_first + creates) are known again without a FETCH
  // (a trace on the replicas would name the replicas' pool front, which uncommitted creates have passed).
  std::uint64_t pool_first = 0;
  std::vector<fs::ReservedInode> pool;
  // Drops the model's clean objects, then puts back what is still true of the pool.
  void drop_clean_locked();

  // ---- non-speculative requests ----
  struct Plain {
    std::uint64_t tag = 0;
    fs::Request request;
    SubmitOptions options;
    Callbacks callbacks;
  };
  std::deque<Plain> plain_queue;                 // waiting for the sealed epochs to commit
  // Refused because an epoch before them failed (the tree is about to be killed, and a FUSE request the daemon
  // has read cannot be abandoned by the kernel, even for SIGKILL): answered once `mu` is released.
  std::deque<Plain> refused_plain;
  void answer_refused();  // unlocked
  std::map<std::uint64_t, std::uint64_t> plain_tags;  // in flight: our tag -> the relay's
  std::uint64_t next_tag = 1;

  // ---- latency (§10) ----
  double ordered_us = 0, read_only_us = 0;  // smoothed submission-to-final times (0: none measured yet)
  std::uint64_t waited_us = 0, hideable_us = 0;  // since the last WAITS
  std::uint32_t waited_requests = 0;

  // ---- times the tree sees (§6.4 step 1) ----
  std::uint64_t last_time_ns = 0;
  std::uint64_t newest_seen_ns = 0;

  // ---- 1-reply predictions (§6.5): the last compared first replies, true = differed ----
  std::deque<bool> compared;
  std::uint32_t mismatches = 0;

  // ---- --stats ----
  struct Stats {
    std::uint64_t entries = 0, fetches = 0, first_used = 0, first_wrong = 0, inconsistent = 0, reserves = 0,
                  stages = 0, sealed = 0, committed = 0, failed = 0, plain = 0, hidden_us = 0;
  } stats;

  // ---- spec_backend.cc ----
  std::uint64_t next_time_locked();
  void note_times_locked(const fs::Result& r);
  std::uint32_t cap_locked() const;
  bool one_reply_allowed_locked() const;
  struct Fetched {
    std::optional<fs::OpResult> result;  // the FETCH's result (nothing: refused, or the run ended)
    bool used_first = false;             // it is the first reply's (a 1-reply prediction)
    std::uint64_t waited_us = 0;
  };
  // Sends a FETCH and waits for its first reply (if `first_ok` and it is usable) or its final. Unlocked.
  Fetched fetch(fs::Request request, bool first_ok);
  // A first reply a prediction used met its final; `differs` counts toward the cap's lie rate.
  void first_compared(bool differs);
  void answer_locked(std::unique_lock<std::mutex>& lk, const fs::Request& request, const SubmitOptions& options,
                     fs::Request entry, const fs::Result& result, std::uint64_t need, std::uint64_t waited_us,
                     Callbacks& cb);
  std::vector<spec::DaemonMsg> advice_locked();
  bool recently_read_locked(const fs::Request& request);
  std::unordered_map<std::string, SteadyTime> recent_reads;  // metadata reads counted as hidden, by object/name
  SteadyTime recent_pruned{};
  void run_speculative(std::unique_lock<std::mutex>& lk, const fs::Request& request, const SubmitOptions& options,
                       Callbacks& cb);
  void submit_plain_locked(Plain p);
  void send_plain_locked(Plain p);
  void plain_final(std::uint64_t tag, SteadyTime start, bool read_only, bool counts, const Final& f);
  void ensure_pool_locked();
  void note_latency_locked(bool read_only, SteadyTime start);
  // Sends `r` (an ordered stream request: RESERVE, STAGE, EPOCH) whose result nobody waits for but `then` (may
  // be null). `sample`: its latency updates ordered_us (a RESERVE only: a
  // batch of a whole epoch takes longer to order and apply than the single request whose wait the model hides,
  // and sampling batches made the hidden latency several times what a plain run waits).
  void send_stream_locked(fs::Request r, std::function<void(const Final&)> then, bool sample = false);

  // ---- spec_epochs.cc ----
  void seal_locked(bool internal);
  void epoch_final(std::uint64_t epoch, const Final& f);
  // Takes the verdicts at the front of `sealed`; returns the events to send.
  std::vector<spec::DaemonMsg> verdicts_locked();
  void flush_plain_locked();
  void emit(std::vector<spec::DaemonMsg> msgs);
  // emit() with `lk` released meanwhile.
  void emit_unlocked(std::unique_lock<std::mutex>& lk, std::vector<spec::DaemonMsg> msgs);
};

// The one OpResult of a stream op's final, if it executed without an errno.
std::optional<fs::OpResult> stream_result(const Final& f, fs::OpCode code);
// A final for a request the engine answers without executing it (EIO to the caller), saying why.
Final refused(std::string why);

}  // namespace bftfs::client
