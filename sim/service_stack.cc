// The simulated replicas' service stacks (service_stack.h).
#include "sim/service_stack.h"

#include <vector>

#include "common/assert.h"
#include "services/null_service.h"
#include "shim/envelope.h"

namespace bftfs::sim {

const char* to_string(ServiceKind k) {
  switch (k) {
    case ServiceKind::kCounter:
      return "counter";
    case ServiceKind::kNull:
      return "null";
  }
  return "?";
}

Bytes PredicateStripper::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  std::vector<shim::Dependency> deps;
  std::span<const std::uint8_t> inner_op;
  if (shim::decode_envelope(op, deps, inner_op) != shim::EnvelopeError::kOk || deps.empty()) {
    return inner_.execute(ctx, op);
  }
  return inner_.execute(ctx, shim::encode_envelope({}, inner_op));
}

bool PredicateStripper::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  return inner_.execute_read_only(client, op, result);
}
void PredicateStripper::commit_through(std::uint64_t seq) { inner_.commit_through(seq); }
void PredicateStripper::rollback_to(std::uint64_t seq) { inner_.rollback_to(seq); }
CheckpointId PredicateStripper::checkpoint(std::uint64_t seq) { return inner_.checkpoint(seq); }
void PredicateStripper::discard_checkpoints_below(std::uint64_t seq) { inner_.discard_checkpoints_below(seq); }
CheckpointId PredicateStripper::recovered_checkpoint() const { return inner_.recovered_checkpoint(); }
std::uint64_t PredicateStripper::partition_count() const { return inner_.partition_count(); }
const PartitionTree& PredicateStripper::checkpoint_tree(std::uint64_t seq) const {
  return inner_.checkpoint_tree(seq);
}
Bytes PredicateStripper::read_partition(std::uint64_t seq, std::uint64_t index) const {
  return inner_.read_partition(seq, index);
}
void PredicateStripper::begin_install(std::uint64_t target_seq) { inner_.begin_install(target_seq); }
void PredicateStripper::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  inner_.install_partition(index, data);
}
CheckpointId PredicateStripper::finish_install(std::uint64_t target_seq) { return inner_.finish_install(target_seq); }

SimStack::SimStack(const SimStackOptions& options, MemorySnapshotStore& store) {
  switch (options.service) {
    case ServiceKind::kCounter: {
      auto svc = std::make_unique<CounterService>(&store);
      counter = svc.get();
      service = std::move(svc);
      break;
    }
    case ServiceKind::kNull:
      service = std::make_unique<NullService>(&store);
      break;
  }
  BFT_ASSERT(service != nullptr);
  Service* top_below = service.get();
  if (options.shim) {
    // Recovers the shim's logs of the service's recovered checkpoint from the same store (shim.h).
    probe = std::make_unique<ExecutionProbe>(*service);
    shim = std::make_unique<shim::Shim>(*probe, &store, options.shim_options);
    top_below = shim.get();
    if (options.strip_predicates) {
      stripper = std::make_unique<PredicateStripper>(*shim);
      top_below = stripper.get();
    }
  }
  recording = std::make_unique<RecordingService>(*top_below, shim.get(), probe.get());
}

}  // namespace bftfs::sim
