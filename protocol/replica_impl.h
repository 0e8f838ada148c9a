// The state of one PBFT replica (Replica::Impl) and the map of the files that implement it. PRIVATE to the
// replica's own .cc files (protocol/replica*.cc): everything else uses protocol/replica.h, the contract.
//
// The PBFT replica core (Castro & Liskov, "Practical Byzantine Fault Tolerance and Proactive Recovery", TOCS
// 2002; cited as TOCS §x), with the PBFT-CS changes (Wester et al., NSDI 2009 §3.1). The replica is a pure state
// machine: every public call runs one handler, then `after_step()` drives whatever the new state allows
// (execution, checkpoints, batching, read-only requests, state transfer), then the invariants are checked and the
// effects are handed to the driver (through the Byzantine-behaviour filter when the simulator set one).
//
// Where each part lives (one concern per file; every file defines members of Replica::Impl):
//   replica.cc                  construction, call framing, dispatch of messages and ticks, the public interface
//   replica_log.cc              log entries: slots of the ring, per-view ordering state, votes, Q
//   replica_requests.cc         client requests (TOCS §2.1, §3.2, §5.1.3): validation, the queue, cached replies,
//                               read-only requests
//   replica_primary.cc          the primary: batching and PRE-PREPARE (TOCS §2.3, §5.1.4), the batch hold
//   replica_early_execution.cc  PBFT-CS early execution by the primary (NSDI'09 §3.1)
//   replica_normal_case.cc      pre-prepare, prepare, commit (TOCS §2.3); quiet primary; piggybacked commits
//   replica_execution.cc        execution in seq order and tentative execution (TOCS §2.3, §5.1.2), replies,
//                               rollback
//   replica_checkpoints.cc      checkpoints and garbage collection (TOCS §2.5)
//   replica_catch_up.cc         STATUS, FETCH-BATCH, BATCH-DATA (TOCS §5.2-§5.3 retransmission)
//   replica_state_transfer.cc   state transfer (TOCS §5.3) and repair of damaged service storage
//   replica_view_change.cc      view change (TOCS §4.5); the decision rule itself is new_view_decision.h
//   replica_recovery.cc         recovery from the write-ahead log
//   replica_invariants.cc       the invariants checked after every step
//
// Conventions used throughout:
// - "durable before sent" (effects.h): a handler pushes the record that backs a message before (or in the same
//   Effects as) the message; the driver writes every record of an Effects before sending any of its messages.
// - Network input never asserts: every rejection increments one ReplicaStats counter. BFT_ASSERT is only for
//   our own invariants.
// - The log is a ring of L slots indexed by seq % L holding seqs in (h, h+L] (the watermarks, TOCS §2.5).
//
// Decisions beyond the paper (each is explained where it is implemented):
// - 2f+1 matching COMMITs alone prove a batch committed; a replica that missed the pre-prepare (catch-up) or that
//   changes views alone (it cannot return to the view the others run) executes it from that certificate
//   (check_committed, on_old_commit).
// - A BATCH-DATA is accepted only for a digest already decided (pre-prepare, NEW-VIEW choice, certificate).
// - The new primary fetches the chosen bodies it lacks before it sends NEW-VIEW, so that it persists a
//   PrePrepareRecord for every re-proposed seq first (try_new_view).
// - The view-change timer waits for ordered batches to commit, not only to execute tentatively (update_timer),
//   and allows for the bytes to order and for what batches have recently taken from pre-prepare to commit
//   (work_allowance_ticks, latency_allowance_ticks): slowness of an overloaded machine is not a faulty primary.
// - Execution stops while a state transfer is under way: the install replaces the state wholesale.
// - Peers answer a STATUS only when the sender made no progress since its previous one, and at most once per
//   half status interval per peer (on_status, may_help).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/prng.h"
#include "protocol/new_view_decision.h"
#include "protocol/replica.h"
#include "protocol/replica_client_table.h"
#include "protocol/state_transfer.h"

namespace bftfs {

struct Replica::Impl {
  Impl(const ReplicaOptions& options, NodeId self_id, Service& svc, const Crypto& crypto_ctx,
       std::uint64_t prng_seed);

