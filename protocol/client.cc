// The PBFT client (Castro & Liskov, TOCS 2002, §2.1 and §5.1). See client.h for the acceptance rules.
//
// Why each rule is safe, in short:
//   - f+1 matching committed replies: at least one comes from a correct replica, and a correct replica replies
//     "committed" only after the request committed (§2.4), so the result is the one the system agreed on.
//   - 2f+1 matching tentative replies (§5.1.2): a quorum executed the request tentatively in the same order, so
//     the request commits with that result even across a view change (any view-change quorum intersects it in
//     a correct replica that prepared it).
//   - 2f+1 matching read-only replies (§5.1.3): a quorum returned the same value, so it is a value of some state
//     of a correct replica, which is what the optimization promises; otherwise retry through ordering.
//   - Reply digests (§5.1.1): the certificate fixes the digest; the bytes can then come from anyone, since a
//     Byzantine replica cannot produce other bytes with that digest.
//
// Retransmission under load (client.h, "Retransmission"): only a request whose predecessors have all completed
// runs its timer. The replicas execute this client's ordered requests in issue order (prev_request_id), so no
// request can complete before every ordered request issued before it executed; a timer on a request behind
// them measures the backlog, not the replicas, and its retransmission (to every replica, each of which then
// starts a view-change timer) multiplies the load exactly when the system is busiest. Liveness is kept: the
// oldest request always runs its timer (with backoff), every request becomes the oldest once those before it
// complete, and a request's timer starts afresh at that moment. A new view learned from a certificate makes
// the client send its other requests in flight to the new primary at once: the old primary's queue is gone, and
// without that they would each wait for their turn as the oldest to reach it.
#include "protocol/client.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <map>
#include <utility>

#include "common/assert.h"
#include "common/prng.h"

namespace bftfs {

struct Client::Impl {
  // One submitted operation, queued or in flight, under its current wire request id.
  struct Pending {
    std::uint64_t caller_id = 0;  // what submit() returned; stays the same across a read-only fallback
    Request request;              // replier is set on each send
    bool read_only = false;       // current mode (false after a fallback)
    bool sent = false;
    std::uint32_t timeout_ticks = 0;
    // Whether its retransmission timer runs: once no ordered request issued before it is in flight (arm()).
    bool armed = false;
    std::uint64_t armed_tick = 0;  // when it was armed: its latency from there is the replicas' work for it
    bool retransmitted = false;    // Karn's rule: its latency says nothing about the network
    std::uint64_t deadline = 0;    // meaningful while armed
    // The latest reply of each replica, without its result bytes; speculative replies are not recorded here
    // (they do not vote; PBFT-CS only speculates on them).
    std::map<NodeId, Reply> replies;
    // The latest full result each replica sent. One per replica bounds what a Byzantine replica can make us
    // hold; the bytes are used only when their digest is the certificate's.
    std::map<NodeId, Bytes> results;
    bool first_reported = false;  // take_first_replies() has (or had) this request's first full reply
    std::uint64_t targets = 0;    // read-only: the replicas it was sent to (bit r = replica r)
  };

  Impl(const ClientOptions& o, NodeId self_, const Crypto& crypto_, std::uint64_t seed)
      : opt(o), self(self_), crypto(crypto_), prng(seed), next_id(o.first_request_id) {}

  const ClientOptions opt;
  const NodeId self;
  const Crypto& crypto;
  Prng prng;

  std::uint64_t now = 0;
  std::uint64_t next_id;
  // The id of the last ordered request issued (0: none yet in this incarnation). Each request names it as its
  // predecessor (Request::prev_request_id), so the replicas execute this client's ordered requests in the order
  // they were issued although several are in flight (TOCS §5.1.4) and ids have gaps (read-only requests).
  std::uint64_t last_ordered_id = 0;
  std::int64_t srtt8 = 0;    // smoothed certificate latency of ordered requests, eighths of a tick (0: none yet)
  std::int64_t rttvar8 = 0;  // its mean deviation, eighths of a tick
  std::uint64_t view = 0;
  NodeId read_only_replier = 0;  // rotates so that no one replica serves every full read-only result
  // The designated replier of ordered requests is the backup (primary + ordered_replier_offset) % n, never the
  // primary: a quiet primary (ReplicaOptions::quiet_primary) sends no vote, and with a backup as the replier it
  // need not send anything, which saves it a send and the client a wake-up per request. A retransmission moves
  // the choice to the next backup, so a silent or lying replier costs one timeout, not one per request.
  std::uint32_t ordered_replier_offset = 1;
  // Replicas that failed the last read-only request that failed (silent, or in the minority): left out of the
  // following ones (read_only_targets).
  std::uint64_t read_only_suspects = 0;

