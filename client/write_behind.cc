// Write-behind: staging, coalescing and the lane. See write_behind.h for the rules and why they keep what a
// writer was promised.
#include "client/write_behind.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/assert.h"

namespace bftfs::client {

namespace {

std::uint64_t end_of(const fs::Op& op) { return op.offset + op.data.size(); }

// Whether the ranges of two positional writes overlap or touch (their union is one range), or overlap.
bool joinable(const fs::Op& a, const fs::Op& b) { return a.offset <= end_of(b) && b.offset <= end_of(a); }
bool overlaps(const fs::Op& a, const fs::Op& b) { return a.offset < end_of(b) && b.offset < end_of(a); }

// `into` becomes the union of itself and `later`, whose bytes win where they overlap. Both are positional
// WRITEs and joinable.
void join_positional(fs::Op& into, const fs::Op& later) {
  BFT_ASSERT(!into.append);
  BFT_ASSERT(!later.append);
  BFT_ASSERT(joinable(into, later));
  if (end_of(into) == later.offset) {  // the usual case: the next piece of a sequential writer
    into.data.insert(into.data.end(), later.data.begin(), later.data.end());
    return;
  }
  const std::uint64_t start = std::min(into.offset, later.offset);
  const std::uint64_t end = std::max(end_of(into), end_of(later));
  Bytes joined(end - start);
  std::memcpy(joined.data() + (into.offset - start), into.data.data(), into.data.size());
  std::memcpy(joined.data() + (later.offset - start), later.data.data(), later.data.size());
  into.offset = start;
  into.data = std::move(joined);
}

}  // namespace

WriteBehind::WriteBehind(Options options, NodeTable& table, ClientCounters& counters, SubmitFn submit)
    : options_(options), table_(table), counters_(counters), submit_(std::move(submit)) {
  BFT_ASSERT(options_.requests_max >= 1);
  BFT_ASSERT(options_.ops_max >= 1);
  BFT_ASSERT(submit_ != nullptr);
}

WriteBehind::~WriteBehind() { stop_flusher(); }

std::optional<std::size_t> WriteBehind::join_target(const fs::Request& request, const fs::Op& op) {
  const auto& ops = request.ops;
  if (op.append) {
    if (!ops.empty() && ops.back().append && ops.back().cred == op.cred) return ops.size() - 1;
    return std::nullopt;
  }
  for (std::size_t i = ops.size(); i-- > 0;) {
    const fs::Op& o = ops[i];
    if (o.append) return std::nullopt;  // an append's place depends on what precedes it
    if (o.cred == op.cred && joinable(o, op)) return i;
    if (overlaps(o, op)) return std::nullopt;  // the piece must land after this op
  }
  return std::nullopt;
}

bool WriteBehind::appends_misplaced(const std::vector<Piece>& pieces, const fs::Result& result) {
  // An append landed at (size after its op) - (its op's length) + (its place in the op).
  std::map<std::size_t, std::uint64_t> op_bytes;
  for (const Piece& p : pieces) {
    if (p.append) op_bytes[p.op_index] += p.len;
  }
  for (const Piece& p : pieces) {
    if (!p.append || p.op_index >= result.results.size()) continue;
    const fs::Attr& a = result.results[p.op_index].attr;
    const std::uint64_t bytes = op_bytes[p.op_index];
    if (a.size < bytes || a.size - bytes + p.op_pos != p.kernel_offset) return true;
  }
  return false;
}

bool WriteBehind::fits(const Staged& st, const fs::Op& op) const {
  if (st.bytes + op.data.size() > fs::kIoBytesMax) return false;
  return st.request.ops.size() < options_.ops_max || join_target(st.request, op).has_value();
}

bool WriteBehind::stage(FuseIno id, fs::Op op, std::uint64_t kernel_offset, const std::function<bool()>& interrupted) {
  BFT_ASSERT(op.code == fs::OpCode::kWrite);
  BFT_ASSERT(op.data.size() <= fs::kIoBytesMax);
  BFT_ASSERT(!op.append || op.offset == 0);
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  for (;;) {
    auto it = staged_.find(id);
    if (it == staged_.end() || fits(it->second, op)) break;
    // The file's staged request is full: it goes first, when the lane has room.
    if (room_locked()) {
      submit_locked(it, counters_.stage_sends_full);
      break;
    }
    if (!waited) ++counters_.write_behind_waits;
    waited = true;
    if (interrupted && interrupted()) return false;
    room_cv_.wait(lock);
  }
  add_locked(id, std::move(op), kernel_offset);
  return true;
}

void WriteBehind::add_locked(FuseIno id, fs::Op op, std::uint64_t kernel_offset) {
  Piece piece;
  piece.offset = op.offset;
  piece.len = op.data.size();
  piece.append = op.append;
  piece.kernel_offset = kernel_offset;
  // In the table before it is staged: a kick from now on finds it, and its ticket orders it among waiters.
  piece.ticket = table_.write_submitted(id, op.offset, piece.len, op.append);
  auto it = staged_.find(id);
  if (it == staged_.end()) {
    it = staged_.emplace(id, Staged{}).first;
    it->second.since = std::chrono::steady_clock::now();
    flusher_cv_.notify_all();  // its deadline may come before the flusher's
  } else {
    ++counters_.writes_coalesced;
  }
  Staged& st = it->second;
  BFT_ASSERT(st.bytes + piece.len <= fs::kIoBytesMax);
  st.bytes += piece.len;
  if (const auto target = join_target(st.request, op)) {
    fs::Op& into = st.request.ops[*target];
    piece.op_index = *target;
    piece.op_pos = into.data.size();
    if (op.append) {
      into.data.insert(into.data.end(), op.data.begin(), op.data.end());
    } else {
      join_positional(into, op);
    }
    ++counters_.ops_joined;
  } else {
    BFT_ASSERT(st.request.ops.size() < options_.ops_max);
    piece.op_index = st.request.ops.size();
    st.request.ops.push_back(std::move(op));
  }
  BFT_ASSERT(st.request.ops[piece.op_index].data.size() <= fs::kIoBytesMax);
  st.pieces.push_back(piece);
  if (st.bytes >= fs::kIoBytesMax && room_locked()) submit_locked(it, counters_.stage_sends_full);
}

void WriteBehind::kick(FuseIno id, std::atomic<std::uint64_t>& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = staged_.find(id); it != staged_.end()) submit_locked(it, reason);
}

