// SpecBackend: the backend of a `bftfs run`'s spec session (docs/SPECULATION.md §6): the epoch engine between the
// session's handlers and the mount's relay connection.
//
// While the run speculates, every request of the tree is executed at once on the local model (spec::LocalModel:
// the file service's own code over a partial cache of the replicated objects plus the tree's uncommitted
// changes), answered from that result, and appended to the open epoch's log as an entry whose expectations are
// that result (§6.4, §6.6). What the model does not know is fetched first (FETCH, using the primary's early reply
// when a 1-reply prediction is allowed, §6.5). At a seal the log becomes one EPOCH request (STAGE parts before it
// when large, §6.7) chained to the epoch before it; the replicas apply it only if every entry gives there what the
// tree was told. Verdicts are taken in epoch order: COMMITTED(e) when every epoch up to e applied, FAILED(e) for
// the first that did not (§6.8); the supervisor then rolls the tree back and calls rollback() and restored().
//
// While the run does not speculate (before its first checkpoint, and whenever the supervisor says so), requests
// go to the relay as they come, TIME first (times the tree sees never go backwards across the switch), and none is
// sent before every sealed epoch committed: a non-speculative effect never follows a batch that may roll back
// (§6.10, invariant I11). Such requests never block the caller: they queue (write-behind submits under its lock).
//
// Thread-safety: every public function may be called from any thread. In speculative mode submit() runs the
// request on the caller's thread and may block for a FETCH round trip; its callback runs before it returns. The
// control functions (seal, rollback, ...) are called by the run's control connection, one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "client/backend.h"
#include "common/types.h"
#include "services/fs/fs_service.h"
#include "spec/control_wire.h"

namespace bftfs::client {

// Where the epoch engine's events (COMMITTED, FAILED, ADVICE, FATAL) go: the run's control connection.
using SpecEventSink = std::function<void(spec::DaemonMsg)>;

struct SpecBackendOptions {
  fs::FsOptions fs;       // the cluster's: positions, capacities and limits must be the replicas'
  NodeId client = 0;      // the relay's PBFT client id (the stream's owner)
  std::uint64_t stream = 0;
  // An epoch's log stays under these (§6.11): near them the supervisor is advised to checkpoint; at them a tree
  // request waits for the seal.
  std::size_t log_entries_max = 16384;
  std::size_t log_bytes_max = 8u << 20;
  // RESERVE keeps at least this many inode numbers in the stream's pool, asking for reserve_batch at a time.
  std::uint32_t pool_low = 256;
  std::uint16_t reserve_batch = 1024;
};

// Submits `request` to `backend` and waits for its final (no interrupt: for the daemon's own requests).
Final call_and_wait(Backend& backend, const fs::Request& request, bool read_only);

class SpecBackend final : public Backend {
 public:
  // `relay` (the mount's) must outlive every request this backend sent; callbacks keep the engine's state alive.
  SpecBackend(Backend& relay, SpecBackendOptions options, SpecEventSink events);
  ~SpecBackend() override;  // close() first
  SpecBackend(const SpecBackend&) = delete;
  SpecBackend& operator=(const SpecBackend&) = delete;

  std::uint64_t submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) override;
  void cancel(std::uint64_t tag) override;
  std::string describe() const override;

  // ---- the run's life (the control protocol, §9) ----

  // RESERVE of the stream's first inode numbers, waiting for its final (HELLO: this creates the stream). Returns
  // "" or why it failed.
  [[nodiscard]] std::string start();
  // ATTACH's --model-mb: the local model's memory bound (spec::LocalModel::set_memory_bound).
  void set_model_bytes(std::uint64_t bytes);
  // PREPARE: the next epoch's hide target. Then waits until no non-speculative request is queued or in flight
  // (C_1 captures a tree with nothing outstanding).
  void prepare(const spec::Prepare& p);
  // SEAL: closes stretch `s.epoch` (a speculative one becomes a batch) and opens the next in mode `s.next`.
  // Nullopt if `s.epoch` is not the open stretch.
  std::optional<spec::Sealed> seal(const spec::Seal& s);
  // ABORT: the dump announced by PREPARE failed.
  void abort();
  // FINISH: the tree's root ended; a speculative open stretch is sealed and the mode turns non-speculative.
  void finish();
  // ROLLBACK: the failed epoch `r.epoch` (the one FAILED named) and every later one are undone in the model;
  // requests queued behind them are refused; the restore window opens (the tree's requests run on the model as
  // of the checkpoint, logged into the re-run's epoch). Nullopt if `r.epoch` is not the failed epoch.
  std::optional<spec::ReadyForRestore> rollback(const spec::Rollback& r);
  // RESTORED: closes the window; clean objects are dropped (the re-run fetches consensus values) and the re-run's
  // first epoch makes no 1-reply predictions (§10).
  spec::WindowClosed restored(const spec::Restored& r);
  // True when every sealed epoch committed and nothing non-speculative is queued or in flight.
  bool all_committed() const;
  // Every 100 ms while not speculating (WAITS): what the tree's requests waited since the last call.
  std::optional<spec::Waits> take_waits();
  // Whether the open stretch speculates (the session's writes are synchronous then).
  bool speculative() const;
  // STREAM_CLOSE, waiting for its final (DETACH). Returns "" or why it failed.
  [[nodiscard]] std::string close_stream();
  // One line per fact, for --stats (STATS_REPLY).
  std::string stats_text() const;
  // Ends every wait (tree requests get EIO) and makes every later submit fail; events stop. Idempotent.
  void close();

  struct Core;  // the engine's state, shared with the callbacks of requests in flight

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace bftfs::client
