// The PBFT-CS counter (NSDI'09 §6.1): one operation increments a shared counter and returns its new value;
// each reply carries a token that the client must present on its next increment, so a client's requests are
// necessarily sequential (each depends on the previous reply). A read returns the value (read-only).
//
// State: the counter value (partition 0) and each client's expected token (partitions 1..255, by client id).
// Ops (little-endian):   increment: u8 1, u64 token      read: u8 2
// Result:                u8 status (0 ok, 1 bad token, 2 malformed), u64 value, u64 next_token
// A client's first token is counter_initial_token(client). A wrong token changes nothing and returns status 1
// with next_token = the token the client must present, so a
// client that lost a reply can resynchronize (the value it missed is still counted once).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>

#include "protocol/service.h"

namespace bftfs {

inline constexpr std::uint64_t kCounterPartitions = 256;

Bytes counter_increment_op(std::uint64_t token);
Bytes counter_read_op();
struct CounterResult {
  std::uint8_t status = 0;  // 0 ok, 1 bad token, 2 malformed
  std::uint64_t value = 0;
  std::uint64_t next_token = 0;
};
bool parse_counter_result(std::span<const std::uint8_t> bytes, CounterResult& out);
std::uint64_t counter_initial_token(NodeId client);

// `store` may be null (no durability: tests and NO-REP benchmarks that never restart).
class CounterService final : public Service {
 public:
  explicit CounterService(SnapshotStore* store);
  ~CounterService() override;
  // Service interface: see protocol/service.h.
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) override;
  void commit_through(std::uint64_t seq) override;
  void rollback_to(std::uint64_t seq) override;
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state = {}) override;
  void discard_checkpoints_below(std::uint64_t seq) override;
  CheckpointId recovered_checkpoint() const override;
  Bytes recovered_engine_state() const override;
  std::uint64_t partition_count() const override { return kCounterPartitions; }
  const PartitionTree& checkpoint_tree(std::uint64_t seq) const override;
  Bytes read_partition(std::uint64_t seq, std::uint64_t index) const override;
  void begin_install(std::uint64_t target_seq) override;
  void install_partition(std::uint64_t index, std::span<const std::uint8_t> data) override;
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state = {}) override;

  std::uint64_t value() const;  // current (possibly tentative) value, for tests and the simulator

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bftfs