  // ---- limits: bounds on what peers can make us hold (house style: limits on everything) ----
  static constexpr std::size_t kFutureMessagesMax = 1024;       // messages for a view not yet entered
  static constexpr std::size_t kFutureBytesMax = 64u << 20;     // their approximate size
  static constexpr std::size_t kReadOnlyQueueMax = 4096;        // read-only requests waiting for a clean state
  static constexpr std::size_t kForwardedMax = 4096;            // request digests already forwarded to the primary
  static constexpr std::uint64_t kStatusResendSeqsMax = 128;    // seqs retransmitted in answer to one STATUS
  static constexpr std::size_t kQueuedRequestsMax = 1u << 16;   // requests known but not yet ordered, all clients
  static constexpr std::uint64_t kQueuedBytesMax = 256ull << 20;  // and their operation bytes (requests <= 1 MiB)
  static constexpr std::uint64_t kStatusResendBytesMax = 16ull << 20;  // batch bytes resent for one STATUS
  static constexpr std::uint32_t kStatusBodyIntervals = 4;      // bodies for one stuck position: once per 4 intervals
  static constexpr std::uint32_t kStatusHeartbeatIntervals = 10;  // a STATUS at least every 10 status intervals
  static constexpr std::uint64_t kQuietPauseSeqs = 128;  // no quiet batches for this many seqs after a timer release
  static constexpr std::uint32_t kBatchHoldTicksMax = 2;  // a batch hold ends at the latest on its 2nd tick
  static constexpr std::uint64_t kNotTimed = UINT64_MAX;  // Entry::ordered_tick of an entry not timed

  static int popcount(std::uint64_t v) { return std::popcount(v); }
  static std::uint64_t bit_of(NodeId r) { return std::uint64_t{1} << r; }
  static std::uint64_t batch_op_bytes(const Batch& b) {
    std::uint64_t bytes = 0;
    for (const Request& r : b.requests) bytes += r.op.size();
    return bytes;
  }

  // ---- the types of the state ----
  // The votes for one digest at one (view, seq).
  struct VoteSet {
    Digest digest;
    std::uint64_t prepares = 0;  // bit r: replica r sent PREPARE(view, seq, digest)
    std::uint64_t commits = 0;   // bit r: replica r sent COMMIT(view, seq, digest)
  };

  // COMMITs of one (view, digest) from a view before ours, counted while we change views alone (on_old_commit).
  struct OldCommits {
    std::uint64_t view = 0;
    Digest digest;
    std::uint64_t senders = 0;
  };

  // State of one sequence number in the log.
  struct Entry {
    std::uint64_t seq = 0;   // 0: the slot is unused
    std::uint64_t view = 0;  // the view of the ordering state below (votes, pre_prepared, prepared)

    // The digest this replica orders at `seq`: from an accepted PRE-PREPARE, a NEW-VIEW choice, or a certificate
    // of 2f+1 COMMITs. `batch` is its body (null while it is fetched).
    bool has_digest = false;
    Digest digest;
    std::shared_ptr<const Batch> batch;
    // The body of an earlier pre-prepared digest at this seq (a second Q entry), kept so that a new primary that
    // chooses it can fetch it from us.
    std::shared_ptr<const Batch> alt_batch;

    bool pre_prepared = false;  // PrePrepareRecord persisted for (view, seq, digest) with the body
    bool sent_prepare = false;  // this replica sent PREPARE(view, seq, digest)
    bool prepared = false;      // prepared(view, seq, digest): PreparedRecord persisted, COMMIT sent
    bool sent_commit = false;
    bool committed = false;     // committed-local (sticky across views: a committed batch never changes)

    // PBFT-CS (NSDI'09 §3.1): this replica, as primary, executed the batch before it prepared and has so far sent
    // only speculative replies for it; its ordinary reply (tentative once prepared, or committed) is still owed.
    // Cleared when the execution is rolled back.
    bool executed_early = false;
    bool vote_replies_sent = false;

    // Quiet primary (may_go_quiet): this replica, as primary of `view`, reached prepared without persisting its
    // PreparedRecord, sending its COMMIT or sending tentative votes; `p` is set but not durable. Until released
    // (release_quiet) its replies for the batch are not votes. Cleared with the view state.
    bool quiet = false;
    std::uint64_t quiet_tick = 0;  // when it went quiet (the release timer)