  std::map<std::uint64_t, Pending> requests;  // by wire request id: queued and in flight
  std::deque<std::uint64_t> queue;            // wire ids not yet sent, increasing
  std::size_t sent_count = 0;
  std::uint64_t sent_bytes = 0;  // operation bytes of the requests in flight (sent, not completed)

  Effects effects;
  std::vector<Completion> completions;
  std::vector<FirstReply> first_replies;
  ClientStats stats;

  NodeId primary() const { return static_cast<NodeId>(view % opt.n); }
  static std::uint64_t bit(NodeId r) { return std::uint64_t{1} << r; }

  // §5.1.3 needs 2f+1 matching replies, so a read-only request goes to 2f+1 replicas, not to all n: the others
  // would execute it and reply for nothing (replies past the certificate are dropped unread, wants_reply),
  // which on one machine is a quarter of the replicas' work for every read. Left out are the suspects of the
  // last failed read (a crashed or lying replica would otherwise make every read fall back to ordering), then
  // the primary and the replicas after it: the primary orders every write, so it is the busiest. Safety does
  // not depend on the choice (the certificate is still 2f+1 matching replies); a failed read falls back to
  // ordering as before (after asking the replicas left out, see check()) and moves the choice away from
  // whoever failed it.
  std::uint64_t read_only_targets() const {
    const std::uint32_t skip = opt.n - (2 * opt.f + 1);
    std::uint64_t skipped = 0;
    std::uint32_t count = 0;
    for (NodeId r = 0; r < opt.n && count < skip; ++r) {
      if ((read_only_suspects & bit(r)) != 0) {
        skipped |= bit(r);
        ++count;
      }
    }
    for (NodeId i = 0; i < opt.n && count < skip; ++i) {
      const NodeId r = static_cast<NodeId>((primary() + i) % opt.n);
      if ((skipped & bit(r)) == 0) {
        skipped |= bit(r);
        ++count;
      }
    }
    const std::uint64_t all = opt.n == 64 ? ~std::uint64_t{0} : bit(opt.n) - 1;
    const std::uint64_t targets = all & ~skipped;
    BFT_ASSERT(std::popcount(targets) == static_cast<int>(2 * opt.f + 1));
    return targets;
  }

  std::uint64_t deadline_after(std::uint32_t ticks) {
    // ±1/8 jitter: clients that lost replies at the same moment do not retransmit in lockstep.
    const std::uint64_t spread = ticks / 8;
    return now + prng.range(ticks - spread, ticks + spread);
  }

  void authenticate(Request& r) const {
    // §3.2: one MAC per replica over the request digest, so every replica can check it independently and a
    // backup can tell whether the primary relayed a request the client really sent.
    const Digest d = r.digest();
    r.authenticator.clear();
    r.authenticator.reserve(opt.n);
    for (NodeId i = 0; i < opt.n; ++i) r.authenticator.push_back(crypto.mac(i, d.bytes));
  }

  // Whether an ordered request issued before wire id `id` is in flight (sent, not completed): then `id` cannot
  // complete before it, and its timer waits (see the file comment).
  bool ordered_in_flight_before(std::uint64_t id) const {
    for (const auto& [other, q] : requests) {
      if (other >= id) return false;
      if (q.sent && !q.read_only) return true;
    }
    return false;
  }

  // Starts `p`'s retransmission timer, with a timeout from the latency measured so far and the bytes in flight.
  void arm(Pending& p) {
    BFT_ASSERT(p.sent);
    BFT_ASSERT(!p.armed);
    p.armed = true;
    p.armed_tick = now;
    p.timeout_ticks = first_timeout() + transfer_allowance_ticks();
    p.deadline = deadline_after(p.timeout_ticks);
  }

  // Arms every sent request that no ordered request in flight precedes any more (after a completion or a
  // fall-back removed one). Requests are visited in id order, so the scan stops at the first ordered request
  // in flight: it is the oldest, and everything after it still waits.
  void arm_ready() {
    for (auto& [id, p] : requests) {
      if (!p.sent) continue;
      if (!p.armed) arm(p);
      if (!p.read_only) return;
    }
  }

