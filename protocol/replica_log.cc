// The replica's log (TOCS §2.5): a ring of L slots indexed by seq % L holding seqs in (h, h+L], each slot the
// ordering state of one seq in one view (digest, body, votes) plus what a view change needs (P and Q, TOCS §4.5).
// See replica_impl.h for the map of the replica's files.
#include <algorithm>

#include "common/assert.h"
#include "protocol/replica_impl.h"

namespace bftfs {

Replica::Impl::Entry& Replica::Impl::get_or_create(std::uint64_t s) {
  BFT_ASSERT(in_window(s));
  Entry& e = ring[s % opt.log_window];
  if (e.seq != s) {
    // A slot's previous occupant is s - L or older, at or below h: garbage collected.
    BFT_ASSERT(e.seq == 0 || e.seq <= h);
    e = Entry{};
    e.seq = s;
    e.view = view;
  }
  return e;
}

// Forgets the ordering state of an older view (TOCS §4.5: a new view starts with fresh pre-prepares, prepares
// and commits), keeping what the view change needs (P, Q) and, for a committed batch, its digest and body.
void Replica::Impl::reset_view_state(Entry& e, std::uint64_t v, bool keep_digest) {
  e.view = v;
  e.votes.clear();
  e.prepare_senders = 0;
  e.commit_senders = 0;
  e.pre_prepared = false;
  e.sent_prepare = false;
  e.prepared = false;
  e.sent_commit = false;
  e.quiet = false;
  e.old_commit_senders = 0;
  e.old_commits.clear();
  e.ordered_tick = kNotTimed;
  if (e.fetching) {
    e.fetching = false;
    fetching_seqs.erase(e.seq);
  }
  if (!keep_digest) {
    BFT_ASSERT(!e.committed);
    if (e.batch) e.alt_batch = std::move(e.batch);
    e.batch.reset();
    e.has_digest = false;
  }
}

Replica::Impl::VoteSet& Replica::Impl::votes_for(Entry& e, const Digest& d) {
  for (VoteSet& vs : e.votes) {
    if (vs.digest == d) return vs;
  }
  e.votes.push_back(VoteSet{d, 0, 0});
  return e.votes.back();
}

const Replica::Impl::VoteSet* Replica::Impl::find_votes(const Entry& e, const Digest& d) const {
  for (const VoteSet& vs : e.votes) {
    if (vs.digest == d) return &vs;
  }
  return nullptr;
}

// Q keeps, per seq, the pre-prepared digests with the highest views (TOCS §4.5: at most two are needed, since a
// correct replica pre-prepares at most one digest per view and only the two most recent matter for A2).
void Replica::Impl::add_q(Entry& e, std::uint64_t v, const Digest& d) {
  for (std::uint8_t i = 0; i < e.q_count; i++) {
    if (e.q[i].digest == d) {
      e.q[i].view = std::max(e.q[i].view, v);
      return;
    }
  }
  const PreparedClaim c{e.seq, d, v};
  if (e.q_count < 2) {
    e.q[e.q_count++] = c;
    return;
  }
  const std::uint8_t lowest = e.q[0].view <= e.q[1].view ? 0 : 1;
  if (e.q[lowest].view < v) e.q[lowest] = c;
}

}  // namespace bftfs
