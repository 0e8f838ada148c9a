// FsOracle: see fs_oracle.h. The head shadow checks agreed results and checkpoints as the history arrives; the
// read shadow trails it through a backlog of executions and checks read-only results on the states it leaves.
#include "sim/fs_oracle.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "common/assert.h"
#include "common/crypto.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"
#include "sim/strfmt.h"

namespace bftfs::sim {

namespace {

constexpr std::uint64_t kForever = std::numeric_limits<std::uint64_t>::max();

// One replica's stack without the engine: the shim over the file service, in memory.
struct Shadow {
  explicit Shadow(const FsOracleOptions& o)
      : fs(static_cast<SnapshotStore*>(nullptr), o.fs), shim(fs, nullptr, o.shim) {}
  fs::FsService fs;
  shim::Shim shim;
  std::uint64_t last_seq = 0;  // seq of the last execution applied (0: none)
};

struct Execution {
  ExecContext ctx;
  Bytes op;
  Digest result_digest;  // the head shadow's
};

// What the read gave on the read shadow's state for the seqs from..through (nullopt: not answerable read-only).
struct Seen {
  std::uint64_t from = 0;
  std::uint64_t through = 0;
  std::optional<Digest> digest;
};

struct Read {
  NodeId client = 0;
  Bytes op;
  std::uint64_t lo = 0;
  bool lo_lost = false;  // the read shadow had left lo behind when the read began
  bool ended = false;
  Digest result;         // ended: the digest the client accepted
  std::uint64_t hi = 0;  // ended
  std::vector<Seen> seen;
};

std::string short_hex(const std::optional<Digest>& d) { return d.has_value() ? d->short_hex() : "none"; }

// A one-line summary of a shim result envelope holding a file-service result, for violation messages.
std::string describe_result(std::span<const std::uint8_t> bytes) {
  shim::ShimResult sr;
  if (!shim::decode_envelope_result(bytes, sr)) return "not a shim result";
  if (sr.status != shim::ShimStatus::kExecuted) return std::string(shim::to_string(sr.status));
  fs::Result r;
  if (fs::decode_result(sr.inner, r) != fs::FsDecodeError::kOk) return "executed, fs result does not decode";
  std::string s = fmt("executed, outcome %u stop %u, op/errno", static_cast<unsigned>(r.outcome),
                      static_cast<unsigned>(r.stop));
  for (const fs::OpResult& o : r.results) s += fmt(" %u/%u", static_cast<unsigned>(o.code), o.err);
  return s;
}

}  // namespace

struct FsOracle::Impl {
  explicit Impl(FsOracleOptions o) : options(std::move(o)), head(options), reader(options) {
    checkpoints.emplace(0, head.shim.recovered_checkpoint().digest);
    next_checkpoint = options.checkpoint_interval;
  }

  void fail(std::string what) {
    if (violation.empty()) violation = std::move(what);
  }

  void execute(const ExecContext& ctx, std::span<const std::uint8_t> op, const Digest& result_digest);
  void advance();
  void take_checkpoints();
  void compare_checkpoint(std::uint64_t seq, const Digest& replica, const Digest& shadow);
  void advance_reader(std::uint64_t target);
  void apply_to_reader(const Execution& e);
  void leave_segment(std::uint64_t from, std::uint64_t through);
  std::optional<Digest> read_on_reader(const Read& r);
  void decide_unmatched(ReadId id, const Read& r);

