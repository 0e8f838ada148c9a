// The simulated network: frames in flight between nodes, each due at a tick. Pure (no sockets, no clocks);
// every random choice comes from the Prng it is given, so one seed reproduces the exact delivery order.
//
// Model (what the replicas must tolerate, TOCS §2.1: "the network may fail to deliver messages, delay them,
// duplicate them, or deliver them out of order"):
//   - each frame gets a delay in [delay_min_ticks, delay_max_ticks], so frames overtake each other;
//   - a frame is lost with probability loss_ppm / 1e6 and duplicated (with its own delay) with duplicate_ppm;
//   - a partition assigns every node a side; a frame whose ends are on different sides when it is due is lost;
//   - a slow link (from, to) adds extra ticks to every frame sent on it;
//   - a frame addressed to a node that crashed after it was sent is never delivered (the connection died with
//     the process): each node has an incarnation number and a frame carries the one it was sent to.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "common/prng.h"
#include "common/types.h"

namespace bftfs::sim {

struct NetworkOptions {
  std::uint32_t delay_min_ticks = 1;
  std::uint32_t delay_max_ticks = 5;
  std::uint32_t loss_ppm = 0;
  std::uint32_t duplicate_ppm = 0;
};

struct Packet {
  std::uint64_t deliver_tick = 0;
  std::uint64_t order = 0;  // tie-break: frames due at the same tick are delivered in send order
  NodeId from = 0;
  NodeId to = 0;
  std::uint64_t to_incarnation = 0;
  Bytes frame;
};

struct NetworkStats {
  std::uint64_t sent = 0;
  std::uint64_t delivered = 0;
  std::uint64_t lost = 0;
  std::uint64_t duplicated = 0;
  std::uint64_t partitioned = 0;
  std::uint64_t to_dead_node = 0;
};

class Network {
 public:
  // `nodes` is the number of node ids (replicas and clients, ids 0..nodes-1). `prng` must outlive the network.
  Network(std::uint32_t nodes, const NetworkOptions& options, Prng& prng);

  void set_options(const NetworkOptions& options);
  const NetworkOptions& options() const { return options_; }

  // Queues `frame` from `from` to `to` at tick `now`, applying loss, duplication and delay.
  void send(NodeId from, NodeId to, Bytes frame, std::uint64_t now);
  // Moves out the next packet due at or before `now` that can be delivered; false when none is due.
  // Packets to crashed incarnations or across a partition are dropped (and counted) on the way.
  bool pop_due(std::uint64_t now, Packet& out);

  // The node crashed: frames in flight to it are dropped when due.
  void kill(NodeId node);
  std::uint64_t incarnation(NodeId node) const { return incarnation_[node]; }

  // Partition: side[i] is node i's side; nodes on different sides cannot exchange frames.
  void set_partition(const std::vector<std::uint8_t>& side);
  bool partitioned() const { return partitioned_; }
  void heal();  // no partition, no slow links
  bool connected(NodeId a, NodeId b) const;

  void set_slow(NodeId from, NodeId to, std::uint32_t extra_ticks);
  std::uint32_t slow_links() const;

  std::size_t in_flight() const { return queue_.size(); }
  const NetworkStats& stats() const { return stats_; }

 private:
  struct Later {
    bool operator()(const Packet& a, const Packet& b) const {
      if (a.deliver_tick != b.deliver_tick) return a.deliver_tick > b.deliver_tick;
      return a.order > b.order;
    }
  };
  void enqueue(NodeId from, NodeId to, Bytes frame, std::uint64_t now);

  std::uint32_t nodes_;
  NetworkOptions options_;
  Prng& prng_;
  std::priority_queue<Packet, std::vector<Packet>, Later> queue_;
  std::uint64_t next_order_ = 0;
  std::vector<std::uint64_t> incarnation_;
  std::vector<std::uint8_t> side_;
  bool partitioned_ = false;
  std::vector<std::uint32_t> slow_extra_;  // nodes * nodes, index from * nodes + to
  NetworkStats stats_;
};

}  // namespace bftfs::sim