void WriteBehind::kick_all() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!staged_.empty()) submit_locked(staged_.begin(), counters_.stage_sends_other);
}

void WriteBehind::send_for_memory() {
  std::lock_guard<std::mutex> lock(mu_);
  (void)send_locked(true, counters_.stage_sends_other);
}

bool WriteBehind::any_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !staged_.empty();
}

std::uint64_t WriteBehind::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void WriteBehind::finished() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    BFT_ASSERT(in_flight_ > 0);
    --in_flight_;
  }
  room_cv_.notify_all();
  flusher_cv_.notify_all();
}

void WriteBehind::wake_waiters() {
  { std::lock_guard<std::mutex> lock(mu_); }
  room_cv_.notify_all();
}

void WriteBehind::submit_locked(std::map<FuseIno, Staged>::iterator it, std::atomic<std::uint64_t>& reason) {
  ++reason;
  const FuseIno id = it->first;
  Staged st = std::move(it->second);
  staged_.erase(it);
  BFT_ASSERT(!st.request.ops.empty());
  BFT_ASSERT(!st.pieces.empty());
  ++in_flight_;
  submit_(id, st.request, std::move(st.pieces));
}

std::optional<std::chrono::steady_clock::time_point> WriteBehind::send_locked(bool all,
                                                                             std::atomic<std::uint64_t>& reason) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::chrono::steady_clock::time_point, FuseIno>> by_age;
  by_age.reserve(staged_.size());
  for (const auto& [id, st] : staged_) by_age.emplace_back(st.since, id);
  std::sort(by_age.begin(), by_age.end());
  std::optional<std::chrono::steady_clock::time_point> left;
  for (const auto& [since, id] : by_age) {
    const auto it = staged_.find(id);
    BFT_ASSERT(it != staged_.end());
    const bool due = all || now - since >= options_.stage_delay || it->second.bytes >= fs::kIoBytesMax;
    if (due && room_locked()) {
      submit_locked(it, reason);
    } else if (!left) {
      left = since;
    }
  }
  return left;
}

void WriteBehind::run_flusher() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!flusher_stopping_) {
    if (staged_.empty()) {
      flusher_cv_.wait(lock);
      continue;
    }
    const auto left = send_locked(false, counters_.stage_sends_timer);
    if (!left) continue;
    if (std::chrono::steady_clock::now() - *left >= options_.stage_delay) {
      flusher_cv_.wait_for(lock, options_.stage_delay);  // due but held for the lane: a completion wakes us
    } else {
      flusher_cv_.wait_until(lock, *left + options_.stage_delay);  // young: wait until it is due
    }
  }
}

void WriteBehind::start_flusher() {
  BFT_ASSERT(!flusher_.joinable());
  flusher_ = std::thread([this] { run_flusher(); });
}

void WriteBehind::stop_flusher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flusher_stopping_ = true;
  }
  flusher_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

}  // namespace bftfs::client
