// The new-view decision procedure of PBFT (TOCS §4.5, the P/Q rule that works without signed prepares), as
// pure functions so that the new primary and every backup compute the same result from the same set S of
// VIEW-CHANGE messages, and so that it can be unit-tested on its own.
//
// Given S (>= 2f+1 valid VIEW-CHANGE messages for one view):
//   Checkpoint: (h*, d*) is the highest seq such that >= 2f+1 messages have stable_seq <= seq and >= f+1
//   messages have (seq, d*) in C.
//   For each seq n in (h*, h*+L]:
//     (A) choose d if some message has (n, d, v) in P and
//         (A1) >= 2f+1 messages m' have stable_seq < n and either no P entry for n, or a P entry (n, d', v')
//              with v' < v or (v' == v and d' == d), and
//         (A2) >= f+1 messages have some (n, d, v'') in Q with v'' >= v;
//     (B) else choose the null request if >= 2f+1 messages have stable_seq < n and no P entry for n;
//     otherwise no decision is possible yet: the new primary waits for more VIEW-CHANGE messages.
//   Null choices by (B) after the last (A) choice are dropped: nothing can have committed there, so the new
//   primary may assign those seqs afresh. (A null request chosen by (A) is kept: it may have committed.)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/types.h"
#include "protocol/messages.h"

namespace bftfs {

struct NewViewChoice {
  std::uint64_t seq = 0;
  Digest digest;               // null_batch_digest() for the null request
  bool from_prepared = false;  // chosen by rule (A); false: the null request by rule (B)
  friend bool operator==(const NewViewChoice&, const NewViewChoice&) = default;
};

struct NewViewDecision {
  std::uint64_t checkpoint_seq = 0;  // h*
  Digest checkpoint_digest;          // d*
  // Consecutive seqs h*+1 .. h*+choices.size(); the last one (if any) is chosen by rule (A).
  std::vector<NewViewChoice> choices;

  // The highest seq that the new view re-proposes, or h* if none.
  std::uint64_t max_seq() const { return checkpoint_seq + choices.size(); }
  // The choice for `seq`, or nullptr if seq is outside (h*, max_seq()].
  const NewViewChoice* choice(std::uint64_t seq) const {
    if (seq <= checkpoint_seq || seq > max_seq()) return nullptr;
    return &choices[seq - checkpoint_seq - 1];
  }
};

// Structural checks of one VIEW-CHANGE (the signature is checked by the caller): new_view > 0, replica < n,
// C sorted by strictly increasing seq, every C seq a multiple of K within [stable_seq, stable_seq + L], and
// stable_seq itself in C; P sorted by strictly increasing seq; P and Q seqs in (stable_seq, stable_seq + L];
// Q sorted by seq with at most two entries per seq and distinct digests per seq; every P and Q view
// < new_view. A correct replica only sends messages that pass.
bool view_change_well_formed(const ViewChange& vc, std::uint32_t n, std::uint64_t checkpoint_interval,
                             std::uint64_t log_window);

// Runs the decision procedure on S. Every message must be well formed (asserted where it matters) and for the
// same view; the caller has checked there are >= 2f+1 of them from distinct replicas. Returns nullopt if the
// rule cannot decide yet. The result does not depend on the order of `vcs`.
std::optional<NewViewDecision> decide_new_view(std::span<const ViewChange* const> vcs, std::uint32_t f,
                                               std::uint64_t log_window);

}  // namespace bftfs