    // When this replica accepted the digest in `view` from the primary's PRE-PREPARE (or proposed it, as the
    // primary), kNotTimed otherwise: the start of the commit latency it samples (note_commit_latency).
    std::uint64_t ordered_tick = kNotTimed;

    std::uint64_t prepare_senders = 0;  // replicas that sent any PREPARE in `view` (one vote each)
    std::uint64_t commit_senders = 0;
    std::vector<VoteSet> votes;  // at most one set per digest, at most n sets

    bool fetching = false;  // FETCH-BATCH outstanding for `digest`
    std::uint32_t fetch_ticks_left = 0;
    std::uint32_t fetch_attempts = 0;  // FETCH-BATCH sent for it so far (each to one peer: send_fetch)

    // COMMITs of views before ours received while we change views alone (see on_old_commit): one per sender.
    std::uint64_t old_commit_senders = 0;
    std::vector<OldCommits> old_commits;  // at most n

    // View-change information (TOCS §4.5), kept across views until the seq leaves the window.
    std::optional<PreparedClaim> p;       // latest prepared (seq, digest, view)
    std::array<PreparedClaim, 2> q{};     // pre-prepared (seq, digest, view), highest views, distinct digests
    std::uint8_t q_count = 0;
  };

  // A request known to this replica, fresh and not ordered by it yet, with its digest.
  struct QueuedRequest {
    Request request;
    Digest digest;
  };

  // A checkpoint this replica took (or installed, or recovered) at some seq.
  struct OwnCheckpoint {
    Digest digest;
    Bytes client_table;     // serialized client table at seq
    bool retained = false;  // the service still holds this checkpoint (can serve it / use its tree)
  };

  // The new primary's NEW-VIEW while it fetches the chosen bodies it lacks (try_new_view).
  struct PendingNewView {
    NewView nv;                 // unsigned yet
    NewViewDecision decision;
    std::map<std::uint64_t, Digest> missing;  // chosen bodies this primary must fetch before sending NEW-VIEW
    std::map<std::uint64_t, std::shared_ptr<const Batch>> bodies;
    std::uint32_t fetch_ticks_left = 0;
    std::uint32_t fetch_rounds = 0;  // FETCH-BATCH broadcasts so far (they back off like send_fetch)
  };

  // PBFT-CS: requests the primary executed on receipt, at sequence number `seq`, before the batch was sent.
  struct OpenBatch {
    std::uint64_t seq = 0;
    Batch batch;  // timestamp chosen when the batch opened; requests in execution order
    std::size_t bytes = 0;
  };

  // How a reply reports the execution it comes from.
  enum class ReplyKind : std::uint8_t {
    kCommitted,    // the batch committed (TOCS §2.4)
    kTentative,    // executed after prepared, before commit (TOCS §5.1.2): one of 2f+1 votes
    kSpeculative,  // PBFT-CS early reply of the primary: a prediction, never a vote (NSDI'09 §3.1)
    kQuiet,        // a quiet primary's execution of a prepared batch (may_go_quiet): the result, never a vote
  };

  // The Reply flags that report `k` to the client.
  static std::uint8_t reply_flags(ReplyKind k) {
    switch (k) {
      case ReplyKind::kCommitted:
        return 0;
      case ReplyKind::kTentative:
        return kReplyTentative;
      case ReplyKind::kSpeculative:
      case ReplyKind::kQuiet:
        return kReplySpeculative;  // the client keeps the result and counts no vote (Client::on_reply)
    }
    return 0;
  }

  struct DeferredChoice {  // a NEW-VIEW choice above this replica's window, applied when the window moves
    Digest digest;
    std::shared_ptr<const Batch> body;
  };

  // ---- configuration ----
  const ReplicaOptions opt;
  const NodeId self;
  Service& service;
  const Crypto& crypto;
  const std::uint32_t quorum;  // 2f+1
  const std::uint32_t weak;    // f+1
  Prng prng;
  StateFetcher fetcher;

  // ---- view (TOCS §2.2) ----
  std::uint64_t view = 0;
  bool in_view_change = false;

