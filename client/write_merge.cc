// Merged writes of the spec session (FuseClient::Impl::merge_writes; docs/SPECULATION.md §6 "Built"): while the
// run speculates, a positional write() is answered at once and held here, later writes that continue it join
// it, and it is sent as one WRITE (one entry of the epoch) when anything else reaches the session. The held
// write is sent
//   - before any other request of the session is handled (fuse_ops.cc calls send_merged() first), so the model
//     executes the tree's requests in the order they were answered, as each write being an entry of its own
//     would: a read, a stat, a close or another process's request sees the write;
//   - before a checkpoint's seal and before the run ends (SpecSession::flush_writes), so a write answered before
//     the freeze is an entry of the epoch being sealed (invariant I7);
// and dropped at a rollback (the tree that wrote it is gone; its epoch failed).
//
// Why: an unpack writes each file in several write()s of the archive's records (3.4 per file for httpd's
// source). As entries of their own, each rewrote the file's data block and inode on every replica: the largest
// share of the replicas' work. Errors are those of write-behind on the mount's own connection: a WRITE the model
// refuses (EFBIG, ENOSPC, EIO) is reported by the file's next flush, fsync or close, through the node table.
//
// Locking: merged_mu is held while the held write is sent, so that the request that caused the send is
// submitted after it. Sending never waits for a seal (SpecBackend lets writes past the log's soft bound), so the
// seal, which takes merged_mu to send the held write, cannot wait for a sender that waits for it.
#include "client/fuse_client_impl.h"

#include <algorithm>

#include "common/assert.h"

namespace bftfs::client {

bool FuseClient::Impl::merges(const fuse_file_info* fi, bool append) const {
  return merge_writes && synchronous_writes.load() && !append && fi->writepage == 0;
}

void FuseClient::Impl::write_merge(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                                   std::uint64_t off, const OpenFile* of) {
  BFT_ASSERT(size <= kWriteOpsPerRequest * fs::kIoBytesMax);
  const fs::Cred cred = io_cred(of, id, 2);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(buf);
  {
    std::unique_lock<std::mutex> lock(merged_mu);
    const bool joins = merged.has_value() && merged->id == id && merged->handle == h && merged->cred == cred &&
                       merged->offset + merged->data.size() == off && merged->data.size() + size <= fs::kIoBytesMax;
    if (!joins) {
      send_merged_locked();
      merged = MergedWrite{id, h, cred, off, {}, {}};
      merged_held.store(true);
    }
    merged->data.insert(merged->data.end(), bytes, bytes + size);
    merged->tickets.emplace_back(table.write_submitted(id, off, size, false), size);
  }
  drop_prefetch(id);
  freply_write(req, size);
}

void FuseClient::Impl::send_merged() {
  if (!merged_held.load()) return;
  std::lock_guard<std::mutex> lock(merged_mu);
  send_merged_locked();
}

void FuseClient::Impl::send_merged_locked() {
  if (!merged.has_value()) return;
  MergedWrite w = std::move(*merged);
  merged.reset();
  merged_held.store(false);
  fs::Op op = make_op(OpCode::kWrite, w.cred);
  op.handle = w.handle;
  op.offset = w.offset;
  op.data = std::move(w.data);
  const std::uint64_t seq = next_seq.fetch_add(1);
  note_ordered_submit(seq);
  Callbacks cb;
  cb.on_final = [this, id = w.id, tickets = std::move(w.tickets), seq](Final f) {
    const CallResult out = interpret(std::move(f), CallResult{});
    std::optional<fs::Attr> attr;
    if (out.err == 0 && !out.result.results.empty()) attr = out.result.results.back().attr;
    for (const auto& [ticket, len] : tickets) {
      table.write_finished(id, ticket, len, static_cast<std::uint32_t>(out.err), attr, seq);
    }
  };
  ++stats.requests_ordered;
  // The spec backend answers before submit() returns (from its model, or refusing); a backend that queues
  // instead (the session no longer speculating) still orders it before what is submitted next.
  (void)backend->submit(single(std::move(op)), SubmitOptions{}, std::move(cb));
}

void FuseClient::Impl::drop_merged() {
  std::lock_guard<std::mutex> lock(merged_mu);
  if (!merged.has_value()) return;
  for (const auto& [ticket, len] : merged->tickets) {
    table.write_finished(merged->id, ticket, len, 0, std::nullopt, 0);
  }
  merged.reset();
  merged_held.store(false);
}

}  // namespace bftfs::client
