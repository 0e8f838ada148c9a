// The replica's side of state transfer (TOCS §5.3): when to fetch a checkpoint, starting the StateFetcher
// (protocol/state_transfer.h) with the local tree to diff against, installing what it fetched, serving
// FETCH-STATE to others, and repairing damaged service storage the same way. See replica_impl.h for the map of
// the replica's files.
#include "common/assert.h"
#include "common/log.h"
#include "protocol/replica_impl.h"

namespace bftfs {

// f+1 matching CHECKPOINT claims above what we committed mean at least one correct replica has that state
// (tentative execution does not count: it may be undone, and the commits for it may be garbage collected at the
// others). We fetch it at once when it is beyond our window (the log cannot get us there), otherwise only when
// no batch committed over a status interval (the peers may have garbage collected the log we need).
void Replica::Impl::check_state_transfer(bool stalled) {
  std::map<std::pair<std::uint64_t, Digest>, std::uint32_t> counts;
  for (NodeId r = 0; r < opt.n; r++) {
    for (auto it = claims[r].upper_bound(last_committed); it != claims[r].end(); ++it) {
      counts[{it->first, it->second}]++;
    }
  }
  const std::pair<std::uint64_t, Digest>* best = nullptr;
  for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
    if (it->second >= weak) {
      best = &it->first;
      break;
    }
  }
  if (best == nullptr) return;
  const std::uint64_t s = best->first;
  if (service_diverged && s < diverged_service_seq) return;
  if (fetcher.active() && fetcher.target_seq() >= s) return;
  if (s > h + opt.log_window || stalled || service_diverged) start_state_fetch(s, best->second);
}

// The service found its stored state damaged (a checksum mismatch): the replica becomes one of the f faults
// until a state transfer repairs it. It stops executing and replying (service_diverged) and fetches the next
// stable checkpoint, diffing against its own newest checkpoint with the damaged partitions blanked, so only
// those and what changed since are fetched. Returns whether the service is damaged.
bool Replica::Impl::check_service_damage() {
  if (service_damaged) return true;
  const std::vector<std::uint64_t> damaged = service.damaged_partitions();
  if (damaged.empty()) return false;
  LOG_WARN(ctx(), "service storage damaged in %zu partition(s) (first %llu); silent until repaired by state transfer",
           damaged.size(), static_cast<unsigned long long>(damaged.front()));
  stats.service_damaged++;
  service_damaged = true;
  if (!service_diverged) {
    service_diverged = true;
    diverged_service_seq = last_committed;
  }
  return true;
}

void Replica::Impl::start_state_fetch(std::uint64_t s, const Digest& d) {
  if (s <= last_committed) return;
  if (fetcher.active() && fetcher.target_seq() >= s) return;
  discard_open_batch();  // the state is about to be replaced; the primary stops executing early meanwhile
  // The fetcher skips subtrees equal to `local`, and an install starts from the service's newest checkpoint
  // (what it executed after that is discarded): so `local` is the tree of our newest checkpoint, which is the
  // service's newest, when the service still holds it; otherwise everything is fetched.
  const PartitionTree* local = nullptr;
  auto newest = own_checkpoints.rbegin();
  if (!service_diverged && newest->second.retained) local = &service.checkpoint_tree(newest->first);
  if (service_damaged && newest->second.retained) {
    repair_tree = service.checkpoint_tree(newest->first);
    for (std::uint64_t p : service.damaged_partitions()) {
      if (p < repair_tree->leaves()) repair_tree->set_leaf(p, Digest{});  // no partition's digest is zero
    }
    local = &*repair_tree;
  }
  fetch_bytes_at_start = fetcher.bytes_fetched();
  LOG_INFO(ctx(), "state transfer to checkpoint s%llu %s (local %s)", static_cast<unsigned long long>(s),
           d.short_hex().c_str(), local ? "diff" : "full");
  fetcher.start(s, d, local, service.partition_count());
}

void Replica::Impl::poll_fetcher() {
  for (Send& s : fetcher.take_sends()) cur->sends.push_back(std::move(s));
  if (std::optional<FetchedState> result = fetcher.take_result()) install_fetched_state(std::move(*result));
}