  void send_first(Pending& p) {
    BFT_ASSERT(!p.sent);
    p.sent = true;
    ++sent_count;
    sent_bytes += p.request.op.size();
    if (p.request.authenticator.empty()) authenticate(p.request);
    p.armed = false;
    if (!ordered_in_flight_before(p.request.request_id)) arm(p);
    if (p.read_only) {
      // §5.1.3: read-only requests go straight to 2f+1 replicas (read_only_targets); one of them returns the
      // full result.
      p.targets = read_only_targets();
      if (opt.use_reply_digests) {
        while ((p.targets & bit(read_only_replier)) == 0) read_only_replier = (read_only_replier + 1) % opt.n;
        p.request.replier = read_only_replier;
        read_only_replier = (read_only_replier + 1) % opt.n;
      } else {
        p.request.replier = kReplierAll;
      }
      for (NodeId r = 0; r < opt.n; ++r) {
        if ((p.targets & bit(r)) != 0) effects.sends.push_back(Send{r, Message{p.request}});
      }
    } else {
      // §2.1: first to the primary only; it relays the request inside its pre-prepare.
      p.request.replier =
          opt.use_reply_digests ? static_cast<NodeId>((primary() + ordered_replier_offset) % opt.n) : kReplierAll;
      effects.sends.push_back(Send{primary(), Message{p.request}});
    }
  }

  // Sends queued requests while fewer than `window` are in flight AND the queued id is within `window` of the
  // oldest unfinished one. The second bound is the replicas' contract (ReplicaOptions::client_window): they
  // treat an id at or below (highest executed - client_window) as stale and never execute it, so a request that
  // lags (lost, retransmitted with backoff) must not let later ids run that far ahead of it (sim finding F1).
  void pump() {
    while (sent_count < opt.window && !queue.empty()) {
      const std::uint64_t id = queue.front();
      BFT_ASSERT(!requests.empty());
      if (id >= requests.begin()->first + opt.window) break;
      queue.pop_front();
      auto it = requests.find(id);
      BFT_ASSERT(it != requests.end());
      send_first(it->second);
    }
  }

  std::uint64_t submit(Bytes op, bool read_only) {
    BFT_ASSERT(op.size() <= kOpBytesMax);
    const std::uint64_t id = next_id++;
    Pending p;
    p.caller_id = id;
    p.read_only = read_only;
    p.request.client = self;
    p.request.request_id = id;
    // A read-only request names its predecessor too: a replica answers it only once that request executed,
    // so a read issued after a write sees the write (§5.1.3 alone would let it overtake the write).
    p.request.prev_request_id = last_ordered_id;
    if (!read_only) last_ordered_id = id;
    p.request.flags = read_only ? kRequestReadOnly : 0;
    p.request.op = std::move(op);
    requests.emplace(id, std::move(p));
    queue.push_back(id);
    ++stats.submitted;
    pump();
    return id;
  }

  // §2.1: on a timeout the client broadcasts to every replica; backups relay it to the primary and start
  // their view-change timers, so a faulty primary cannot stall the request. Every replica is asked for the
  // full result, in case the designated replier is the one that is silent (§5.1.1).
  void retransmit(Pending& p) {
    p.request.replier = kReplierAll;
    if (!p.read_only) ordered_replier_offset = ordered_replier_offset % (opt.n - 1) + 1;
    effects.sends.push_back(Send{kAllReplicas, Message{p.request}});
    ++stats.retransmissions;
    p.timeout_ticks = std::min(opt.retransmit_ticks_max, p.timeout_ticks * 2);
    p.deadline = deadline_after(p.timeout_ticks);
    p.retransmitted = true;
  }

  // The client learned a new view (a certificate of it): its ordered requests in flight were sent to the old
  // primary, whose queue did not survive the view change (TOCS §4.5: a new primary orders what the VIEW-CHANGEs
  // carry and what it receives). Each goes once to the new primary, as a first send does: not a retransmission
  // (no broadcast, no backoff, no timer restarted); the new primary drops any copy it already has.
  void resend_to_new_primary() {
    for (auto& [id, p] : requests) {
      if (!p.sent || p.read_only) continue;
      effects.sends.push_back(Send{primary(), Message{p.request}});
      ++stats.resent_new_view;
    }
  }

