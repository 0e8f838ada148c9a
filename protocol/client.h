// The client side of PBFT as a pure state machine (TOCS §2.1, §5.1): send a request to the primary,
// retransmit to all replicas on timeout, accept a result once enough replicas agree, follow view changes.
//
// Acceptance rules:
//   - ordered request: f+1 matching replies that are not tentative (same view, request id, result digest), or
//     2f+1 matching replies when any of them is tentative (TOCS §5.1.2);
//   - read-only request: 2f+1 matching read-only replies (§5.1.3), asked of 2f+1 replicas only (not the
//     primary, nor the replicas that failed the last failed read); on a mismatch the others are asked too,
//     and when 2f+1 cannot match any more, or on a timeout, the request is re-sent as an ordered request with
//     the same operation and a new request id;
//   - reply digests (§5.1.1): one designated replier sends the full result, the others its digest; the result is
//     accepted when a full result whose digest matches the certificate is held; if the replier is silent, the
//     retransmission asks every replica for the full result (replier = kReplierAll).
// Pipelining (TOCS §5.1.4): up to `window` requests in flight; results complete in any order, but the replicas
// execute one client's ordered requests in the order they were issued: each request names the ordered request
// issued before it (Request::prev_request_id), and replicas hold it until that one executed. A read-only
// request names it too and is answered only after it executed.
// Retransmission (TOCS §2.1; client.cc says why each rule is safe): a request that is not answered in time is
// sent again to every replica, with the timeout doubled each time up to retransmit_ticks_max. Its timer runs
// only once no ordered request issued before it is in flight: behind them it cannot complete, and re-sending it
// would only add to the load that delays them. The first timeout adapts to the latency measured from that
// moment to completion (RFC 6298's estimator) plus an allowance for the bytes in flight. When a certificate
// shows a new view, the ordered requests still in flight go once to its primary.
// First replies (PBFT-CS, NSDI'09 §3.1): the first reply of each request that carries a full result is
// reported once, before its completion, through take_first_replies(). Under PBFT-CS it is normally the
// primary's early (speculative) reply, which never counts toward a certificate; a speculation layer
// (relay/spec_client.h) decides whether to act on it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/crypto.h"
#include "protocol/effects.h"
#include "protocol/messages.h"

namespace bftfs {

struct ClientOptions {
  std::uint32_t n = 4;
  std::uint32_t f = 1;
  std::uint32_t window = 64;                    // requests in flight; must not exceed the replicas' client_window
  // First retransmission timeout, doubled on every retransmission up to the max. The first timeout also adapts
  // to the latency the client measures (smoothed latency + 4 deviations, as TCP's RTO, RFC 6298), never below
  // retransmit_ticks: over a wide-area link the certificate takes several delays, and a retransmission goes
  // to every replica and starts the backups' view-change timers, so it must not fire while agreement is just slow.
  std::uint32_t retransmit_ticks = 100;
  std::uint32_t retransmit_ticks_max = 2000;
  // Added to the first timeout per byte of operations in flight (see transfer_allowance_ticks): a conservative
  // rate for ordering, logging and executing on a busy machine whose replicas share one disk (2 MiB/s at 1 ms
  // ticks: every replica logs and stores every byte, and the log is written with O_DSYNC).
  std::uint32_t transfer_bytes_per_tick = 2048;
  std::uint64_t first_request_id = 1;          // must exceed every id this client used before (use wall time)
  bool use_reply_digests = true;               // designate one replier per request
};

struct Completion {
  std::uint64_t request_id = 0;  // what submit() returned
  Bytes result;
  std::uint64_t view = 0;  // the view the result was accepted in
  bool read_only = false;
  // The request id the replicas executed (differs from request_id after a read-only fallback, §5.1.3).
  std::uint64_t wire_request_id = 0;
};

struct FirstReply {
  std::uint64_t request_id = 0;       // what submit() returned
  std::uint64_t wire_request_id = 0;  // the id on the wire when the reply came
  NodeId from = 0;
  bool speculative = false;  // a PBFT-CS early reply: executed before agreement
  bool read_only = false;    // an answer to a read-only (unordered) request
  Bytes result;
};

struct ClientStats {
  std::uint64_t submitted = 0;
  std::uint64_t completed = 0;
  std::uint64_t retransmissions = 0;
  std::uint64_t resent_new_view = 0;  // ordered requests sent again to a new primary (not retransmissions)
  std::uint64_t read_only_fallbacks = 0;
  std::uint64_t read_only_widened = 0;  // read-only requests also sent to the replicas first left out
  std::uint64_t replies_rejected = 0;  // wrong client, unknown request, result not matching its digest
  std::uint64_t first_replies = 0;
};

class Client {
 public:
  Client(const ClientOptions& options, NodeId self, const Crypto& crypto, std::uint64_t prng_seed);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Queues an operation; returns its request id. If `window` requests are in flight it is held back and sent
  // when one completes (ids are assigned at submit, in order).
  std::uint64_t submit(Bytes op, bool read_only = false);
  void on_message(NodeId from, const Message& message);
  void on_tick();

  Effects take_effects();  // sends only; a client persists nothing
  std::vector<Completion> take_completions();
  std::vector<FirstReply> take_first_replies();

  std::size_t in_flight() const;  // submitted and not completed
  // False when a reply to `wire_request_id` would be dropped unread whatever it says: the id was issued by this
  // client and is no longer pending (a late reply, from one of the replicas slower than the certificate). The
  // runtime asks before it authenticates a frame, so that the n - (2f+1) late replies of every request cost no
  // MAC and no decoding; an id this client never issued stays "wanted", so that it is checked and counted.
  bool wants_reply(std::uint64_t wire_request_id) const;
  std::uint64_t view() const;     // the client's belief of the current view
  const ClientStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