// Installs the checkpoint the fetcher completed (its bytes match the agreed digest): the service's state, the
// client table, and the checkpoint as our stable one, with the records that let a restart find it.
void Replica::Impl::install_fetched_state(FetchedState&& fs) {
  const std::uint64_t fetched = fetcher.bytes_fetched();
  stats.state_transfer_bytes += fetched >= fetch_bytes_at_start ? fetched - fetch_bytes_at_start : fetched;
  if (fs.seq <= last_committed && !service_diverged) {
    LOG_INFO(ctx(), "state transfer to s%llu no longer needed", static_cast<unsigned long long>(fs.seq));
    return;
  }
  // The fetcher checked every byte against the agreed digest, so the table comes from a correct replica; we
  // still validate it before touching the service (decoding never trusts bytes).
  ClientTable table(opt.client_window);
  if (!ClientTable::decode(fs.client_table, opt.client_window, table)) {
    LOG_WARN(ctx(), "fetched client table for s%llu does not decode; dropped", static_cast<unsigned long long>(fs.seq));
    stats.rejected_invalid++;
    return;
  }
  BFT_ASSERT(checkpoint_digest(fs.seq, fs.service_root, digest_of(fs.client_table)) == fs.checkpoint_digest);
  discard_open_batch();
  if (last_executed > last_committed && !service_diverged) rollback_to(last_committed);
  service.begin_install(fs.seq);
  for (const auto& [index, data] : fs.partitions) service.install_partition(index, data);
  const CheckpointId id = service.finish_install(fs.seq, fs.client_table);  // durable with the client table
  if (id.seq != fs.seq || id.digest != fs.service_root) {
    // The service refused bytes that matched their digests (they describe no state it can hold): it keeps its
    // state, and so do we; a later checkpoint may be fetched instead.
    LOG_WARN(ctx(), "service rejected the state of checkpoint s%llu", static_cast<unsigned long long>(fs.seq));
    stats.rejected_invalid++;
    return;
  }
  become_stable_at(fs.seq, fs.checkpoint_digest, std::move(fs.client_table), std::move(table));
  stats.state_transfers++;
  LOG_INFO(ctx(), "state transfer complete at s%llu", static_cast<unsigned long long>(fs.seq));
}

// The service's recovered checkpoint (recovered_pending) is stable, or a new view starts from it: it becomes our
// stable checkpoint as a fetched one does, without fetching what we already hold.
void Replica::Impl::adopt_recovered_checkpoint() {
  BFT_ASSERT(recovered_pending.has_value());
  BFT_ASSERT(service_diverged);
  RecoveredCheckpoint rc = std::move(*recovered_pending);
  recovered_pending.reset();
  ClientTable table(opt.client_window);
  const bool decoded = ClientTable::decode(rc.client_table, opt.client_window, table);
  BFT_ASSERT(decoded);  // checked at recovery
  discard_open_batch();
  LOG_INFO(ctx(), "recovered checkpoint s%llu is stable; resuming from it", static_cast<unsigned long long>(rc.seq));
  become_stable_at(rc.seq, rc.digest, std::move(rc.client_table), std::move(table));
  stats.recovered_checkpoints_adopted++;
}

// The replica now stands at checkpoint (s, d), which the service holds (installed or recovered), with `table`
// (encoded as `table_bytes`): it is our stable checkpoint, with the records that let a restart find it.
void Replica::Impl::become_stable_at(std::uint64_t s, const Digest& d, Bytes table_bytes, ClientTable table) {
  clients = std::move(table);
  service_diverged = false;
  service_damaged = false;
  recovered_pending.reset();
  repair_tree.reset();
  last_executed = s;
  last_committed = s;
  last_executed_timestamp_ns = 0;
  // The StableRecord first: a crash may keep any prefix of records not yet durable, and the service's state is
  // already on disk, with its client table. With neither record, recover() pairs that state with the table the
  // service kept and claims the checkpoint again; the order matters for a service without stored engine states
  // (an older store), where with the CheckpointRecord alone recover() would pair the state with its table and
  // find no log between the older stable checkpoint and it (a state transfer has no pre-prepares to replay),
  // and with the StableRecord alone it finds no client table for the state and fetches it again, which is safe.
  persist(StableRecord{s, d});
  persist(CheckpointRecord{s, d, table_bytes});
  own_checkpoints[s] = OwnCheckpoint{d, std::move(table_bytes), true};
  add_claim(self, s, d);
  h = s;
  stable_digest = d;
  advance_window();
  broadcast(Checkpoint{s, d});
  forget_executed_requests();  // the service's state executed them
  // A primary's `pending` named requests of batches up to s that it never executed itself; one that every
  // replica skipped there for per-client order is still fresh, and a stale entry would make the primary drop
  // its retransmissions forever (sim/FINDINGS.md F9).
  rebuild_pending();
}

void Replica::Impl::on_fetch_state(NodeId from, const FetchState& fs) {
  auto it = own_checkpoints.find(fs.checkpoint_seq);
  if (it == own_checkpoints.end() || !it->second.retained) return;  // a correct fetcher asks someone else
  std::optional<Message> reply = serve_fetch_state(fs, service, fs.checkpoint_seq, it->second.client_table);
  if (reply) send(from, std::move(*reply));
}

}  // namespace bftfs
