// Write-behind (docs/CLIENT.md "Writes: write-behind"): write() is answered at once (handlers_data.cc) and its
// data is staged here per file. The staged pieces go out as one request when they reach kIoBytesMax or
// kCoalesceOpsMax ops, when anything needs them at the service (flush at close, fsync, release, a read or
// getattr of the file, a truncate, any other mutation of this client, the write-behind memory bound,
// unmount), and at the latest kStageDelay after the first piece was staged (so a file that stays open reaches
// the service anyway, as NFS's periodic write-back does). A writer of many small pieces (as, ar, ld write an
// object file in dozens of small writes) then costs one ordered request per file instead of one per write().
// Contiguous pieces merge into one WRITE op; others become further ops of the same compound request, which
// the service executes in order, all or nothing (docs/FILESERVICE.md §1): the same effect as sending them one
// by one in that order. Every piece counts among the node table's writes in flight (write_submitted) from its
// write() until its request is final, so waiters (flush, fsync, read, getattr) kick the staged pieces out
// first and then wait for them as for any write in flight.
#include "client/fuse_client_impl.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>
#include <utility>

#include "common/assert.h"

namespace bftfs::client {

void FuseClient::Impl::queue_write(FuseIno id, fs::Op op, std::uint64_t kernel_offset) {
  WritePiece piece{op.offset, op.data.size(), op.append, kernel_offset, 0};
  std::lock_guard<std::mutex> lock(wq_mu);
  auto it = staged_writes.find(id);
  if (it != staged_writes.end() && (it->second.bytes + op.data.size() > fs::kIoBytesMax ||
                                    it->second.request.ops.size() >= kCoalesceOpsMax)) {
    submit_staged_locked(it, stats.stage_sends_full);
    it = staged_writes.end();
  }
  if (it == staged_writes.end()) {
    it = staged_writes.emplace(id, StagedRequest{}).first;
    it->second.since = std::chrono::steady_clock::now();
    if (staged_writes.size() == 1) wq_cv.notify_all();
  } else {
    ++stats.writes_coalesced;
  }
  StagedRequest& st = it->second;
  st.bytes += op.data.size();
  fs::Op* last = st.request.ops.empty() ? nullptr : &st.request.ops.back();
  if (last != nullptr && !op.append && !last->append && last->offset + last->data.size() == op.offset &&
      last->cred == op.cred) {
    last->data.insert(last->data.end(), op.data.begin(), op.data.end());  // contiguous: one op
  } else {
    st.request.ops.push_back(std::move(op));
  }
  piece.op_index = st.request.ops.size() - 1;
  st.pieces.push_back(piece);
  if (st.bytes >= fs::kIoBytesMax) submit_staged_locked(it, stats.stage_sends_full);
}

// Submits node `id`'s staged writes now, if any.
void FuseClient::Impl::kick_writes(FuseIno id, std::atomic<std::uint64_t>& reason) {
  std::lock_guard<std::mutex> lock(wq_mu);
  if (auto it = staged_writes.find(id); it != staged_writes.end()) submit_staged_locked(it, reason);
}

// Kicks the staged writes of every object a request names by handle.
void FuseClient::Impl::kick_writes_of(const fs::Request& r) {
  {
    std::lock_guard<std::mutex> lock(wq_mu);
    if (staged_writes.empty()) return;
  }
  for (const fs::Op& op : r.ops) {
    for (const fs::Handle* h : {&op.handle, &op.handle2}) {
      if (h->is_ref || h->ino == 0) continue;
      if (const auto id = table.find(*h)) kick_writes(*id, stats.stage_sends_mutation);
    }
  }
}

void FuseClient::Impl::kick_all_writes() {
  std::lock_guard<std::mutex> lock(wq_mu);
  while (!staged_writes.empty()) submit_staged_locked(staged_writes.begin(), stats.stage_sends_other);
}

// Submits and forgets one staged request. With wq_mu held, so that requests leave in staging order
// (submit only queues; callbacks run on the backend's thread and never take wq_mu).
void FuseClient::Impl::submit_staged_locked(std::map<FuseIno, StagedRequest>::iterator it,
                                            std::atomic<std::uint64_t>& reason) {
  ++reason;
  const FuseIno id = it->first;
  StagedRequest r = std::move(it->second);
  staged_writes.erase(it);
  BFT_ASSERT(!r.request.ops.empty());
  const std::uint64_t seq = next_seq.fetch_add(1);
  note_ordered_submit(seq);
  Callbacks cb;
  cb.on_final = [this, id, pieces = std::move(r.pieces), seq](Final f) {
    CallResult out = interpret(std::move(f), CallResult{});
    std::optional<fs::Attr> attr;
    if (out.err == 0 && !out.result.results.empty()) attr = out.result.results.back().attr;
    // An append lands at (size after it) - len; elsewhere than the kernel's offset (another client appended
    // meanwhile), this mount's cached pages are wrong: dropped now (asynchronously) and, for certain, at the
    // next open. Every append is an op of its own (never merged), with its own result.
    bool misplaced = false;
    for (const WritePiece& p : pieces) {
      if (!p.append || out.err != 0 || p.op_index >= out.result.results.size()) continue;
      const fs::Attr& a = out.result.results[p.op_index].attr;
      misplaced = misplaced || a.size < p.len || a.size - p.len != p.kernel_offset;
    }
    if (misplaced) {
      table.drop_data_version(id);
      request_inval(id);
    }
    for (const WritePiece& p : pieces) {
      table.write_finished(id, p.offset, p.len, static_cast<std::uint32_t>(out.err), attr, seq);
    }
  };
  ++stats.requests_ordered;
  (void)backend->submit(r.request, SubmitOptions{}, std::move(cb));
}

// The stage flusher's loop: sends staged writes older than kStageDelay.
void FuseClient::Impl::flush_stale_stages() {
  std::unique_lock<std::mutex> lock(wq_mu);
  while (!wq_stopping) {
    if (staged_writes.empty()) {
      wq_cv.wait(lock);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    auto oldest = now;
    for (auto it = staged_writes.begin(); it != staged_writes.end();) {
      auto next = std::next(it);
      if (now - it->second.since >= kStageDelay) {
        submit_staged_locked(it, stats.stage_sends_timer);
      } else {
        oldest = std::min(oldest, it->second.since);
      }
      it = next;
    }
    if (!staged_writes.empty()) wq_cv.wait_until(lock, oldest + kStageDelay);
  }
}

void FuseClient::Impl::start_stage_flusher() { stage_flusher = std::thread([this] { flush_stale_stages(); }); }

void FuseClient::Impl::stop_stage_flusher() {
  {
    std::lock_guard<std::mutex> lock(wq_mu);
    wq_stopping = true;
  }
  wq_cv.notify_all();
  if (stage_flusher.joinable()) stage_flusher.join();
}

}  // namespace bftfs::client
