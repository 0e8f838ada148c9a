// One request to the backend and its wait (FuseClient::Impl::call): submission in this client's order, the wait
// for the final result that only an interrupt or the daemon's stop ends (a hard mount: the backend retries as
// long as it takes), and the result's errno (one table: to_host_errno). Also the bookkeeping that lets the
// attribute cache trust what a result carried: local sequence numbers and the attribute barrier.
#include "client/fuse_client_impl.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <utility>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {

CallResult FuseClient::Impl::call(InterruptScope* scope, const fs::Request& r, bool read_only) {
  auto w = std::make_shared<Waiter>();
  // A mutation of an object must execute after every write() of it answered before (a chmod or utimes after
  // a write: the service executes in submission order): the object's staged writes go first, and take
  // their local sequence numbers first (numbers order attribute updates: node_table.h). Other objects'
  // staged writes need not: their order relative to this request is invisible to this client (its reads
  // wait for them) and another client is promised them only after close (close-to-open).
  if (!read_only) kick_writes_of(r);
  CallResult out;
  out.seq = next_seq.fetch_add(1);
  SubmitOptions so;
  so.read_only = read_only;
  ++(read_only ? stats.requests_read_only : stats.requests_ordered);
  if (!read_only) {
    raise_attr_barrier(out.seq);
    note_ordered_submit(out.seq);
  }
  Callbacks cb;
  cb.on_final = [w](Final f) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->fin = std::move(f);
      w->done = true;
    }
    w->cv.notify_all();
  };
  {
    std::lock_guard<std::mutex> lock(live_mu);
    live.insert(w);
  }
  const std::uint64_t tag = backend->submit(r, so, std::move(cb));
  bool done = false;
  {
    if (scope != nullptr) scope->set_wakeup(&w->mu, &w->cv);
    std::unique_lock<std::mutex> lock(w->mu);
    w->cv.wait(lock, [&] { return w->done || stopping.load() || (scope != nullptr && scope->interrupted()); });
    done = w->done;
  }
  if (scope != nullptr) scope->set_wakeup(nullptr, nullptr);
  {
    std::lock_guard<std::mutex> lock(live_mu);
    live.erase(w);
  }
  if (!done) {
    backend->cancel(tag);
    // A mutation that may still execute at any later time: the attribute cache can no longer tell which
    // attributes predate it, so it stops answering for the rest of this mount's life (rare: an interrupt).
    if (!read_only) attr_barrier.store(UINT64_MAX);
    out.err = scope != nullptr ? EINTR : EIO;
    return out;
  }
  // Every request submitted from now on is ordered after this mutation (or, read-only, runs on a state
  // that includes it).
  if (!read_only) {
    raise_attr_barrier(next_seq.load());
    // The attributes in this mutation's own result are the state right after it. If no other ordered
    // request was submitted while it was in flight, nothing of this client can have changed them since:
    // they count as fresh from now on (a number at or above the barrier), so that the kernel's next
    // GETATTR of an object the mutation returned (the created file, the changed directory) costs no
    // request. Otherwise they keep the mutation's own number (ordered by it, stale for the cache).
    if (last_ordered_submit.load() == out.seq) out.seq = next_seq.fetch_add(1);
  }
  return interpret(std::move(w->fin), out);
}

void FuseClient::Impl::note_ordered_submit(std::uint64_t seq) {
  std::uint64_t cur = last_ordered_submit.load();
  while (cur < seq && !last_ordered_submit.compare_exchange_weak(cur, seq)) {
  }
}

// `op` followed by a GETATTR of each directory in `dirs`: a mutation that changes directories (create,
// mkdir, unlink, rename...) returns their new attributes in the same request, because the kernel asks for
// them right after (it drops a directory's attributes when it changes, and needs its mode for the next
// permission check). The GETATTRs cannot fail once the op succeeded in those directories (one request is
// atomic), and go with root credentials (attributes are not permission-checked data).
fs::Request FuseClient::Impl::with_dir_attrs(fs::Op op, std::initializer_list<fs::Handle> dirs) {
  fs::Request r;
  r.ops.push_back(std::move(op));
  for (const fs::Handle& d : dirs) {
    if (std::any_of(r.ops.begin() + 1, r.ops.end(), [&](const fs::Op& o) { return o.handle == d; })) continue;
    fs::Op g = make_op(OpCode::kGetattr, fs::Cred{0, 0, {}});
    g.handle = d;
    r.ops.push_back(std::move(g));
  }
  return r;
}

void FuseClient::Impl::note_dir_attrs(const CallResult& r, std::size_t first) {
  if (r.err != 0) return;
  for (std::size_t i = first; i < r.result.results.size(); ++i) {
    const fs::OpResult& o = r.result.results[i];
    if (o.code == OpCode::kGetattr && o.err == 0) table.update_attr(o.attr, r.seq);
  }
}

void FuseClient::Impl::raise_attr_barrier(std::uint64_t to) {
  std::uint64_t cur = attr_barrier.load();
  while (cur < to && !attr_barrier.compare_exchange_weak(cur, to)) {
  }
}

CallResult FuseClient::Impl::interpret(Final fin, CallResult out) {
  if (fin.status == FinalStatus::kRefused) {
    LOG_ERROR("", "client: request refused by the backend: %s", fin.reason.c_str());
    out.err = EIO;
    return out;
  }
  const fs::Result& res = fin.result;
  switch (res.outcome) {
    case fs::Outcome::kDone:
      out.result = std::move(fin.result);
      return out;
    case fs::Outcome::kOpFailed:
      if (res.stop >= res.results.size()) {
        out.err = EIO;
        return out;
      }
      out.err = to_host_errno(res.results[res.stop].err);
      out.result = std::move(fin.result);
      return out;
    case fs::Outcome::kPredicateFailed:
      out.predicate_failed = true;
      out.result = std::move(fin.result);
      return out;
    case fs::Outcome::kMalformed:
      // Our own encoder produced something the service rejects: a bug on this side, not the user's.
      LOG_ERROR("", "client: the service rejected a request as malformed (reason %u)", res.stop);
      out.err = EIO;
      return out;
  }
  out.err = EIO;
  return out;
}

std::optional<std::uint32_t> FuseClient::Impl::gid_of(FuseIno id) {
  const auto s = table.snapshot(id);
  if (!s) return std::nullopt;
  return s->attr.gid;
}

}  // namespace bftfs::client
