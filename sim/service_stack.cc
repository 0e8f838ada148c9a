// The simulated replicas' service stacks (service_stack.h).
#include "sim/service_stack.h"

#include <vector>

#include "common/assert.h"
#include "services/null_service.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"

namespace bftfs::sim {

const char* to_string(ServiceKind k) {
  switch (k) {
    case ServiceKind::kCounter:
      return "counter";
    case ServiceKind::kNull:
      return "null";
    case ServiceKind::kFs:
      return "fs";
  }
  return "?";
}

Bytes strip_predicates(std::span<const std::uint8_t> op) {
  std::vector<shim::Dependency> deps;
  std::span<const std::uint8_t> inner_op;
  if (shim::decode_envelope(op, deps, inner_op) != shim::EnvelopeError::kOk || deps.empty()) {
    return Bytes(op.begin(), op.end());
  }
  return shim::encode_envelope({}, inner_op);
}

Bytes corrupt_fs_writes(std::span<const std::uint8_t> op) {
  shim::ShimRequest envelope;
  fs::Request request;
  if (shim::decode_envelope(op, envelope) != shim::EnvelopeError::kOk ||
      fs::decode_request(envelope.op, request) != fs::FsDecodeError::kOk) {
    return Bytes(op.begin(), op.end());
  }
  for (fs::Op& o : request.ops) {
    if (o.code == fs::OpCode::kWrite && !o.data.empty()) o.data[0] ^= 0x5A;
  }
  envelope.op = fs::encode_request(request);
  return shim::encode_envelope(envelope);
}

Bytes OpRewriter::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  return inner_.execute(ctx, rewrite_(op));
}
bool OpRewriter::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  return inner_.execute_read_only(client, op, result);
}
void OpRewriter::commit_through(std::uint64_t seq) { inner_.commit_through(seq); }
void OpRewriter::rollback_to(std::uint64_t seq) { inner_.rollback_to(seq); }
CheckpointId OpRewriter::checkpoint(std::uint64_t seq) { return inner_.checkpoint(seq); }
void OpRewriter::discard_checkpoints_below(std::uint64_t seq) { inner_.discard_checkpoints_below(seq); }
CheckpointId OpRewriter::recovered_checkpoint() const { return inner_.recovered_checkpoint(); }
std::uint64_t OpRewriter::partition_count() const { return inner_.partition_count(); }
const PartitionTree& OpRewriter::checkpoint_tree(std::uint64_t seq) const { return inner_.checkpoint_tree(seq); }
Bytes OpRewriter::read_partition(std::uint64_t seq, std::uint64_t index) const {
  return inner_.read_partition(seq, index);
}
void OpRewriter::begin_install(std::uint64_t target_seq) { inner_.begin_install(target_seq); }
void OpRewriter::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  inner_.install_partition(index, data);
}
CheckpointId OpRewriter::finish_install(std::uint64_t target_seq) { return inner_.finish_install(target_seq); }

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
    case ServiceKind::kFs: {
      // In memory, through the replica's store: crashes, restarts and state transfer cover the file tree.
      BFT_ASSERT(options.shim);  // as in production, the file service runs behind the shim
      auto svc = std::make_unique<fs::FsService>(&store, options.fs_options);
      fs = svc.get();
      service = std::move(svc);
      break;
    }
  }
  BFT_ASSERT(service != nullptr);
  Service* top_below = service.get();
  if (options.shim) {
    // Recovers the shim's logs of the service's recovered checkpoint from the same store (shim.h).
    probe = std::make_unique<ExecutionProbe>(*service);
    shim = std::make_unique<shim::Shim>(*probe, &store, options.shim_options);
    top_below = shim.get();
    if (options.strip_predicates) {
      saboteur = std::make_unique<OpRewriter>(*shim, strip_predicates);
    } else if (options.corrupt_fs_writes) {
      saboteur = std::make_unique<OpRewriter>(*shim, corrupt_fs_writes);
    }
    if (saboteur) top_below = saboteur.get();
  }
  // The file service's checker replays the agreed history on its oracle: the records keep their ops.
  recording = std::make_unique<RecordingService>(*top_below, shim.get(), probe.get(), fs != nullptr);
}

}  // namespace bftfs::sim
