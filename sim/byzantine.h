// Byzantine replica strategies for the simulator. A Byzantine replica runs the real Replica core; its lies
// are made by rewriting the core's outgoing effects (Replica::set_effects_filter) and by injecting frames the
// core never asked for, signed or MACed with the replica's own keys (a Byzantine replica holds its own
// secrets, never anyone else's). Every choice comes from a Prng seeded by the run's seed.
//
// Each strategy attacks one part of the protocol:
//   equivocate        as primary, pre-prepares whose batches (and so digests) differ per backup: requests
//                     reordered, dropped or duplicated, or another timestamp (TOCS §2.3)
//   corrupt-digests   prepare, commit and checkpoint digests replaced for some receivers
//   wrong-replies     replies whose result is wrong but whose digest matches it, some claimed non-tentative
//   forge-macs        frames with a flipped byte, or with another replica's id as sender (the MAC fails)
//   withhold          drops every message, some message types, or every message to some nodes
//   replay            re-sends old messages (its own and those it received) much later
//   random-frames     random bytes; headers with random bodies under a valid MAC; valid frames with a flipped
//                     body byte and a fresh MAC, so that every decoder check runs on live traffic
//   lying-view-change view changes with false P/Q entries and checkpoint claims (validly signed: it signs
//                     them itself), true entries omitted, spontaneous view changes; tampered new-views
//   silent-primary    never proposes: pre-prepares and new-views are dropped
//   mixed             any of the rewrites above, chosen per message
//   lying-early-replies  (PBFT-CS, NSDI'09 §3.4) as primary, lies in a fraction of its early replies (see
//                     set_early_lies); otherwise follows the protocol
//   reorder-client    as primary, sends every backup the same pre-prepare, but with a pipelining client's
//                     requests out of the order the client issued them: reversed inside a batch, or swapped
//                     across batches (a pre-prepare is held back until a later one carries a later request of
//                     the same client, and the two requests trade places). TOCS §5.1.4: the replicas must still
//                     execute each client's requests in issue order (ClientTable::predecessor_done).
// In PBFT-CS seeds any Byzantine replica may also lie in its early replies whenever it is primary
// (set_early_lies), whatever its strategy: those lies come from a Prng of their own, so the strategy's own
// choices stay as they were.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "common/crypto.h"
#include "common/prng.h"
#include "protocol/effects.h"

namespace bftfs::sim {

enum class Strategy : std::uint8_t {
  kNone = 0,
  kEquivocate,
  kCorruptDigests,
  kWrongReplies,
  kForgeMacs,
  kWithhold,
  kReplay,
  kRandomFrames,
  kLyingViewChange,
  kSilentPrimary,
  kMixed,
  kLyingEarlyReplies,
  kReorderClient,
  kCount,
};
// The strategies before PBFT-CS; a seed that draws a strategy at random draws among these (adding
// kLyingEarlyReplies to the draw would have changed the scenario of every older Byzantine seed).
inline constexpr Strategy kLastClassicStrategy = Strategy::kMixed;
std::string_view to_string(Strategy s);
bool parse_strategy(std::string_view name, Strategy& out);
// Strategies that only bite while the replica is primary: the simulator makes replica 0 (primary of view 0)
// Byzantine for them.
bool wants_primary(Strategy s);

class Byzantine {
 public:
  struct Injection {
    NodeId to = 0;
    Bytes frame;
  };

  // `crypto` is this replica's own crypto context (must outlive the object). `nodes` counts replicas and
  // clients; `log_window` is L, used to make false claims that look plausible.
  Byzantine(Strategy strategy, NodeId self, std::uint32_t n, std::uint32_t nodes, const Crypto& crypto,
            std::uint64_t seed, std::uint64_t log_window);
  Byzantine(const Byzantine&) = delete;
  Byzantine& operator=(const Byzantine&) = delete;

  Strategy strategy() const { return strategy_; }

  // The effects filter: rewrites the core's sends (persist records are left alone: the core's own state stays
  // consistent, only what it tells others is false).
  void filter(Effects& effects);
  // A message this replica received (the replay strategy keeps some).
  void observe(NodeId from, const Message& message);
  // Called every tick with the core's view and stable checkpoint: frames to inject.
  std::vector<Injection> on_tick(std::uint64_t view, std::uint64_t stable_seq);
  // Called on every frame this replica sends, after encoding: may damage it.
  void mangle(Bytes& frame);

