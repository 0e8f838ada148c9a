// The new-view decision procedure (TOCS §4.5); see new_view_decision.h.
#include "protocol/new_view_decision.h"

#include <algorithm>
#include <map>

#include "common/assert.h"

namespace bftfs {

bool view_change_well_formed(const ViewChange& vc, std::uint32_t n, std::uint64_t checkpoint_interval,
                             std::uint64_t log_window) {
  if (vc.new_view == 0) return false;
  if (vc.replica >= n) return false;
  if (vc.checkpoints.empty()) return false;
  if (vc.checkpoints.size() > kViewChangeEntriesMax) return false;
  if (vc.prepared.size() > kViewChangeEntriesMax) return false;
  if (vc.pre_prepared.size() > kViewChangeEntriesMax) return false;
  const std::uint64_t lo = vc.stable_seq;
  if (lo > UINT64_MAX - log_window) return false;
  const std::uint64_t hi = lo + log_window;
  bool has_stable = false;
  for (std::size_t i = 0; i < vc.checkpoints.size(); i++) {
    const CheckpointClaim& c = vc.checkpoints[i];
    if (i > 0 && c.seq <= vc.checkpoints[i - 1].seq) return false;
    if (c.seq % checkpoint_interval != 0) return false;
    if (c.seq < lo || c.seq > hi) return false;
    if (c.seq == lo) has_stable = true;
  }
  if (!has_stable) return false;
  for (std::size_t i = 0; i < vc.prepared.size(); i++) {
    const PreparedClaim& p = vc.prepared[i];
    if (i > 0 && p.seq <= vc.prepared[i - 1].seq) return false;
    if (p.seq <= lo || p.seq > hi) return false;
    if (p.view >= vc.new_view) return false;
  }
  for (std::size_t i = 0; i < vc.pre_prepared.size(); i++) {
    const PreparedClaim& q = vc.pre_prepared[i];
    if (q.seq <= lo || q.seq > hi) return false;
    if (q.view >= vc.new_view) return false;
    if (i > 0) {
      const PreparedClaim& prev = vc.pre_prepared[i - 1];
      if (q.seq < prev.seq) return false;
      if (q.seq == prev.seq) {
        if (q.digest == prev.digest) return false;
        if (i > 1 && vc.pre_prepared[i - 2].seq == q.seq) return false;  // at most two per seq
      }
    }
  }
  return true;
}

namespace {

// Per-message lookup tables over the window (h*, h*+L], built once so the rule is O(|S|^2 * L).
struct Indexed {
  const ViewChange* vc = nullptr;
  std::vector<const PreparedClaim*> p;              // [n - h* - 1] -> P entry or nullptr
  std::vector<std::vector<const PreparedClaim*>> q;  // [n - h* - 1] -> Q entries
};

// The checkpoint (h*, d*): the highest seq with 2f+1 messages whose stable_seq <= seq and f+1 matching C
// entries. Writes it into `decision`; false if no seq qualifies.
bool choose_checkpoint(std::span<const ViewChange* const> vcs, std::size_t quorum, std::size_t weak,
                       NewViewDecision& decision) {
  std::map<std::pair<std::uint64_t, Digest>, std::size_t> claims;
  for (const ViewChange* vc : vcs) {
    BFT_ASSERT(vc != nullptr);
    for (const CheckpointClaim& c : vc->checkpoints) claims[{c.seq, c.digest}]++;
  }
  bool found = false;
  // Iterate from the highest (seq, digest); the first digest in map order wins a tie at one seq, which only a
  // Byzantine majority could produce, and keeps the result independent of the order of `vcs`.
  for (auto it = claims.rbegin(); it != claims.rend(); ++it) {
    const auto& [key, count] = *it;
    if (count < weak) continue;
    std::size_t low_enough = 0;
    for (const ViewChange* vc : vcs) {
      if (vc->stable_seq <= key.first) low_enough++;
    }
    if (low_enough < quorum) continue;
    if (found && key.first == decision.checkpoint_seq) {
      if (key.second < decision.checkpoint_digest) decision.checkpoint_digest = key.second;
      continue;
    }
    if (found) break;
    found = true;
    decision.checkpoint_seq = key.first;
    decision.checkpoint_digest = key.second;
  }
  return found;
}

// The P and Q entries of every message in (h, h + log_window], indexed by seq - h - 1.
std::vector<Indexed> index_claims(std::span<const ViewChange* const> vcs, std::uint64_t h, std::uint64_t log_window) {
  std::vector<Indexed> index(vcs.size());
  for (std::size_t i = 0; i < vcs.size(); i++) {
    Indexed& ix = index[i];
    ix.vc = vcs[i];
    ix.p.assign(log_window, nullptr);
    ix.q.resize(log_window);
    for (const PreparedClaim& p : vcs[i]->prepared) {
      if (p.seq <= h || p.seq - h > log_window) continue;
      ix.p[p.seq - h - 1] = &p;
    }
    for (const PreparedClaim& q : vcs[i]->pre_prepared) {
      if (q.seq <= h || q.seq - h > log_window) continue;
      ix.q[q.seq - h - 1].push_back(&q);
    }
  }
  return index;
}

// Rule (A) at seq n (index k): of the P entries for n that satisfy A1 and A2, the one with the highest view
// (then the smallest digest), so that the result does not depend on the order of S; nullptr if none does.
const PreparedClaim* choose_prepared(const std::vector<Indexed>& index, std::uint64_t k, std::uint64_t n,
                                     std::size_t quorum, std::size_t weak) {
  const PreparedClaim* best = nullptr;
  for (const Indexed& m : index) {
    const PreparedClaim* cand = m.p[k];
    if (cand == nullptr) continue;
    if (best != nullptr &&
        (cand->view < best->view || (cand->view == best->view && !(cand->digest < best->digest)))) {
      continue;
    }
    std::size_t a1 = 0;
    std::size_t a2 = 0;
    for (const Indexed& other : index) {
      if (other.vc->stable_seq < n) {
        const PreparedClaim* op = other.p[k];
        if (op == nullptr || op->view < cand->view || (op->view == cand->view && op->digest == cand->digest)) {
          a1++;
        }
      }
      for (const PreparedClaim* q : other.q[k]) {
        if (q->digest == cand->digest && q->view >= cand->view) {
          a2++;
          break;
        }
      }
    }
    if (a1 >= quorum && a2 >= weak) best = cand;
  }
  return best;
}

// Rule (B) at seq n (index k): the messages that say nothing prepared at n (stable_seq < n and no P entry).
std::size_t count_nothing_prepared(const std::vector<Indexed>& index, std::uint64_t k, std::uint64_t n) {
  std::size_t b = 0;
  for (const Indexed& m : index) {
    if (m.vc->stable_seq < n && m.p[k] == nullptr) b++;
  }
  return b;
}

}  // namespace

std::optional<NewViewDecision> decide_new_view(std::span<const ViewChange* const> vcs, std::uint32_t f,
                                               std::uint64_t log_window) {
  const std::size_t quorum = 2 * static_cast<std::size_t>(f) + 1;
  const std::size_t weak = static_cast<std::size_t>(f) + 1;
  if (vcs.size() < quorum) return std::nullopt;
  NewViewDecision decision;
  if (!choose_checkpoint(vcs, quorum, weak, decision)) return std::nullopt;
  const std::uint64_t h = decision.checkpoint_seq;
  const std::vector<Indexed> index = index_claims(vcs, h, log_window);

  std::vector<NewViewChoice> choices;
  std::size_t last_prepared_choice = 0;  // choices.size() just after the last (A) choice
  for (std::uint64_t k = 0; k < log_window; k++) {
    const std::uint64_t n = h + 1 + k;
    if (const PreparedClaim* best = choose_prepared(index, k, n, quorum, weak)) {
      choices.push_back(NewViewChoice{n, best->digest, true});
      last_prepared_choice = choices.size();
      continue;
    }
    // (B): the null request if 2f+1 messages say nothing prepared at n.
    if (count_nothing_prepared(index, k, n) >= quorum) {
      choices.push_back(NewViewChoice{n, null_batch_digest(), false});
      continue;
    }
    return std::nullopt;
  }
  choices.resize(last_prepared_choice);
  decision.choices = std::move(choices);
  return decision;
}

}  // namespace bftfs