  FsOracleOptions options;
  Shadow head;    // checks results and checkpoints as the history arrives
  Shadow reader;  // trails by options.read_lag_seqs; checks read-only results
  std::uint64_t complete = 0;  // complete_through()
  std::uint64_t next_checkpoint = 0;  // the next multiple of the interval to take (0: none)
  std::map<std::uint64_t, Digest> checkpoints;  // the head shadow's, by seq
  std::multimap<std::uint64_t, Digest> expected;  // replica digests at seqs the head has not passed yet
  std::deque<Execution> backlog;  // executions the read shadow has not applied, in order
  std::map<ReadId, Read> reads;   // begun and not decided
  ReadId next_read = 1;
  bool finished = false;
  std::string violation;
  FsOracleStats stats;
};

void FsOracle::Impl::execute(const ExecContext& ctx, std::span<const std::uint8_t> op, const Digest& result_digest) {
  BFT_ASSERT(!finished);
  BFT_ASSERT(ctx.seq > complete);
  BFT_ASSERT(ctx.seq >= head.last_seq);
  // An execution at a new seq closes every batch before it.
  if (ctx.seq - 1 > complete) {
    complete = ctx.seq - 1;
    advance();
  }
  const Bytes result = head.shim.execute(ctx, op);
  head.last_seq = ctx.seq;
  stats.executions++;
  const Digest mine = digest_of(result);
  if (mine != result_digest) {
    fail(fmt("agreed result: seq %llu client %u request %llu: the replicas' result digest %s, the serial "
             "execution's %s (%s)",
             ull(ctx.seq), ctx.client, ull(ctx.request_id), result_digest.short_hex().c_str(),
             mine.short_hex().c_str(), describe_result(result).c_str()));
  }
  backlog.push_back(Execution{ctx, Bytes(op.begin(), op.end()), mine});
}

// `complete` grew: the head commits and checkpoints what is now closed; the read shadow follows at its lag.
void FsOracle::Impl::advance() {
  head.shim.commit_through(complete);
  take_checkpoints();
  if (complete >= options.read_lag_seqs) advance_reader(complete - options.read_lag_seqs);
}

// Every multiple of the interval up to `complete`. The head has executed nothing past it: an execution at a
// seq above the last checkpoint's closed everything below its own seq before it ran (execute()).
void FsOracle::Impl::take_checkpoints() {
  const std::uint64_t k = options.checkpoint_interval;
  while (k != 0 && next_checkpoint <= complete) {
    const std::uint64_t seq = next_checkpoint;
    BFT_ASSERT(head.last_seq <= seq);
    const CheckpointId id = head.shim.checkpoint(seq);
    BFT_ASSERT(id.seq == seq);
    BFT_ASSERT(!id.digest.is_zero());  // memory is never damaged
    head.shim.discard_checkpoints_below(seq);
    checkpoints.emplace(seq, id.digest);
    stats.checkpoints++;
    const auto [first, last] = expected.equal_range(seq);
    for (auto it = first; it != last; ++it) compare_checkpoint(seq, it->second, id.digest);
    expected.erase(first, last);
    next_checkpoint += k;
  }
}

void FsOracle::Impl::compare_checkpoint(std::uint64_t seq, const Digest& replica, const Digest& shadow) {
  stats.checkpoints_compared++;
  if (replica == shadow) return;
  fail(fmt("checkpoint at seq %llu: a correct replica's service digest %s, the serial execution's %s", ull(seq),
           replica.short_hex().c_str(), shadow.short_hex().c_str()));
}

// Applies every closed batch at or below `target`, leaving the segment of states before each.
void FsOracle::Impl::advance_reader(std::uint64_t target) {
  while (!backlog.empty() && backlog.front().ctx.seq <= target) {
    const std::uint64_t seq = backlog.front().ctx.seq;
    BFT_ASSERT(seq <= complete);  // the batch is closed
    BFT_ASSERT(seq > reader.last_seq);
    leave_segment(reader.last_seq, seq - 1);
    while (!backlog.empty() && backlog.front().ctx.seq == seq) {
      apply_to_reader(backlog.front());
      backlog.pop_front();
    }
    reader.shim.commit_through(seq);
    reader.last_seq = seq;
  }
}

void FsOracle::Impl::apply_to_reader(const Execution& e) {
  const Bytes result = reader.shim.execute(e.ctx, e.op);
  const Digest mine = digest_of(result);
  if (mine == e.result_digest) return;
  fail(fmt("determinism: seq %llu client %u request %llu gave %s on one shadow and %s on the other (%s)",
           ull(e.ctx.seq), e.ctx.client, ull(e.ctx.request_id), e.result_digest.short_hex().c_str(),
           mine.short_hex().c_str(), describe_result(result).c_str()));
}

// The read shadow's state is the state after every seq in [from, through] and is about to change: every read
// whose window meets that segment runs on it. An ended read passes on a match, and is decided without one once
// its window ends inside the segment.
void FsOracle::Impl::leave_segment(std::uint64_t from, std::uint64_t through) {
  for (auto it = reads.begin(); it != reads.end();) {
    Read& r = it->second;
    const std::uint64_t top = r.ended ? r.hi : kForever;
    if (through < r.lo || from > top) {
      ++it;
      continue;
    }
    const std::optional<Digest> d = read_on_reader(r);
    r.seen.push_back(Seen{from, through, d});
    if (r.ended && d == r.result) {
      stats.reads_passed++;
      it = reads.erase(it);
    } else if (r.ended && top <= through) {
      decide_unmatched(it->first, r);
      it = reads.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<Digest> FsOracle::Impl::read_on_reader(const Read& r) {
  stats.read_executions++;
  Bytes out;
  if (!reader.shim.execute_read_only(r.client, r.op, out)) return std::nullopt;
  return digest_of(out);
}

// Every state in the read's window was tried (as far as the read shadow still had them) and none matched.
void FsOracle::Impl::decide_unmatched(ReadId id, const Read& r) {
  if (r.lo_lost) {
    stats.reads_unverifiable++;
    return;
  }
  std::string states;
  for (const Seen& s : r.seen) {
    if (s.through < r.lo || s.from > r.hi) continue;
    states += fmt(" [%llu..%llu]=%s", ull(s.from), ull(std::min(s.through, r.hi)), short_hex(s.digest).c_str());
  }
  fail(fmt("read-only result: client %u read %llu in window [%llu, %llu] accepted %s, which no serial state in "
           "the window gives:%s",
           r.client, ull(id), ull(r.lo), ull(r.hi), r.result.short_hex().c_str(), states.c_str()));
}

// ---------------------------------------------------------------------------------------------------------------
// FsOracle
// ---------------------------------------------------------------------------------------------------------------

FsOracle::FsOracle(FsOracleOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
FsOracle::~FsOracle() = default;

void FsOracle::on_execution(const ExecContext& ctx, std::span<const std::uint8_t> op, const Digest& result_digest) {
  impl_->execute(ctx, op, result_digest);
}

void FsOracle::on_complete_through(std::uint64_t seq) {
  BFT_ASSERT(!impl_->finished);
  if (seq <= impl_->complete) return;
  impl_->complete = seq;
  impl_->advance();
}

std::uint64_t FsOracle::complete_through() const { return impl_->complete; }
std::uint64_t FsOracle::read_shadow_seq() const { return impl_->reader.last_seq; }

FsOracle::ReadId FsOracle::begin_read(NodeId client, std::span<const std::uint8_t> op, std::uint64_t lo) {
  Impl& m = *impl_;
  BFT_ASSERT(!m.finished);
  const ReadId id = m.next_read++;
  Read r;
  r.client = client;
  r.op.assign(op.begin(), op.end());
  r.lo = lo;
  r.lo_lost = lo < m.reader.last_seq;
  m.reads.emplace(id, std::move(r));
  m.stats.reads_begun++;
  return id;
}

void FsOracle::end_read(ReadId id, const Digest& result_digest, std::uint64_t hi) {
  Impl& m = *impl_;
  BFT_ASSERT(!m.finished);
  const auto it = m.reads.find(id);
  BFT_ASSERT(it != m.reads.end());
  Read& r = it->second;
  BFT_ASSERT(!r.ended);
  r.ended = true;
  r.result = result_digest;
  r.hi = hi;
  if (hi < r.lo) {
    m.fail(fmt("read-only result: client %u read %llu has an empty window [%llu, %llu]: it was accepted before any "
               "replica executed the state it must reflect",
               r.client, ull(id), ull(r.lo), ull(hi)));
    m.reads.erase(it);
    return;
  }
  for (const Seen& s : r.seen) {
    if (s.through >= r.lo && s.from <= hi && s.digest == result_digest) {
      m.stats.reads_passed++;
      m.reads.erase(it);
      return;
    }
  }
  // The read shadow has left every state up to last_seq - 1: if the window ends there, nothing is left to try.
  if (hi < m.reader.last_seq) {
    m.decide_unmatched(id, r);
    m.reads.erase(it);
  }
}

void FsOracle::forget_read(ReadId id) {
  Impl& m = *impl_;
  BFT_ASSERT(!m.finished);
  const auto it = m.reads.find(id);
  BFT_ASSERT(it != m.reads.end());
  BFT_ASSERT(!it->second.ended);
  m.reads.erase(it);
  m.stats.reads_forgotten++;
}

std::optional<Digest> FsOracle::checkpoint_digest(std::uint64_t seq) const {
  const auto it = impl_->checkpoints.find(seq);
  if (it == impl_->checkpoints.end()) return std::nullopt;
  return it->second;
}

void FsOracle::on_replica_checkpoint(std::uint64_t seq, const Digest& digest) {
  Impl& m = *impl_;
  const std::uint64_t k = m.options.checkpoint_interval;
  BFT_ASSERT(seq == 0 || (k != 0 && seq % k == 0));
  if (m.finished && seq > m.complete) {  // the last state stands for every later seq
    m.complete = seq;
    m.take_checkpoints();
  }
  const auto it = m.checkpoints.find(seq);
  if (it != m.checkpoints.end()) {
    m.compare_checkpoint(seq, digest, it->second);
  } else {
    BFT_ASSERT(!m.finished);
    m.expected.emplace(seq, digest);
  }
}

void FsOracle::finish() {
  Impl& m = *impl_;
  BFT_ASSERT(!m.finished);
  // The complete history: its last state stands for every later seq, up to the last replica checkpoint.
  std::uint64_t last = std::max(m.complete, m.head.last_seq);
  if (!m.expected.empty()) last = std::max(last, m.expected.rbegin()->first);
  if (last > m.complete) {
    m.complete = last;
    m.advance();
  }
  BFT_ASSERT(m.expected.empty());
  m.advance_reader(kForever);
  m.leave_segment(m.reader.last_seq, kForever);  // the last state stands for every seq after it
  for (const auto& [id, r] : m.reads) {
    BFT_ASSERT(!r.ended);  // an ended read's window meets the last segment if no earlier one decided it
    m.stats.reads_forgotten++;
  }
  m.reads.clear();
  m.finished = true;
}

std::string FsOracle::check_invariants() const {
  std::string why = impl_->head.fs.check_invariants();
  if (!why.empty()) return "head shadow: " + why;
  why = impl_->reader.fs.check_invariants();
  if (!why.empty()) return "read shadow: " + why;
  return "";
}

bool FsOracle::failed() const { return !impl_->violation.empty(); }
const std::string& FsOracle::violation() const { return impl_->violation; }
const FsOracleStats& FsOracle::stats() const { return impl_->stats; }

}  // namespace bftfs::sim