  // §5.1.3: a read-only request without a 2f+1 certificate is re-issued as an ordered request. It needs a new
  // id (the digest covers id and flags, and replicas may already hold replies for the old one) and goes to the
  // back of the queue, so that requests still leave in increasing id order: replicas execute a client's
  // ordered requests in id order and would drop a smaller id sent after a larger one.
  void fall_back(std::uint64_t id) {
    auto it = requests.find(id);
    BFT_ASSERT(it != requests.end());
    BFT_ASSERT(it->second.read_only);
    BFT_ASSERT(it->second.sent);
    Pending p = std::move(it->second);
    requests.erase(it);
    --sent_count;
    BFT_ASSERT(sent_bytes >= p.request.op.size());
    sent_bytes -= p.request.op.size();
    ++stats.read_only_fallbacks;
    const std::uint64_t new_id = next_id++;
    p.read_only = false;
    p.sent = false;
    p.request.request_id = new_id;
    p.request.prev_request_id = last_ordered_id;  // ordered after everything issued so far
    last_ordered_id = new_id;
    p.request.flags = 0;
    p.request.authenticator.clear();
    p.replies.clear();
    p.results.clear();
    p.armed = false;
    requests.emplace(new_id, std::move(p));
    BFT_ASSERT(queue.empty() || queue.back() < new_id);
    queue.push_back(new_id);
    pump();
  }

  // RFC 6298's estimator in eighths of a tick: srtt += (sample - srtt) / 8, rttvar += (|err| - rttvar) / 4.
  void sample_latency(std::uint64_t ticks) {
    const std::int64_t sample8 = static_cast<std::int64_t>(std::min<std::uint64_t>(ticks, 1u << 20)) * 8;
    if (srtt8 == 0) {
      srtt8 = sample8;
      rttvar8 = sample8 / 2;
      return;
    }
    const std::int64_t err = sample8 - srtt8;
    srtt8 += err / 8;
    rttvar8 += ((err < 0 ? -err : err) - rttvar8) / 4;
  }

  // The latency estimate comes from the requests the client saw complete, mostly small ones; a request behind
  // megabytes of writes in flight cannot complete before those bytes crossed the network, were logged and
  // executed on every replica. Without this allowance a burst of large writes times out as a whole, every
  // request is re-sent to every replica (multiplying the bytes), and the backups that receive them start
  // view-change timers against a primary that is merely busy.
  std::uint32_t transfer_allowance_ticks() const {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(sent_bytes / opt.transfer_bytes_per_tick,
                                                              opt.retransmit_ticks_max));
  }

  std::uint32_t first_timeout() const {
    const std::int64_t rto = (srtt8 + 4 * rttvar8) / 8;
    const std::int64_t lo = opt.retransmit_ticks;
    const std::int64_t hi = opt.retransmit_ticks_max;
    return static_cast<std::uint32_t>(std::clamp(rto, lo, hi));
  }

  void complete(std::uint64_t id, std::uint64_t cert_view, Bytes result) {
    auto it = requests.find(id);
    BFT_ASSERT(it != requests.end());
    const Pending& p = it->second;
    BFT_ASSERT(p.sent);
    // From the moment no earlier request held it back: the time the replicas took for it (Karn's rule aside).
    if (!p.retransmitted && !p.read_only && p.armed) sample_latency(now - p.armed_tick);
    completions.push_back(Completion{p.caller_id, std::move(result), cert_view, p.read_only, id});
    BFT_ASSERT(sent_bytes >= p.request.op.size());
    sent_bytes -= p.request.op.size();
    requests.erase(it);  // `p` dangles from here
    --sent_count;
    ++stats.completed;
    // At least one correct replica vouches for cert_view (see check()), so the system has reached it: send
    // the next requests to its primary, and those in flight too.
    if (cert_view > view) {
      view = cert_view;
      resend_to_new_primary();
    }
    arm_ready();
    pump();
  }

  void on_tick() {
    ++now;
    std::vector<std::uint64_t> expired;
    for (const auto& [id, p] : requests) {
      if (p.sent && p.armed && p.deadline <= now) expired.push_back(id);
    }
    for (std::uint64_t id : expired) {
      Pending& p = requests.at(id);
      if (p.read_only) {
        // The targets that did not answer are left out of the next reads.
        std::uint64_t silent = p.targets;
        for (const auto& [from, r] : p.replies) silent &= ~bit(from);
        if (silent != 0) read_only_suspects = silent;
        fall_back(id);
      } else {
        retransmit(p);
      }
    }
  }

