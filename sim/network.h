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
//     the process): each node has an incarnation number and a frame carries the one it was sent to;
//   - optionally, the nodes below an id share one machine that takes in at most a number of bytes per tick
//     (limit_receivers): frames due beyond that wait, in the order they were sent, for the next ticks, so a
//     load larger than the machine handles becomes a backlog that every one of those nodes waits behind.
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
  std::uint64_t waited = 0;       // deliveries put off to a later tick by limit_receivers (a frame once per tick)
  std::uint64_t backlog_max = 0;  // the most frames due and put off at the end of one tick
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

  // Frames to nodes with ids below `nodes_below` share a budget of `bytes_per_tick` per tick (one machine that
  // takes in at most that much; a frame larger than what is left still goes, and the next tick's budget pays
  // for the excess); those due beyond it wait for the next tick, ahead of later frames. 0: no limit (default).
  void limit_receivers(std::uint32_t nodes_below, std::uint32_t bytes_per_tick);

  void set_slow(NodeId from, NodeId to, std::uint32_t extra_ticks);
  std::uint32_t slow_links() const;

  std::size_t in_flight() const { return queue_.size(); }
  // limit_receivers: the frames put off at the last tick that had more due than the budget.
  std::size_t backlog() const { return backlog_; }
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
  // limit_receivers: the shared budget, the tick it was last counted for, what it delivered then, and the frames
  // put off at that tick (pushed back, due at the next, when the tick's deliveries end).
  std::uint32_t limited_below_ = 0;
  std::uint32_t limited_bytes_per_tick_ = 0;
  std::uint64_t limited_tick_ = 0;
  std::int64_t limited_credit_ = 0;  // bytes the machine may still take in at limited_tick_ (<= 0: none)
  std::vector<Packet> put_off_;
  std::size_t backlog_ = 0;
  NetworkStats stats_;
};

}  // namespace bftfs::sim