  // ---- sequence state ----
  std::uint64_t h = 0;  // stable checkpoint: low watermark
  Digest stable_digest;
  std::uint64_t last_executed = 0;
  std::uint64_t last_committed = 0;
  std::uint64_t last_executed_timestamp_ns = 0;  // timestamp of the last executed non-null batch (0: unknown)
  std::vector<Entry> ring;                        // L slots
  std::uint64_t max_ordered_seq = 0;  // highest seq given a digest in the current view (timer, status)
  // Recovery: the highest seq with a PreparedRecord in the log we recovered from. Read-only requests wait until
  // it has committed here (process_read_only).
  std::uint64_t reads_wait_for_seq = 0;
  std::set<std::uint64_t> fetching_seqs;

  // ---- primary (TOCS §2.3, batching §5.1.4) ----
  std::uint64_t next_seq = 1;
  // The primary never assigns a seq below this in its view: one past the last seq its NEW-VIEW re-proposed, or
  // past its last PrePrepareRecord after a restart. It may lie above the window (a new primary whose stable
  // checkpoint is behind the chosen one); the primary then waits for the window to move.
  std::uint64_t next_seq_floor = 1;
  // The view this replica recovered in, after a restart from a non-empty log: it sends no PREPARE in that view
  // (see rejoin() and effects.h: a PREPARE it sent before the crash may be forgotten, and voting again could
  // prepare a second digest for one (view, seq)). Its COMMITs stay allowed: prepared needs only the pre-prepare
  // and 2f prepares of OTHER replicas, and a certificate without this replica's vote cannot conflict with one
  // that holds its forgotten vote (the two quorums share a correct replica other than this one).
  bool prepare_silenced = false;
  std::uint64_t silenced_view = 0;
  std::uint64_t last_timestamp_ns = 0;
  std::uint64_t wall_clock_ns = 0;
  // PBFT-CS: the batch being filled by early execution. When present, open_batch->seq == last_executed + 1 ==
  // next_seq - 1, this replica is the primary, and the service and client table hold its executions at that
  // seq (tentative), while the log has no entry for it yet.
  std::optional<OpenBatch> open_batch;

  // ---- requests ----
  ClientTable clients;
  std::map<NodeId, std::map<std::uint64_t, QueuedRequest>> queue;  // known, fresh, not ordered by us
  std::size_t queued_count = 0;
  std::uint64_t queued_bytes = 0;  // operation bytes of the queued requests
  std::deque<NodeId> tickets;  // primary: one per queued request, in arrival order
  std::set<std::pair<NodeId, std::uint64_t>> pending;  // primary: ordered, not yet executed
  // Batch hold (hold_for_returning): clients this primary answered since its last PRE-PREPARE that had nothing else
  // queued or ordered; whether the last maybe_send_pre_prepares held a batch back for them; whether that wait ended.
  std::set<NodeId> returning;
  bool batch_held = false;
  bool hold_ended = false;
  std::uint32_t hold_ticks = 0;  // ticks seen while held
  std::set<Digest> forwarded;                           // backup: forwarded to the primary in this view
  std::deque<Request> read_only_queue;

  // ---- checkpoints (TOCS §2.5) ----
  std::map<std::uint64_t, OwnCheckpoint> own_checkpoints;  // seq >= h; always holds h
  std::vector<std::map<std::uint64_t, Digest>> claims;     // [replica]: CHECKPOINT claims above h

  // ---- view change (TOCS §4.5) ----
  std::vector<std::optional<ViewChange>> view_changes;  // [replica]: the valid one for its highest view
  std::optional<NewView> last_new_view;                 // the NEW-VIEW of the current view (retransmission)
  std::optional<PendingNewView> pending_new_view;       // new primary waiting for bodies
  std::map<std::uint64_t, DeferredChoice> deferred;     // NEW-VIEW choices above our window
  // Piggybacked commits (defer_commit): our COMMITs of the current view not sent yet, in seq order, and the tick
  // when the first of them was deferred.
  std::vector<Commit> deferred_commits;
  std::uint64_t commits_deferred_tick = 0;
  // Quiet primary: no batch below this seq goes quiet (set when a quiet batch had to be released by the timer).
  std::uint64_t quiet_resume_seq = 0;
  std::uint64_t vc_timer_ticks_left = 0;                // 0: not running
  std::uint32_t vc_backoff = 0;                         // view changes since the last progress
  // How long batches take here from PRE-PREPARE to commit (note_commit_latency): RFC 6298's smoothed latency
  // and mean deviation, in eighths of a tick (0: no sample yet). The view-change timer allows for it.
  std::int64_t commit_srtt8 = 0;
  std::int64_t commit_rttvar8 = 0;