  void on_reply(NodeId from, const Reply& r) {
    // The wire layer authenticated `from` and checked these, but the client does not rely on another module
    // for its own safety: each is re-checked and counted.
    if (from >= opt.n || r.client != self || (r.flags & ~kReplyFlagsKnown) != 0) {
      ++stats.replies_rejected;
      return;
    }
    const bool has_result = (r.flags & kReplyHasResult) != 0;
    if (has_result ? digest_of(r.result) != r.result_digest : !r.result.empty()) {
      ++stats.replies_rejected;
      return;
    }
    auto it = requests.find(r.request_id);
    if (it == requests.end()) {
      // Late replies to completed (or fallen-back) requests are normal: f replicas are slower than the
      // certificate. An id this client never issued is not.
      if (r.request_id >= next_id || r.request_id < opt.first_request_id) ++stats.replies_rejected;
      return;
    }
    Pending& p = it->second;
    const bool ro_reply = (r.flags & kReplyReadOnly) != 0;
    if (!p.sent || ro_reply != p.read_only) {
      ++stats.replies_rejected;
      return;
    }
    if (has_result) p.results.insert_or_assign(from, r.result);
    if (has_result && !p.first_reported) {
      p.first_reported = true;
      // The request reached a replica that executed it: under PBFT-CS the early reply comes long before the
      // certificate when replicas are far apart (a 15 ms WAN puts it ~90 ms later), so the retransmission
      // clock starts again once, here. Once only: a primary that answers early but never orders still meets
      // a retransmission (and the backups' view-change timers) within twice the timeout.
      if (p.armed) p.deadline = std::max(p.deadline, deadline_after(p.timeout_ticks));
      ++stats.first_replies;
      first_replies.push_back(FirstReply{p.caller_id, r.request_id, from, (r.flags & kReplySpeculative) != 0,
                                         ro_reply, r.result});
    }
    if ((r.flags & kReplySpeculative) == 0) record(p, from, r);
    check(r.request_id);
  }

  // Keeps the latest vote of each replica. A committed reply supersedes a tentative one (§5.1.2: a replica
  // sends both); a reply from an older view, or a tentative one after a committed one of the same view
  // (reordered by the network), does not replace what we have.
  static void record(Pending& p, NodeId from, const Reply& r) {
    auto it = p.replies.find(from);
    if (it != p.replies.end()) {
      const Reply& old = it->second;
      if (r.view < old.view) return;
      const bool old_committed = (old.flags & kReplyTentative) == 0;
      const bool new_tentative = (r.flags & kReplyTentative) != 0;
      if (r.view == old.view && old_committed && new_tentative) return;
    }
    Reply vote = r;
    vote.result.clear();
    p.replies.insert_or_assign(from, std::move(vote));
  }