  // PBFT-CS lies (NSDI'09 §3.4: "a bad primary may send an incorrect speculative response"):
  //   - each speculative reply this replica sends (it sends them as primary) is corrupted with probability
  //     lie_ppm / 1e6: a wrong but plausible result (another value or token of the counter, or a no-op, inside
  //     the shim's envelope when `shim`; with `fs`, a file-service result that stopped where it did not, names
  //     another object, or read other bytes) with a digest that matches it, sometimes flagged as a tentative
  //     vote instead of a speculative reply;
  //   - a client's request is picked with probability fake_ppm / 1e6 (the same decision for every copy of it,
  //     retransmissions and relays included): the client gets an early reply for a result that was never
  //     executed and, while this replica is primary, the request is never ordered (admit() drops every copy,
  //     so backups must change views to get it ordered).
  void set_early_lies(std::uint32_t lie_ppm, std::uint32_t fake_ppm, bool shim, bool fs = false);
  // Called with every message delivered to this replica, before its core sees it (`view` and `primary`: the
  // core's view and whether it is primary of it). Returns false when the core must not see the message; may
  // add frames to inject.
  bool admit(NodeId from, const Message& message, std::uint64_t view, bool primary, std::vector<Injection>& out);

  std::uint64_t lies() const { return lies_; }
  std::uint64_t early_lies() const { return early_lies_; }
  std::uint64_t fake_early_replies() const { return fake_early_replies_; }

 private:
  Strategy pick();  // the strategy for one message (mixed picks one at random)
  std::vector<NodeId> targets(NodeId to) const;
  void rewrite(const Send& send, std::vector<Send>& out);
  // The rewrites of one strategy each: true when they handled `send` (out holds what goes out instead).
  bool equivocate(const Send& send, std::vector<Send>& out);
  bool corrupt_digests(const Send& send, std::vector<Send>& out);
  bool wrong_reply(const Send& send, std::vector<Send>& out);
  bool withhold(const Send& send, std::vector<Send>& out);
  bool lie_in_view_messages(const Send& send, std::vector<Send>& out);
  Batch mutate_batch(const Batch& batch);
  // reorder-client: the pre-prepares that go out for `send` of `pp` (none while `pp` is parked).
  void reorder(const Send& send, const PrePrepare& pp, std::vector<Send>& out);
  void remember_reordered(const PrePrepare& pp, const Batch& batch);
  Digest random_digest();
  void lie_in_view_change(ViewChange& vc);
  Bytes random_frame(NodeId to);
  void lie_in_early_reply(Reply& reply);
  Bytes plausible_lie(const Bytes& truth);  // a result that differs from `truth` and looks like one
  Bytes plausible_fs_lie(std::span<const std::uint8_t> truth);  // the same for a file-service result
  Bytes fabricated_fs_result();
  Bytes fabricated_result();                // a result for a request that was never executed

  Strategy strategy_;
  NodeId self_;
  std::uint32_t n_;
  std::uint32_t nodes_;
  const Crypto& crypto_;
  Prng prng_;
  std::uint64_t log_window_;
  // withhold: what is dropped
  std::uint32_t withheld_types_ = 0;  // bit (1 << MsgType)
  std::vector<bool> withheld_to_;     // per node
  // replay: what was seen
  std::deque<Send> sent_;
  std::deque<Message> received_;
  std::uint64_t lies_ = 0;
  // reorder-client: the batch sent per (view, seq), so that every copy and retransmission carries the same lie
  // (backups then agree on it and it commits), and a pre-prepare held back until a later one has a later request
  // of one of its clients to swap with.
  std::map<std::pair<std::uint64_t, std::uint64_t>, Batch> reordered_;
  std::optional<PrePrepare> parked_;
  // PBFT-CS lies (set_early_lies): their own Prng, so that enabling them leaves the strategy's choices alone.
  Prng early_prng_;
  std::uint32_t early_lie_ppm_ = 0;
  std::uint32_t fake_ppm_ = 0;
  bool shim_ = false;
  bool fs_ = false;  // the service is the file service: its lies are file-service results
  std::uint64_t fake_salt_ = 0;           // which requests get fake early replies (a hash of the request)
  std::uint64_t last_value_ = 0;          // the highest counter value seen in its own true early replies
  std::uint64_t early_lies_ = 0;
  std::uint64_t fake_early_replies_ = 0;
};

}  // namespace bftfs::sim
