#include "sim/byzantine.h"

#include <algorithm>
#include <array>
#include <set>

#include "common/assert.h"
#include "protocol/wire.h"
#include "services/counter_service.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"

namespace bftfs::sim {

namespace {

constexpr std::array<std::string_view, static_cast<std::size_t>(Strategy::kCount)> kNames = {
    "none",   "equivocate",    "corrupt-digests",   "wrong-replies",  "forge-macs", "withhold",
    "replay", "random-frames", "lying-view-change", "silent-primary", "mixed",  "lying-early-replies",
    "reorder-client",
};

constexpr std::size_t kReplayKept = 128;
constexpr std::size_t kReorderedKept = 1024;   // reorder-client: batches remembered for retransmissions
constexpr std::uint64_t kParkedSeqsMax = 4;    // reorder-client: a parked pre-prepare goes out this many seqs later
constexpr std::uint64_t kPpm = 1'000'000;

// A counter result (services/counter_service.h: u8 status, u64 value, u64 next token, little-endian).
Bytes counter_bytes(const CounterResult& r) {
  Bytes out(17);
  out[0] = r.status;
  for (std::size_t i = 0; i < 8; ++i) {
    out[1 + i] = static_cast<std::uint8_t>(r.value >> (8 * i));
    out[9 + i] = static_cast<std::uint8_t>(r.next_token >> (8 * i));
  }
  return out;
}

std::uint64_t hash_request(std::uint64_t salt, NodeId client, std::uint64_t request_id) {
  std::uint64_t z = salt ^ (std::uint64_t{client} << 40) ^ request_id;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void put_le(Bytes& b, std::size_t off, std::uint64_t v, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) b[off + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// Recomputes the MAC of a frame (header || body || MAC) for `to` with this node's key: a Byzantine node can
// make any bytes it sends authentic, as long as it sends them as itself.
void reseal(Bytes& frame, NodeId to, const Crypto& crypto) {
  BFT_ASSERT(frame.size() >= kFrameOverheadBytes);
  const std::size_t macced = frame.size() - kMacBytes;
  const Mac mac = crypto.mac(to, std::span<const std::uint8_t>(frame.data(), macced));
  std::copy(mac.bytes.begin(), mac.bytes.end(), frame.begin() + static_cast<std::ptrdiff_t>(macced));
}

}  // namespace

std::string_view to_string(Strategy s) {
  const auto i = static_cast<std::size_t>(s);
  return i < kNames.size() ? kNames[i] : "?";
}

bool parse_strategy(std::string_view name, Strategy& out) {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) {
      out = static_cast<Strategy>(i);
      return true;
    }
  }
  return false;
}

bool wants_primary(Strategy s) {
  return s == Strategy::kEquivocate || s == Strategy::kSilentPrimary || s == Strategy::kLyingEarlyReplies ||
         s == Strategy::kReorderClient;
}

Byzantine::Byzantine(Strategy strategy, NodeId self, std::uint32_t n, std::uint32_t nodes, const Crypto& crypto,
                     std::uint64_t seed, std::uint64_t log_window)
    : strategy_(strategy),
      self_(self),
      n_(n),
      nodes_(nodes),
      crypto_(crypto),
      prng_(seed),
      log_window_(log_window),
      withheld_to_(nodes, false),
      early_prng_(seed ^ 0xEA21E1E5ull) {
  BFT_ASSERT(self < n);
  BFT_ASSERT(n < nodes);
  // What a withholding replica drops: everything, a few message types, or everything to some nodes.
  switch (prng_.below(3)) {
    case 0:
      withheld_types_ = 0xFFFFFFFFu;
      break;
    case 1:
      while (withheld_types_ == 0) {
        for (std::uint32_t t = 1; t <= static_cast<std::uint32_t>(MsgType::kStateLeaf); ++t) {
          if (prng_.chance(1, 3)) withheld_types_ |= 1u << t;
        }
      }
      break;
    default:
      for (NodeId i = 0; i < nodes; ++i) withheld_to_[i] = i != self && prng_.chance(1, 2);
      break;
  }
}

Strategy Byzantine::pick() {
  if (strategy_ != Strategy::kMixed) return strategy_;
  // A mixed liar tells the truth two times in three, so that its lies reach replicas in every protocol phase.
  if (prng_.chance(2, 3)) return Strategy::kNone;
  static constexpr std::array<Strategy, 7> kRewrites = {
      Strategy::kEquivocate, Strategy::kCorruptDigests,   Strategy::kWrongReplies,  Strategy::kWithhold,
      Strategy::kReplay,     Strategy::kLyingViewChange, Strategy::kSilentPrimary,
  };
  return kRewrites[prng_.below(kRewrites.size())];
}

std::vector<NodeId> Byzantine::targets(NodeId to) const {
  std::vector<NodeId> out;
  if (to == kAllReplicas) {
    for (NodeId i = 0; i < n_; ++i) {
      if (i != self_) out.push_back(i);
    }
  } else {
    out.push_back(to);
  }
  return out;
}

Digest Byzantine::random_digest() {
  Digest d;
  for (auto& b : d.bytes) b = static_cast<std::uint8_t>(prng_.next());
  return d;
}

Batch Byzantine::mutate_batch(const Batch& batch) {
  Batch out = batch;
  for (;;) {
    switch (prng_.below(4)) {
      case 0:  // another timestamp: same requests, another digest
        out.timestamp_ns += 1 + prng_.below(1000);
        return out;
      case 1:  // another order
        if (out.requests.size() < 2) continue;
        std::reverse(out.requests.begin(), out.requests.end());
        return out;
      case 2:  // a request left out
        if (out.requests.empty()) continue;
        out.requests.erase(out.requests.begin() + static_cast<std::ptrdiff_t>(prng_.below(out.requests.size())));
        return out;
      default:  // a request twice: correct replicas must still execute it at most once
        if (out.requests.empty() || out.requests.size() >= kBatchRequestsMax) continue;
        out.requests.push_back(out.requests[prng_.below(out.requests.size())]);
        return out;
    }
  }
}

void Byzantine::remember_reordered(const PrePrepare& pp, const Batch& batch) {
  if (reordered_.size() >= kReorderedKept) reordered_.erase(reordered_.begin());
  reordered_.insert_or_assign({pp.view, pp.seq}, batch);
}

void Byzantine::reorder(const Send& send, const PrePrepare& pp, std::vector<Send>& out) {
  const auto emit = [&out](NodeId to, const PrePrepare& base, const Batch& batch) {
    PrePrepare lie = base;
    lie.batch = batch;
    out.push_back(Send{to, std::move(lie)});
  };
  if (auto it = reordered_.find({pp.view, pp.seq}); it != reordered_.end()) {
    emit(send.to, pp, it->second);
    return;
  }
  if (parked_ && parked_->view != pp.view) parked_.reset();  // another view: the parked one is never sent
  if (parked_ && parked_->seq == pp.seq) {
    ++lies_;  // a retransmission of the parked one waits with it
    return;
  }
  if (parked_ && pp.seq > parked_->seq) {
    // Across batches: a later request of a client of the parked (earlier) batch takes the place of that client's
    // request there, which goes into this batch instead.
    Batch early = parked_->batch;
    Batch late = pp.batch;
    bool swapped = false;
    for (Request& a : early.requests) {
      for (Request& b : late.requests) {
        if (!swapped && a.client == b.client && b.request_id > a.request_id) {
          std::swap(a, b);
          swapped = true;
        }
      }
    }
    if (swapped || pp.seq >= parked_->seq + kParkedSeqsMax) {
      remember_reordered(*parked_, early);
      emit(kAllReplicas, *parked_, early);
      parked_.reset();
      if (swapped) {
        ++lies_;
        remember_reordered(pp, late);
        emit(send.to, pp, late);
        return;
      }
    }
  }
  // Inside the batch: some clients' requests in reverse order, in the same slots.
  Batch batch = pp.batch;
  std::map<NodeId, std::vector<std::size_t>> slots;
  for (std::size_t i = 0; i < batch.requests.size(); ++i) slots[batch.requests[i].client].push_back(i);
  bool lied = false;
  for (const auto& [client, pos] : slots) {
    if (pos.size() < 2 || !prng_.chance(1, 2)) continue;
    for (std::size_t lo = 0, hi = pos.size() - 1; lo < hi; ++lo, --hi) {
      std::swap(batch.requests[pos[lo]], batch.requests[pos[hi]]);
    }
    lied = true;
  }
  if (!lied && !parked_ && !batch.requests.empty() && prng_.chance(1, 2)) {
    parked_ = pp;  // sent when a later pre-prepare has something to swap with, or kParkedSeqsMax later
    ++lies_;
    return;
  }
  if (lied) ++lies_;
  remember_reordered(pp, batch);
  emit(send.to, pp, batch);
}

void Byzantine::lie_in_view_change(ViewChange& vc) {
  const std::uint64_t h = vc.stable_seq;
  const std::uint64_t window = std::max<std::uint64_t>(log_window_, 1);
  // Omit some true claims (a liar may hide what it prepared).
  if (!vc.prepared.empty() && prng_.chance(1, 2)) {
    vc.prepared.erase(vc.prepared.begin() + static_cast<std::ptrdiff_t>(prng_.below(vc.prepared.size())));
  }
  // Claim to have prepared random batches at random sequence numbers of the window, one claim per seq.
  std::set<std::uint64_t> claimed;
  for (const auto& p : vc.prepared) claimed.insert(p.seq);
  const std::uint64_t lies = 1 + prng_.below(3);
  for (std::uint64_t i = 0; i < lies; ++i) {
    const std::uint64_t seq = h + 1 + prng_.below(window);
    const std::uint64_t view = vc.new_view == 0 ? 0 : prng_.below(vc.new_view);
    const Digest d = random_digest();
    if (claimed.insert(seq).second && vc.prepared.size() < kViewChangeEntriesMax) {
      vc.prepared.push_back(PreparedClaim{seq, d, view});
    }
    std::size_t q_at_seq = 0;
    for (const auto& q : vc.pre_prepared) q_at_seq += q.seq == seq ? 1 : 0;
    if (q_at_seq < 2 && vc.pre_prepared.size() < kViewChangeEntriesMax) {
      vc.pre_prepared.push_back(PreparedClaim{seq, prng_.chance(1, 2) ? d : random_digest(), view});
    }
  }
  std::sort(vc.prepared.begin(), vc.prepared.end(),
            [](const PreparedClaim& a, const PreparedClaim& b) { return a.seq < b.seq; });
  std::sort(vc.pre_prepared.begin(), vc.pre_prepared.end(),
            [](const PreparedClaim& a, const PreparedClaim& b) { return a.seq < b.seq; });
  // A checkpoint nobody took.
  if (vc.checkpoints.size() < kViewChangeEntriesMax && prng_.chance(1, 2)) {
    vc.checkpoints.push_back(CheckpointClaim{h + 1 + prng_.below(window), random_digest()});
  }
  // Rarely claim to be someone else: the signature cannot verify.
  if (prng_.chance(1, 10)) vc.replica = static_cast<NodeId>((self_ + 1 + prng_.below(n_ - 1)) % n_);
  vc.signature = crypto_.sign(view_change_signing_bytes(vc));
  ++lies_;
}

// Each rewrite below returns whether it handled the send (what goes out for it, possibly nothing, is in `out`);
// a send it leaves alone goes out unchanged.
void Byzantine::rewrite(const Send& send, std::vector<Send>& out) {
  bool handled = false;
  switch (pick()) {
    case Strategy::kEquivocate:
      handled = equivocate(send, out);
      break;
    case Strategy::kCorruptDigests:
      handled = corrupt_digests(send, out);
      break;
    case Strategy::kWrongReplies:
      handled = wrong_reply(send, out);
      break;
    case Strategy::kWithhold:
      handled = withhold(send, out);
      break;
    case Strategy::kLyingViewChange:
      handled = lie_in_view_messages(send, out);
      break;
    case Strategy::kReorderClient:
      if (const auto* pp = std::get_if<PrePrepare>(&send.message)) {
        reorder(send, *pp, out);
        handled = true;
      }
      break;
    case Strategy::kSilentPrimary:
      handled = type_of(send.message) == MsgType::kPrePrepare || type_of(send.message) == MsgType::kNewView;
      if (handled) ++lies_;
      break;
    default:
      break;
  }
  if (!handled) out.push_back(send);
}

// equivocate: half of the receivers (which half changes per message) see another batch.
bool Byzantine::equivocate(const Send& send, std::vector<Send>& out) {
  const auto* pp = std::get_if<PrePrepare>(&send.message);
  if (pp == nullptr) return false;
  const std::uint64_t parity = prng_.below(2);
  const Batch other = mutate_batch(pp->batch);
  for (NodeId t : targets(send.to)) {
    if (t % 2 == parity) {
      PrePrepare lie = *pp;
      lie.batch = other;
      out.push_back(Send{t, lie});
      ++lies_;
    } else {
      out.push_back(Send{t, send.message});
    }
  }
  return true;
}

// corrupt-digests: prepare, commit and checkpoint digests replaced for some receivers.
bool Byzantine::corrupt_digests(const Send& send, std::vector<Send>& out) {
  const MsgType type = type_of(send.message);
  if (type != MsgType::kPrepare && type != MsgType::kCommit && type != MsgType::kCheckpoint) return false;
  for (NodeId t : targets(send.to)) {
    Message m = send.message;
    if (prng_.chance(1, 2)) {
      if (auto* p = std::get_if<Prepare>(&m)) p->digest = random_digest();
      if (auto* c = std::get_if<Commit>(&m)) c->digest = random_digest();
      if (auto* c = std::get_if<Checkpoint>(&m)) c->state_digest = random_digest();
      ++lies_;
    }
    out.push_back(Send{t, std::move(m)});
  }
  return true;
}

// wrong-replies: a result that is wrong but matches its digest, sometimes claimed committed.
bool Byzantine::wrong_reply(const Send& send, std::vector<Send>& out) {
  const auto* r = std::get_if<Reply>(&send.message);
  if (r == nullptr) return false;
  Reply lie = *r;
  if (!lie.result.empty()) {
    lie.result[prng_.below(lie.result.size())] ^= static_cast<std::uint8_t>(1 + prng_.below(255));
    lie.result_digest = digest_of(lie.result);
  } else if ((lie.flags & kReplyHasResult) != 0 || prng_.chance(1, 2)) {
    // A full result where none was asked for: some bytes and their digest.
    lie.result.assign(1 + prng_.below(17), static_cast<std::uint8_t>(prng_.next()));
    lie.result_digest = digest_of(lie.result);
    lie.flags |= kReplyHasResult;
  } else {
    lie.result_digest = random_digest();
  }
  if (prng_.chance(1, 2)) lie.flags &= static_cast<std::uint8_t>(~kReplyTentative);  // "it committed"
  out.push_back(Send{send.to, std::move(lie)});
  ++lies_;
  return true;
}

// withhold: the message types it drops, or the nodes it sends nothing to.
bool Byzantine::withhold(const Send& send, std::vector<Send>& out) {
  if ((withheld_types_ & (1u << static_cast<std::uint32_t>(type_of(send.message)))) != 0) {
    ++lies_;
    return true;
  }
  bool any_withheld = false;
  for (NodeId t : targets(send.to)) any_withheld = any_withheld || (t < nodes_ && withheld_to_[t]);
  if (!any_withheld) return false;
  for (NodeId t : targets(send.to)) {
    if (t < nodes_ && withheld_to_[t]) {
      ++lies_;
    } else {
      out.push_back(Send{t, send.message});
    }
  }
  return true;
}

// lying-view-change: its view changes lie (lie_in_view_change); its new-views drop or alter view changes.
bool Byzantine::lie_in_view_messages(const Send& send, std::vector<Send>& out) {
  if (const auto* vc = std::get_if<ViewChange>(&send.message)) {
    ViewChange lie = *vc;
    lie_in_view_change(lie);
    out.push_back(Send{send.to, std::move(lie)});
    return true;
  }
  const auto* nv = std::get_if<NewView>(&send.message);
  if (nv == nullptr) return false;
  NewView lie = *nv;
  if (!lie.view_changes.empty()) {
    switch (prng_.below(3)) {
      case 0:  // one view change fewer (maybe below 2f+1)
        lie.view_changes.pop_back();
        break;
      case 1:  // its own view change replaced by a lying one, validly signed
        for (auto& vc : lie.view_changes) {
          if (vc.replica == self_) lie_in_view_change(vc);
        }
        break;
      default:  // someone else's view change altered: its signature no longer verifies
        lie.view_changes[prng_.below(lie.view_changes.size())].stable_seq += 1;
        break;
    }
  }
  lie.signature = crypto_.sign(new_view_signing_bytes(lie));
  out.push_back(Send{send.to, std::move(lie)});
  ++lies_;
  return true;
}

void Byzantine::set_early_lies(std::uint32_t lie_ppm, std::uint32_t fake_ppm, bool shim, bool fs) {
  BFT_ASSERT(lie_ppm <= kPpm);
  BFT_ASSERT(fake_ppm <= kPpm);
  BFT_ASSERT(shim || !fs);  // the file service runs behind the shim
  early_lie_ppm_ = lie_ppm;
  fake_ppm_ = fake_ppm;
  shim_ = shim;
  fs_ = fs;
  fake_salt_ = early_prng_.next();
}

Bytes Byzantine::plausible_lie(const Bytes& truth) {
  std::span<const std::uint8_t> inner = truth;
  shim::ShimResult sr;
  if (shim_) {
    if (!shim::decode_envelope_result(truth, sr)) return fabricated_result();
    if (sr.status != shim::ShimStatus::kExecuted) return fabricated_result();  // "it executed"
    inner = sr.inner;
    if (fs_) return plausible_fs_lie(inner);
  }
  CounterResult cr;
  if (!parse_counter_result(inner, cr)) {
    Bytes lie = truth.empty() ? Bytes{0} : truth;
    lie[early_prng_.below(lie.size())] ^= static_cast<std::uint8_t>(1 + early_prng_.below(255));
    return lie;
  }
  switch (early_prng_.below(4)) {
    case 0:  // another token: an increment chained on it would present the wrong one
      cr.next_token ^= 1 + early_prng_.below(1u << 20);
      break;
    case 1:  // a value from the future, with its own token
      cr.value += 1 + early_prng_.below(3);
      cr.next_token = early_prng_.next();
      break;
    case 2:  // "it did not execute": a no-op under the shim, a refused token without it
      if (shim_) return shim::encode_envelope_result(shim::ShimStatus::kRetryPredicateFailed, {});
      cr.status = cr.status == 0 ? 1 : 0;
      break;
    default:  // another value with the right token: still a misprediction, its dependents must not execute
      cr.value = cr.value > 0 ? cr.value - 1 : cr.value + 1;
      break;
  }
  Bytes lie = counter_bytes(cr);
  return shim_ ? shim::encode_envelope_result(shim::ShimStatus::kExecuted, lie) : lie;
}

// A file-service result that differs from `truth` in what a client acts on: the request stopped (an errno at its
// first op), or an object it names is another one, or a READ returned other bytes; `truth` itself with a byte
// changed when it does not decode.
Bytes Byzantine::plausible_fs_lie(std::span<const std::uint8_t> truth) {
  fs::Result r;
  if (fs::decode_result(truth, r) != fs::FsDecodeError::kOk || r.results.empty()) {
    Bytes lie = truth.empty() ? Bytes{0} : Bytes(truth.begin(), truth.end());
    lie[early_prng_.below(lie.size())] ^= static_cast<std::uint8_t>(1 + early_prng_.below(255));
    return shim::encode_envelope_result(shim::ShimStatus::kExecuted, lie);
  }
  fs::OpResult& op = r.results[early_prng_.below(r.results.size())];
  const std::uint64_t how = early_prng_.below(3);
  const bool passed = op.err == fs::err::kOk;
  if (how == 1 && passed && fs::returns_attr(op.code)) {  // "another object"
    op.attr.ino += 1 + early_prng_.below(3);
    op.attr.generation += early_prng_.below(2);
    op.attr.size += early_prng_.below(4096);
  } else if (how == 2 && passed && op.code == fs::OpCode::kRead && !op.data.empty()) {  // "other bytes"
    op.data[early_prng_.below(op.data.size())] ^= static_cast<std::uint8_t>(1 + early_prng_.below(255));
  } else {  // "it stopped at its first op", with another errno than it did
    fs::OpResult stopped;
    stopped.code = r.results.front().code;
    stopped.err = r.results.front().err == fs::err::kNoEnt ? fs::err::kExist : fs::err::kNoEnt;
    r.outcome = fs::Outcome::kOpFailed;
    r.stop = 0;
    r.results = {stopped};
  }
  return shim::encode_envelope_result(shim::ShimStatus::kExecuted, fs::encode_result(r));
}

// A file-service result for a request that was never executed: one op that created or found an object.
Bytes Byzantine::fabricated_fs_result() {
  fs::OpResult op;
  op.code = fs::OpCode::kLookup;
  op.attr.ino = 2 + early_prng_.below(40);
  op.attr.generation = 1;
  op.attr.nlink = 1;
  op.attr.mode = 0644;
  return shim::encode_envelope_result(shim::ShimStatus::kExecuted,
                                      fs::encode_result(fs::Result{fs::Outcome::kDone, 0, {op}}));
}

Bytes Byzantine::fabricated_result() {
  if (fs_) return fabricated_fs_result();
  CounterResult cr;
  cr.value = last_value_ + 1 + early_prng_.below(2);
  cr.next_token = early_prng_.next();
  Bytes r = counter_bytes(cr);
  return shim_ ? shim::encode_envelope_result(shim::ShimStatus::kExecuted, r) : r;
}

void Byzantine::lie_in_early_reply(Reply& reply) {
  if ((reply.flags & kReplyHasResult) != 0) {
    // Learn from the truth first, so that fabricated results look current.
    std::span<const std::uint8_t> inner = reply.result;
    shim::ShimResult sr;
    if (shim_ && shim::decode_envelope_result(reply.result, sr)) inner = sr.inner;
    CounterResult cr;
    if (parse_counter_result(inner, cr) && cr.status == 0) last_value_ = std::max(last_value_, cr.value);
  }
  if (!early_prng_.chance(early_lie_ppm_, kPpm)) return;
  ++early_lies_;
  ++lies_;
  if ((reply.flags & kReplyHasResult) != 0) {
    reply.result = plausible_lie(reply.result);
    reply.result_digest = digest_of(reply.result);
  } else {
    reply.result_digest = random_digest();
  }
  // Sometimes the lie claims to be a vote: one tentative reply must never make a certificate.
  if (early_prng_.chance(1, 10)) {
    reply.flags = static_cast<std::uint8_t>((reply.flags & ~kReplySpeculative) | kReplyTentative);
  }
}

bool Byzantine::admit(NodeId from, const Message& message, std::uint64_t view, bool primary,
                      std::vector<Injection>& out) {
  (void)from;
  if (fake_ppm_ == 0) return true;
  const auto* r = std::get_if<Request>(&message);
  if (r == nullptr || r->read_only() || r->client < n_ || r->client >= nodes_) return true;
  if (hash_request(fake_salt_, r->client, r->request_id) % kPpm >= fake_ppm_) return true;
  Reply fake;
  fake.view = view;
  fake.client = r->client;
  fake.request_id = r->request_id;
  fake.flags = kReplySpeculative | kReplyHasResult;
  fake.result = fabricated_result();
  fake.result_digest = digest_of(fake.result);
  out.push_back(Injection{r->client, encode_frame(fake, self_, r->client, crypto_)});
  ++fake_early_replies_;
  ++lies_;
  return !primary;  // as primary it never orders the request
}

void Byzantine::filter(Effects& effects) {
  if (early_lie_ppm_ > 0) {
    for (Send& s : effects.sends) {
      auto* reply = std::get_if<Reply>(&s.message);
      if (reply != nullptr && (reply->flags & kReplySpeculative) != 0) lie_in_early_reply(*reply);
    }
  }
  std::vector<Send> out;
  out.reserve(effects.sends.size());
  for (const Send& s : effects.sends) rewrite(s, out);
  if (strategy_ == Strategy::kReplay || strategy_ == Strategy::kMixed) {
    for (const Send& s : out) {
      sent_.push_back(s);
      if (sent_.size() > kReplayKept) sent_.pop_front();
    }
  }
  effects.sends = std::move(out);
}

void Byzantine::observe(NodeId from, const Message& message) {
  (void)from;
  if (strategy_ != Strategy::kReplay && strategy_ != Strategy::kMixed) return;
  // Keep a sample, so that very old messages stay available for replay.
  if (!prng_.chance(1, 4)) return;
  received_.push_back(message);
  if (received_.size() > kReplayKept) received_.pop_front();
}

Bytes Byzantine::random_frame(NodeId to) {
  switch (prng_.below(4)) {
    case 0: {  // noise
      Bytes b(prng_.below(200));
      for (auto& x : b) x = static_cast<std::uint8_t>(prng_.next());
      return b;
    }
    case 1: {  // a plausible header over a random body, with a valid MAC: the body decoders run
      const std::size_t body = prng_.below(160);
      Bytes b(kHeaderBytes + body + kMacBytes, 0);
      put_le(b, 0, kWireMagic, 4);
      b[4] = kWireVersion;
      b[5] = static_cast<std::uint8_t>(prng_.below(16));  // includes 0 and 15: unknown types
      put_le(b, 8, self_, 4);
      put_le(b, 12, to, 4);
      put_le(b, 16, prng_.below(4), 8);
      put_le(b, 24, prng_.below(64), 8);
      put_le(b, 32, prng_.chance(1, 8) ? prng_.next() & 0xFFFFFFFFu : body, 4);
      for (std::size_t i = kHeaderBytes; i < kHeaderBytes + body; ++i) b[i] = static_cast<std::uint8_t>(prng_.next());
      if (prng_.chance(1, 2)) {
        for (std::size_t i = 40; i < kHeaderBytes; ++i) b[i] = static_cast<std::uint8_t>(prng_.next());
      }
      reseal(b, to, crypto_);
      return b;
    }
    case 2: {  // a real message with a damaged body and a fresh MAC
      Message m;
      if (!sent_.empty() && prng_.chance(1, 2)) {
        m = sent_[prng_.below(sent_.size())].message;
      } else {
        m = Status{prng_.below(4), false, prng_.below(64), prng_.below(64), prng_.below(64)};
      }
      Bytes b = encode_frame(m, self_, to, crypto_);
      if (b.size() > kFrameOverheadBytes) {
        const std::size_t body = b.size() - kFrameOverheadBytes;
        b[kHeaderBytes + prng_.below(body)] ^= static_cast<std::uint8_t>(1 + prng_.below(255));
      }
      reseal(b, to, crypto_);
      return b;
    }
    default: {  // a real message, truncated or extended
      Bytes b = encode_frame(Checkpoint{prng_.below(64), random_digest()}, self_, to, crypto_);
      if (prng_.chance(1, 2)) {
        b.resize(prng_.below(b.size()));
      } else {
        b.push_back(static_cast<std::uint8_t>(prng_.next()));
      }
      return b;
    }
  }
}

std::vector<Byzantine::Injection> Byzantine::on_tick(std::uint64_t view, std::uint64_t stable_seq) {
  std::vector<Injection> out;
  const bool mixed = strategy_ == Strategy::kMixed;
  if ((strategy_ == Strategy::kRandomFrames && prng_.chance(1, 4)) || (mixed && prng_.chance(1, 40))) {
    const NodeId to = static_cast<NodeId>((self_ + 1 + prng_.below(nodes_ - 1)) % nodes_);
    out.push_back(Injection{to, random_frame(to)});
    ++lies_;
  }
  if ((strategy_ == Strategy::kReplay && prng_.chance(1, 8)) || (mixed && prng_.chance(1, 40))) {
    const bool own = received_.empty() || (!sent_.empty() && prng_.chance(1, 2));
    if (own && !sent_.empty()) {
      const Send& s = sent_[prng_.below(sent_.size())];
      for (NodeId t : targets(s.to)) out.push_back(Injection{t, encode_frame(s.message, self_, t, crypto_)});
      ++lies_;
    } else if (!received_.empty()) {
      // Someone else's message, sent again as this replica's own (a Request from a replica is refused by the
      // wire layer; a forwarded view change carries its signer's valid signature).
      const Message& m = received_[prng_.below(received_.size())];
      const NodeId to = static_cast<NodeId>(prng_.below(n_));
      if (to != self_) out.push_back(Injection{to, encode_frame(m, self_, to, crypto_)});
      ++lies_;
    }
  }
  if ((strategy_ == Strategy::kLyingViewChange && prng_.chance(1, 150)) || (mixed && prng_.chance(1, 300))) {
    // A view change nobody asked for, full of lies: alone it must not move anyone (it takes f+1).
    ViewChange vc;
    vc.new_view = view + 1 + prng_.below(2);
    vc.replica = self_;
    vc.stable_seq = stable_seq;
    lie_in_view_change(vc);
    for (NodeId t : targets(kAllReplicas)) out.push_back(Injection{t, encode_frame(vc, self_, t, crypto_)});
  }
  return out;
}

void Byzantine::mangle(Bytes& frame) {
  const std::uint64_t odds = strategy_ == Strategy::kForgeMacs ? 2 : (strategy_ == Strategy::kMixed ? 30 : 0);
  if (odds == 0 || frame.empty() || !prng_.chance(1, odds)) return;
  ++lies_;
  if (frame.size() >= kHeaderBytes && prng_.chance(1, 2)) {
    // Pretend to be another replica: without that replica's session key the MAC cannot verify.
    const NodeId other = static_cast<NodeId>((self_ + 1 + prng_.below(n_ - 1)) % n_);
    put_le(frame, 8, other, 4);
    return;
  }
  frame[prng_.below(frame.size())] ^= static_cast<std::uint8_t>(1 + prng_.below(255));
}

}  // namespace bftfs::sim