  void check(std::uint64_t id) {
    Pending& p = requests.at(id);
    const std::uint32_t quorum = 2 * opt.f + 1;
    if (p.read_only) {
      // Group by result digest only: replicas answer read-only requests outside the protocol, possibly in
      // different views during a view change, and the value is what must match.
      std::map<Digest, std::vector<std::uint64_t>> groups;  // digest -> views of the replies
      for (const auto& [from, r] : p.replies) groups[r.result_digest].push_back(r.view);
      std::size_t largest = 0;
      const Digest* largest_digest = nullptr;  // null while two groups tie for the largest
      for (auto& [digest, views] : groups) {
        if (views.size() == largest) largest_digest = nullptr;
        if (views.size() > largest) largest_digest = &digest;
        largest = std::max(largest, views.size());
        if (views.size() < quorum) continue;
        // The (f+1)-th highest view among them is held by at least one correct replica.
        std::sort(views.begin(), views.end(), std::greater<>());
        if (try_complete(id, digest, views[opt.f])) return;
      }
      // Among the replicas asked, no digest can reach 2f+1 any more (one of them is behind, or lies): ask the
      // replicas not asked yet if they can still make 2f+1 (usually the odd one out has not executed the last
      // write yet and answers from its committed state; one more read is far cheaper than an agreement), else
      // retry through ordering now rather than at the timeout. Either way the replicas outside the largest
      // group, when there is one, are left out of the next reads (one whose state differed only by a concurrent
      // write loses nothing by it: the suspects change with the next failure).
      std::size_t silent = 0;
      for (NodeId r = 0; r < opt.n; ++r) {
        if ((p.targets & bit(r)) != 0 && p.replies.count(r) == 0) ++silent;
      }
      if (largest + silent >= quorum) return;
      std::uint64_t minority = 0;
      for (const auto& [from, r] : p.replies) {
        if (largest_digest != nullptr && r.result_digest != *largest_digest) minority |= bit(from);
      }
      if (minority != 0) read_only_suspects = minority;
      const std::uint64_t all = opt.n == 64 ? ~std::uint64_t{0} : bit(opt.n) - 1;
      std::uint64_t others = all & ~p.targets;
      for (const auto& [from, r] : p.replies) others &= ~bit(from);
      if (others != 0 && largest + silent + static_cast<std::size_t>(std::popcount(others)) >= quorum) {
        p.targets = all;
        ++stats.read_only_widened;
        Request wide = p.request;
        wide.replier = kReplierAll;  // the designated replier may be the odd one out
        for (NodeId r = 0; r < opt.n; ++r) {
          if ((others & bit(r)) != 0) effects.sends.push_back(Send{r, Message{wide}});
        }
        return;
      }
      fall_back(id);
      return;
    }
    struct Tally {
      std::uint32_t committed = 0;
      std::uint32_t total = 0;
    };
    std::map<std::pair<std::uint64_t, Digest>, Tally> tallies;  // (view, digest)
    for (const auto& [from, r] : p.replies) {
      Tally& t = tallies[{r.view, r.result_digest}];
      ++t.total;
      if ((r.flags & kReplyTentative) == 0) ++t.committed;
    }
    for (const auto& [key, t] : tallies) {
      if (t.committed >= opt.f + 1 || t.total >= quorum) {
        if (try_complete(id, key.second, key.first)) return;
      }
    }
  }

  // Completes `id` with the certificate's digest if some replica sent the matching full result; otherwise the
  // request waits (the retransmission asks every replica for the full result).
  bool try_complete(std::uint64_t id, const Digest& digest, std::uint64_t cert_view) {
    Pending& p = requests.at(id);
    for (auto& [from, bytes] : p.results) {
      if (digest_of(bytes) == digest) {
        complete(id, cert_view, std::move(bytes));
        return true;
      }
    }
    return false;
  }
};

Client::Client(const ClientOptions& options, NodeId self, const Crypto& crypto, std::uint64_t prng_seed)
    : impl_(std::make_unique<Impl>(options, self, crypto, prng_seed)) {
  BFT_ASSERT(options.n >= 3 * options.f + 1);
  BFT_ASSERT(options.n <= kReplicasMax);
  BFT_ASSERT(self >= options.n);  // clients are numbered after the replicas
  BFT_ASSERT(options.window >= 1);
  BFT_ASSERT(options.retransmit_ticks >= 1);
  BFT_ASSERT(options.retransmit_ticks <= options.retransmit_ticks_max);
  BFT_ASSERT(options.transfer_bytes_per_tick >= 1);
}

Client::~Client() = default;

std::uint64_t Client::submit(Bytes op, bool read_only) { return impl_->submit(std::move(op), read_only); }

void Client::on_message(NodeId from, const Message& message) {
  if (const auto* reply = std::get_if<Reply>(&message)) {
    impl_->on_reply(from, *reply);
  } else {
    ++impl_->stats.replies_rejected;  // replicas send clients nothing but replies
  }
}

void Client::on_tick() { impl_->on_tick(); }

Effects Client::take_effects() { return std::exchange(impl_->effects, {}); }

std::vector<Completion> Client::take_completions() { return std::exchange(impl_->completions, {}); }
std::vector<FirstReply> Client::take_first_replies() { return std::exchange(impl_->first_replies, {}); }

std::size_t Client::in_flight() const { return impl_->requests.size(); }
bool Client::wants_reply(std::uint64_t wire_request_id) const {
  const bool issued = wire_request_id >= impl_->opt.first_request_id && wire_request_id < impl_->next_id;
  return !issued || impl_->requests.count(wire_request_id) != 0;
}
std::uint64_t Client::view() const { return impl_->view; }
const ClientStats& Client::stats() const { return impl_->stats; }

}  // namespace bftfs