  std::deque<std::pair<NodeId, Message>> future;  // messages for a view not yet entered
  std::size_t future_bytes = 0;
  std::vector<std::size_t> future_per_sender;  // each replica may fill at most its share of the buffer

  // ---- retransmission and state transfer (TOCS §5.3) ----
  std::uint64_t ticks = 0;
  std::uint64_t status_ticks_left = 0;
  std::vector<std::optional<Status>> peer_status;
  std::vector<std::uint32_t> peer_stuck_rounds;  // consecutive STATUS messages without commit progress
  // Retransmissions a peer triggers (answers to STATUS, NEW-VIEW for a stale VIEW-CHANGE) are rate limited per
  // peer: a faulty replica must not turn small messages into a stream of batch bodies.
  std::vector<std::uint64_t> last_help_tick;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> last_fetch_served;  // per peer: (seq, tick) of the last body
  std::vector<std::pair<std::uint64_t, std::uint64_t>> status_bodies_sent;  // per peer: (its last_committed, tick)
  std::uint64_t committed_at_last_status = 0;
  std::uint32_t statuses_skipped = 0;  // status intervals since our last STATUS broadcast (on_status_timeout)
  // After a restart the service's durable checkpoint may have no client table to pair it with: a store written
  // before the service kept the engine state with its checkpoint (Service::recovered_engine_state), whose log
  // lost the CheckpointRecord, or a table that does not match the checkpoint; then the replica cannot execute
  // until state transfer replaces both.
  bool service_diverged = false;
  std::uint64_t diverged_service_seq = 0;
  // The service's recovered checkpoint with its client table, when the log cannot take us there: a crash
  // after Service::checkpoint(s) made both durable but before the log held the committed batches up to s.
  // The state is ours (we executed every batch up to s) and we claim it (the CheckpointRecord backs the
  // claim), but h stays at the recorded stable checkpoint and nothing executes (service_diverged) until the
  // checkpoint is stable (check_stable) or a new view starts from it; then it becomes our stable checkpoint as
  // a fetched one would (adopt_recovered_checkpoint). If all 2f+1 replicas that crashed together are in this
  // state, their claims are what makes s stable: waiting for a state transfer would wait forever.
  struct RecoveredCheckpoint {
    std::uint64_t seq = 0;
    Digest digest;
    Bytes client_table;
  };
  std::optional<RecoveredCheckpoint> recovered_pending;
  // The service reported damaged partitions (Service::damaged_partitions): unlike a diverged service after a
  // restart, its newest checkpoint is still good except those partitions, so a state transfer fetches only
  // what differs from that checkpoint with the damaged leaves blanked (repair_tree keeps that copy alive).
  bool service_damaged = false;
  std::optional<PartitionTree> repair_tree;
  std::uint64_t fetch_bytes_at_start = 0;

  // ---- output ----
  Effects out;
  Effects scratch;
  Effects* cur = &out;
  EffectsFilter filter;
  bool replaying = false;  // recovery re-execution: no replies
  ReplicaStats stats;
  std::vector<ExecutedBatch> history;

  std::uint32_t calls_since_full_check = 0;  // calls since the last full invariant check (end_call)

