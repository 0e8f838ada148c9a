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

Bytes strip_epoch_entries(std::span<const std::uint8_t> op) {
  shim::ShimRequest envelope;
  fs::Request request;
  if (shim::decode_envelope(op, envelope) != shim::EnvelopeError::kOk ||
      fs::decode_request(envelope.op, request) != fs::FsDecodeError::kOk || request.ops.size() != 1 ||
      request.ops[0].code != fs::OpCode::kEpoch) {
    return Bytes(op.begin(), op.end());
  }
  request.ops[0].entries.clear();
  envelope.op = fs::encode_request(request);
  return shim::encode_envelope(envelope);
}

Bytes OpRewriter::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) {
  return inner_.execute(ctx, rewrite_(op));
}

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
  if (fs != nullptr) {
    audit = std::make_unique<StreamOpAudit>(*service, *fs);
    top_below = audit.get();
  }
  if (options.shim) {
    // Recovers the shim's logs of the service's recovered checkpoint from the same store (shim.h).
    probe = std::make_unique<ExecutionProbe>(*top_below);
    shim = std::make_unique<shim::Shim>(*probe, &store, options.shim_options);
    top_below = shim.get();
    if (options.strip_predicates) {
      saboteur = std::make_unique<OpRewriter>(*shim, strip_predicates);
    } else if (options.corrupt_fs_writes) {
      saboteur = std::make_unique<OpRewriter>(*shim, corrupt_fs_writes);
    } else if (options.strip_epoch_entries) {
      saboteur = std::make_unique<OpRewriter>(*shim, strip_epoch_entries);
    }
    if (saboteur) top_below = saboteur.get();
  }
  // The file service's checker replays the agreed history on its oracle: the records keep their ops.
  recording = std::make_unique<RecordingService>(*top_below, shim.get(), probe.get(), fs != nullptr);
}

}  // namespace bftfs::sim
