// The daemon's write-behind glue (the staging, coalescing and lane are client/write_behind.h): a write()'s piece
// staged with its handler's interrupt, the kicks that send a file's staged writes when something needs them at
// the service, and a staged request's trip to the backend and back: its final result reported to the node
// table (each piece's write), to the kernel's cache (a misplaced append) and to the lane.
#include "client/fuse_client_impl.h"

#include <optional>
#include <utility>

#include "common/assert.h"

namespace bftfs::client {

bool FuseClient::Impl::queue_write(FuseIno id, fs::Op op, std::uint64_t kernel_offset, InterruptScope& scope) {
  // The interrupt locks this mutex and notifies the condition variable, so a wait for room ends with it. Set
  // before the stage takes the mutex: the interrupt takes the scope's lock, then this one.
  scope.set_wakeup(&wb.mutex(), &wb.room_cv());
  const bool staged = wb.stage(id, std::move(op), kernel_offset, [&] { return scope.interrupted(); });
  scope.set_wakeup(nullptr, nullptr);
  return staged;
}

void FuseClient::Impl::kick_writes(FuseIno id, std::atomic<std::uint64_t>& reason) { wb.kick(id, reason); }

void FuseClient::Impl::kick_writes_of(const fs::Request& r) {
  if (!wb.any_staged()) return;
  for (const fs::Op& op : r.ops) {
    for (const fs::Handle* h : {&op.handle, &op.handle2}) {
      if (h->is_ref || h->ino == 0) continue;
      if (const auto id = table.find(*h)) kick_writes(*id, stats.stage_sends_mutation);
    }
  }
}

// Runs with the write-behind's lock held (WriteBehind::SubmitFn): Backend::submit only queues, and the
// callback runs later on the backend's thread, holding none of the backend's locks (backend.h).
void FuseClient::Impl::submit_write(FuseIno id, const fs::Request& r, std::vector<WriteBehind::Piece> pieces) {
  const std::uint64_t seq = next_seq.fetch_add(1);
  note_ordered_submit(seq);
  Callbacks cb;
  cb.on_final = [this, id, pieces = std::move(pieces), seq](Final f) {
    const CallResult out = interpret(std::move(f), CallResult{});
    std::optional<fs::Attr> attr;
    if (out.err == 0 && !out.result.results.empty()) attr = out.result.results.back().attr;
    // An append that landed elsewhere than the kernel put it (another client appended meanwhile): this mount's
    // cached pages of the file are wrong, dropped now (asynchronously) and, for certain, at the next open.
    if (out.err == 0 && WriteBehind::appends_misplaced(pieces, out.result)) {
      table.drop_data_version(id);
      request_inval(id);
    }
    for (const WriteBehind::Piece& p : pieces) {
      table.write_finished(id, p.ticket, p.len, static_cast<std::uint32_t>(out.err), attr, seq);
    }
    wb.finished();  // after the table: a writer woken for room finds the bytes gone too
  };
  ++stats.requests_ordered;
  (void)backend->submit(r, SubmitOptions{}, std::move(cb));
}

}  // namespace bftfs::client
