#include "sim/network.h"

#include <algorithm>

#include "common/assert.h"

namespace bftfs::sim {

namespace {
constexpr std::uint32_t kPpm = 1'000'000;
}

Network::Network(std::uint32_t nodes, const NetworkOptions& options, Prng& prng)
    : nodes_(nodes),
      options_(options),
      prng_(prng),
      incarnation_(nodes, 0),
      side_(nodes, 0),
      slow_extra_(static_cast<std::size_t>(nodes) * nodes, 0) {
  BFT_ASSERT(nodes > 0);
  BFT_ASSERT(options.delay_min_ticks <= options.delay_max_ticks);
}

void Network::set_options(const NetworkOptions& options) {
  BFT_ASSERT(options.delay_min_ticks <= options.delay_max_ticks);
  options_ = options;
}

void Network::enqueue(NodeId from, NodeId to, Bytes frame, std::uint64_t now) {
  Packet p;
  // At least one tick: a frame sent while handling a tick or a message is never seen in the same step.
  p.deliver_tick = now + prng_.range(options_.delay_min_ticks, options_.delay_max_ticks) +
                   slow_extra_[static_cast<std::size_t>(from) * nodes_ + to];
  if (p.deliver_tick == now) p.deliver_tick = now + 1;
  p.order = next_order_++;
  p.from = from;
  p.to = to;
  p.to_incarnation = incarnation_[to];
  p.frame = std::move(frame);
  queue_.push(std::move(p));
}

void Network::send(NodeId from, NodeId to, Bytes frame, std::uint64_t now) {
  BFT_ASSERT(from < nodes_);
  BFT_ASSERT(to < nodes_);
  ++stats_.sent;
  if (options_.loss_ppm > 0 && prng_.chance(options_.loss_ppm, kPpm)) {
    ++stats_.lost;
    return;
  }
  if (options_.duplicate_ppm > 0 && prng_.chance(options_.duplicate_ppm, kPpm)) {
    ++stats_.duplicated;
    enqueue(from, to, frame, now);
  }
  enqueue(from, to, std::move(frame), now);
}

bool Network::pop_due(std::uint64_t now, Packet& out) {
  if (limited_tick_ != now) {
    limited_tick_ = now;
    // What the machine did not use at the last tick is not saved up; what it overspent it still owes.
    limited_credit_ = std::min<std::int64_t>(limited_credit_, 0) + limited_bytes_per_tick_;
  }
  while (!queue_.empty() && queue_.top().deliver_tick <= now) {
    // priority_queue::top is const; the packet is copied out once (frames are small) and popped.
    Packet p = queue_.top();
    queue_.pop();
    if (p.to_incarnation != incarnation_[p.to]) {
      ++stats_.to_dead_node;
      continue;
    }
    if (!connected(p.from, p.to)) {
      ++stats_.partitioned;
      continue;
    }
    if (p.to < limited_below_ && limited_bytes_per_tick_ != 0) {
      if (limited_credit_ <= 0) {
        ++stats_.waited;
        put_off_.push_back(std::move(p));
        continue;
      }
      limited_credit_ -= static_cast<std::int64_t>(p.frame.size());
    }
    ++stats_.delivered;
    out = std::move(p);
    return true;
  }
  // The tick's deliveries end: what the machine had no time for is due at the next tick, still ahead of every
  // frame sent later (its `order` is kept), and is checked again for a crash or a partition then.
  backlog_ = put_off_.size();
  stats_.backlog_max = std::max<std::uint64_t>(stats_.backlog_max, backlog_);
  for (Packet& p : put_off_) {
    p.deliver_tick = now + 1;
    queue_.push(std::move(p));
  }
  put_off_.clear();
  return false;
}

void Network::limit_receivers(std::uint32_t nodes_below, std::uint32_t bytes_per_tick) {
  BFT_ASSERT(nodes_below <= nodes_);
  limited_below_ = nodes_below;
  limited_bytes_per_tick_ = bytes_per_tick;
  limited_credit_ = 0;
}

void Network::kill(NodeId node) {
  BFT_ASSERT(node < nodes_);
  ++incarnation_[node];
}

void Network::set_partition(const std::vector<std::uint8_t>& side) {
  BFT_ASSERT(side.size() == nodes_);
  side_ = side;
  partitioned_ = false;
  for (auto s : side_) {
    if (s != side_[0]) partitioned_ = true;
  }
}

void Network::heal() {
  std::fill(side_.begin(), side_.end(), 0);
  partitioned_ = false;
  std::fill(slow_extra_.begin(), slow_extra_.end(), 0);
}

bool Network::connected(NodeId a, NodeId b) const { return side_[a] == side_[b]; }

void Network::set_slow(NodeId from, NodeId to, std::uint32_t extra_ticks) {
  BFT_ASSERT(from < nodes_);
  BFT_ASSERT(to < nodes_);
  slow_extra_[static_cast<std::size_t>(from) * nodes_ + to] = extra_ticks;
}

std::uint32_t Network::slow_links() const {
  std::uint32_t count = 0;
  for (auto e : slow_extra_) count += e > 0 ? 1 : 0;
  return count;
}

}  // namespace bftfs::sim