  // ---- small helpers used everywhere ----
  NodeId primary_of(std::uint64_t v) const { return static_cast<NodeId>(v % opt.n); }
  bool is_primary() const { return !in_view_change && primary_of(view) == self; }
  std::string ctx() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "r%u v%llu s%llu", self, static_cast<unsigned long long>(view),
                  static_cast<unsigned long long>(last_executed));
    return buf;
  }
  void persist(PersistRecord r) { cur->persist.push_back(std::move(r)); }
  void send(NodeId to, Message m) { cur->sends.push_back(Send{to, std::move(m)}); }
  void broadcast(Message m) {
    // A PRE-PREPARE or PREPARE carries our deferred COMMITs along: they go first, into the same write.
    if (!deferred_commits.empty() &&
        (std::holds_alternative<PrePrepare>(m) || std::holds_alternative<Prepare>(m))) {
      flush_commits();
    }
    cur->sends.push_back(Send{kAllReplicas, std::move(m)});
  }
  bool in_window(std::uint64_t s) const { return s > h && s <= h + opt.log_window; }
  Entry* find(std::uint64_t s) {
    if (!in_window(s)) return nullptr;
    Entry& e = ring[s % opt.log_window];
    return e.seq == s ? &e : nullptr;
  }
  const Entry* find(std::uint64_t s) const { return const_cast<Impl*>(this)->find(s); }
  void unqueue_bytes(const QueuedRequest& qr) {
    BFT_ASSERT(queued_bytes >= qr.request.op.size());
    queued_bytes -= qr.request.op.size();
  }
  bool commits_piggybacked() const { return opt.piggyback_commits && opt.tentative_execution; }

  // ---- entry points (replica.cc) ----
  void begin_call();
  void end_call();
  void after_step();
  void dispatch(NodeId from, const Message& m);
  bool accept_view(NodeId from, std::uint64_t msg_view, const Message& m);
  void buffer_future(NodeId from, const Message& m);
  void replay_future();
  void on_tick();
  bool idle() const;

  // ---- log entries (replica_log.cc) ----
  Entry& get_or_create(std::uint64_t s);
  void reset_view_state(Entry& e, std::uint64_t v, bool keep_digest);
  VoteSet& votes_for(Entry& e, const Digest& d);
  const VoteSet* find_votes(const Entry& e, const Digest& d) const;
  void add_q(Entry& e, std::uint64_t v, const Digest& d);

  // ---- client requests (replica_requests.cc) ----
  void on_request(NodeId from, const Request& r);
  std::optional<Digest> validate_request(const Request& r);
  void enqueue(const Request& r, const Digest& d);
  void forget_request(NodeId client, std::uint64_t request_id);
  void forget_executed_requests();
  void rebuild_pending();
  void send_cached_reply(NodeId client, std::uint64_t request_id);
  void process_read_only();

  // ---- the primary: batching and pre-prepare (replica_primary.cc) ----
  void maybe_send_pre_prepares();
  std::optional<QueuedRequest> pop_ticket(std::size_t batch_bytes, bool batch_empty, std::size_t& size);
  bool ready_to_order(const Request& r) const;
  bool any_ready_queued() const;
  void trim_tickets();
  bool hold_for_returning() const;
  void note_returning(NodeId client);
  void end_batch_hold();
  void reset_batch_hold();
  void send_pre_prepare(Batch&& b);
  std::uint64_t next_batch_timestamp();
  Entry& propose(std::uint64_t s, std::shared_ptr<const Batch> body);

  // ---- PBFT-CS early execution (replica_early_execution.cc) ----
  std::uint64_t closed_in_flight() const;
  std::uint64_t batches_in_flight(std::uint64_t last_sent) const;
  bool can_open_batch() const;
  void order_early();
  void close_open_batch();
  void discard_open_batch();

  // ---- pre-prepare, prepare, commit (replica_normal_case.cc) ----
  void on_pre_prepare(NodeId from, const PrePrepare& pp, const Message& m);
  void attach_body(Entry& e, std::shared_ptr<const Batch> body);
  bool record_vote(Entry& e, NodeId from, const Digest& d, bool commit);
  void on_prepare(NodeId from, const Prepare& p, const Message& m);
  void on_commit(NodeId from, const Commit& c, const Message& m);
  void on_old_commit(NodeId from, const Commit& c);
  void learn_committed(Entry& e, std::uint64_t v, const Digest& d);
  void check_prepared(Entry& e);
  bool may_go_quiet(const Entry& e) const;
  void promise_prepared(Entry& e);
  void release_quiet(Entry& e, bool send_votes);
  void persist_quiet_claims();
  void release_quiet_on_timer();
  void defer_commit(const Entry& e);
  void flush_commits();
  void check_committed(Entry& e);

  // ---- execution (replica_execution.cc) ----
  void run_execution();
  void commit_next();
  void execute_batch(Entry& e, ReplyKind kind);
  bool execute_request(const Request& r, std::uint64_t seq, std::uint64_t reply_view, std::uint64_t timestamp_ns,
                       ReplyKind kind);
  void defer_out_of_order(const Request& r);
  void send_reply(const Request& r, std::uint64_t reply_view, ReplyKind kind, const Bytes& result);
  void send_vote_replies(Entry& e, ReplyKind kind);
  void send_batch_replies(const Entry& e, ReplyKind kind);
  void on_commit_progress();
  void note_commit_latency(const Entry& e);
  void rollback_to(std::uint64_t s);

  // ---- checkpoints and garbage collection (replica_checkpoints.cc) ----
  void take_checkpoint(std::uint64_t s);
  void add_claim(NodeId r, std::uint64_t s, const Digest& d);
  void on_checkpoint(NodeId from, const Checkpoint& c);
  void check_stable(std::uint64_t s);
  void make_stable(std::uint64_t s, const Digest& d);
  void advance_window();
  void apply_deferred();

  // ---- catch-up: STATUS, FETCH-BATCH, BATCH-DATA (replica_catch_up.cc) ----
  void on_status_timeout();
  Status own_status() const;
  bool status_needed() const;
  bool may_help(NodeId peer);
  void on_status(NodeId from, const Status& st);
  void send_position(NodeId from, const Status& st);
  void help_stuck_peer(NodeId from, const Status& st);
  void start_fetch(Entry& e);
  void send_fetch(Entry& e);
  std::uint32_t fetch_retry_after(std::uint32_t attempts);
  void on_fetch_batch(NodeId from, const FetchBatch& fb);
  bool find_body(std::uint64_t s, const Digest& d, std::shared_ptr<const Batch>& out);
  void on_batch_data(NodeId from, const BatchData& bd);

  // ---- state transfer (replica_state_transfer.cc) ----
  void check_state_transfer(bool stalled);
  bool check_service_damage();
  void start_state_fetch(std::uint64_t s, const Digest& d);
  void poll_fetcher();
  void install_fetched_state(FetchedState&& fs);
  void on_fetch_state(NodeId from, const FetchState& fs);

  // ---- view change (replica_view_change.cc) ----
  std::uint64_t view_change_timeout_ticks();
  void update_timer();
  std::uint64_t work_allowance_ticks() const;
  std::uint64_t latency_allowance_ticks() const;
  void on_view_change_timeout();
  bool lagging_behind_view() const;
  std::size_t view_changes_for(std::uint64_t v) const;
  void start_view_change(std::uint64_t new_view);
  ViewChange build_view_change() const;
  void on_view_change(NodeId from, const ViewChange& vc);
  void try_new_view();
  void finish_new_view();
  void on_new_view(NodeId from, const NewView& nv);
  void install_new_view(const NewView& nv, const NewViewDecision& decision,
                        const std::map<std::uint64_t, std::shared_ptr<const Batch>>& bodies);
  void enter_view(const NewView& nv);
  void undo_unchosen_executions(const NewViewDecision& decision);
  void start_from_checkpoint(const NewViewDecision& decision);
  void install_choices(const NewViewDecision& decision,
                       const std::map<std::uint64_t, std::shared_ptr<const Batch>>& bodies);
  void continue_as_primary(const NewViewDecision& decision);

  // ---- recovery from the write-ahead log (replica_recovery.cc) ----
  struct RecoveredLog;  // what the records say (defined in replica_recovery.cc)
  void recover(const std::vector<PersistRecord>& log);
  static RecoveredLog read_log(const std::vector<PersistRecord>& log);
  std::uint64_t pair_service_state(const RecoveredLog& rl, const CheckpointId& sc);
  std::uint64_t pair_with_table(const RecoveredLog& rl, const CheckpointId& sc, const Bytes& table);
  std::uint64_t diverge_at_recovery(const RecoveredLog& rl, const CheckpointId& sc);
  bool log_committed_through(const RecoveredLog& rl, std::uint64_t from, std::uint64_t to) const;
  void adopt_recovered_checkpoint();
  void become_stable_at(std::uint64_t s, const Digest& d, Bytes table_bytes, ClientTable table);
  void restore_stable_checkpoint(const RecoveredLog& rl, const CheckpointId& sc, std::uint64_t base);
  void rebuild_log(RecoveredLog& rl);
  void rejoin(const RecoveredLog& rl, bool first_start);

  // ---- invariants (replica_invariants.cc) ----
  static constexpr std::uint32_t kFullCheckEvery = 64;  // calls between two full checks (end_call)
  void check_invariants_fast() const;
  void check_invariants() const;
};

}  // namespace bftfs
