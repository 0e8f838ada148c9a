// The fault phase's faults (simulation.h), one tick at a time, each drawn from the run's fault stream in a fixed
// order: restarts, armed crashes that reached their deadline, a random crash, every replica at once, partitions,
// slow links. At most f replicas are faulty at any time (crashed, armed to crash, or Byzantine).
#include "sim/simulation.h"

#include "sim/strfmt.h"

namespace bftfs::sim {

std::uint32_t Simulation::faulty_now() const {
  std::uint32_t faulty = 0;
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    faulty += (!r.up || r.armed || !r.correct()) ? 1 : 0;
  }
  return faulty;
}

void Simulation::faults() {
  restart_due();
  maybe_crash();
  if (sc_.mode == Mode::kAllCrash && all_crash_due()) {
    ++stats_.all_crashes;
    event("crash every replica at once");
    for (NodeId id = 0; id < sc_.n; ++id) {
      if (cluster_->host(id).up) cluster_->crash(id, "all at once", sc_.all_crash_at_checkpoint);
    }
  }
  partitions();
  slow_links();
}

// Mode::kAllCrash: at all_crash_tick, or with all_crash_at_checkpoint at the first tick from then on at which
// 2f+1 replicas hold a CheckpointRecord that is not durable yet (a power loss right after their service
// checkpoints: with the log's tail lost, no replica but the other f can claim that checkpoint from its log).
bool Simulation::all_crash_due() {
  if (!sc_.all_crash_at_checkpoint) return now() == sc_.all_crash_tick;
  if (all_crash_done_ || now() < sc_.all_crash_tick) return false;
  std::uint32_t unsynced = 0;
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (!r.up) continue;
    for (std::size_t i = r.synced; i < r.log.size(); ++i) {
      if (std::holds_alternative<CheckpointRecord>(r.log[i])) {
        ++unsynced;
        break;
      }
    }
  }
  all_crash_done_ = unsynced >= 2 * sc_.f + 1;
  return all_crash_done_;
}

// Restarts first, so that a slot in the fault budget frees up; then armed crashes whose deadline passed.
void Simulation::restart_due() {
  for (NodeId id = 0; id < sc_.n; ++id) {
    if (!cluster_->host(id).up && now() >= fates_[id].restart_tick) {
      ++stats_.restarts;
      cluster_->restart(id);
    }
  }
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (r.up && r.armed && now() >= r.armed_deadline) cluster_->crash(id, "armed crash deadline");
  }
}

// A crash of a random correct replica, with the scenario's odds and within the fault budget: now, or armed for
// its next persist (between persisting and sending).
void Simulation::maybe_crash() {
  if (sc_.crash_ppm == 0 || !prng_.chance(sc_.crash_ppm, kPpm) || faulty_now() >= sc_.f) return;
  std::vector<NodeId> candidates;
  for (NodeId id = 0; id < sc_.n; ++id) {
    const ReplicaHost& r = cluster_->host(id);
    if (r.up && !r.armed && r.correct()) candidates.push_back(id);
  }
  if (candidates.empty()) return;
  const NodeId id = candidates[prng_.below(candidates.size())];
  if (prng_.chance(1, 2)) {
    cluster_->arm_crash(id, now() + kArmedCrashTicksMax);
    event(fmt("arm crash r%u (between its next persist and send)", id));
  } else {
    cluster_->crash(id, "between steps");
  }
}

// Partitions: every node on a random side, for a while.
void Simulation::partitions() {
  Network& net = cluster_->network();
  if (net.partitioned() && now() >= partition_end_) {
    net.set_partition(std::vector<std::uint8_t>(nodes_, 0));
    event("partition healed");
  } else if (!net.partitioned() && sc_.partition_ppm > 0 && prng_.chance(sc_.partition_ppm, kPpm)) {
    std::vector<std::uint8_t> side(nodes_);
    std::string desc;
    for (NodeId i = 0; i < nodes_; ++i) {
      side[i] = static_cast<std::uint8_t>(prng_.below(2));
      desc += side[i] != 0 ? '1' : '0';
    }
    net.set_partition(side);
    partition_end_ = now() + prng_.range(50, 400);
    ++stats_.partitions;
    event(fmt("partition %s until t=%llu", desc.c_str(), ull(partition_end_)));
  }
}

// Slow links: a slow node (all its links) or one slow direction.
void Simulation::slow_links() {
  Network& net = cluster_->network();
  for (std::size_t i = 0; i < slow_.size();) {
    if (now() >= slow_[i].until) {
      net.set_slow(slow_[i].from, slow_[i].to, 0);
      slow_[i] = slow_.back();
      slow_.pop_back();
    } else {
      ++i;
    }
  }
  if (sc_.slow_ppm == 0 || !slow_.empty() || !prng_.chance(sc_.slow_ppm, kPpm)) return;
  const auto extra = static_cast<std::uint32_t>(prng_.range(10, 80));
  const std::uint64_t until = now() + prng_.range(100, 600);
  const auto x = static_cast<NodeId>(prng_.below(nodes_));
  if (prng_.chance(1, 2)) {
    for (NodeId y = 0; y < nodes_; ++y) {
      if (y == x) continue;
      net.set_slow(x, y, extra);
      net.set_slow(y, x, extra);
      slow_.push_back(SlowLink{x, y, until});
      slow_.push_back(SlowLink{y, x, until});
    }
    event(fmt("slow node %u +%u ticks until t=%llu", x, extra, ull(until)));
  } else {
    const auto y = static_cast<NodeId>((x + 1 + prng_.below(nodes_ - 1)) % nodes_);
    net.set_slow(x, y, extra);
    slow_.push_back(SlowLink{x, y, until});
    event(fmt("slow link %u->%u +%u ticks until t=%llu", x, y, extra, ull(until)));
  }
  ++stats_.slow_links;
}

}  // namespace bftfs::sim
