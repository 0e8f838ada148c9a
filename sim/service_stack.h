// The service stacks the simulated replicas run (ServiceStack, sim/cluster.h), and the ready-made stacks the
// unit tests use.
//
// A seed's replicas run
//   Replica -> RecordingService [-> OpRewriter] [-> shim::Shim -> ExecutionProbe]
//           -> CounterService | NullService | [StreamOpAudit ->] fs::FsService
// (the parts in brackets in PBFT-CS seeds and file-service seeds, which always run the shim, as in production; the
// rewriter only with SimConfig::sabotage_predicates or sabotage_fs, on correct replicas). RecordingService hands the checker what became final (sim/recording_service.h). A new service for
// the simulator is one more inner service here, with what its checker needs to read from it.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "protocol/forwarding_service.h"
#include "protocol/service.h"
#include "services/counter_service.h"
#include "services/fs/fs_service.h"
#include "shim/shim.h"
#include "sim/cluster.h"
#include "sim/recording_service.h"
#include "sim/spec_audit.h"

namespace bftfs::sim {

// The service a seed's replicas run. A new one is a kind here, its place in SimStack, its choice in
// sim/scenario.cc, its clients in sim/clients.cc and what its checker is fed from them.
enum class ServiceKind { kCounter, kNull, kFs };
const char* to_string(ServiceKind k);

// The simulator's sabotage (tests of the simulator only): a Service decorator that rewrites each ordered op
// before the service below it sees it, as a faulty replica would; every other call forwards.
class OpRewriter final : public ForwardingService {
 public:
  using Rewrite = std::function<Bytes(std::span<const std::uint8_t> op)>;
  // `inner` must outlive this object; `rewrite` returns the op `inner` executes instead of `op`.
  OpRewriter(Service& inner, Rewrite rewrite) : ForwardingService(inner), rewrite_(std::move(rewrite)) {}
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;

 private:
  Rewrite rewrite_;
};

// SimConfig::sabotage_predicates: the envelope without its dependencies, so the shim below executes requests
// whatever their predicates (an op that is not an envelope, or has none, stays as it is).
Bytes strip_predicates(std::span<const std::uint8_t> op);
// SimConfig::sabotage_epochs: an EPOCH of a file-service request inside an envelope without its inline entries.
Bytes strip_epoch_entries(std::span<const std::uint8_t> op);
// SimConfig::sabotage_fs: every WRITE of a file-service request inside an envelope writes its first byte
// altered, so the replicas' trees drift from what the clients asked for, all alike.
Bytes corrupt_fs_writes(std::span<const std::uint8_t> op);

// What the simulator needs to build one replica's stack.
struct SimStackOptions {
  ServiceKind service = ServiceKind::kCounter;
  bool shim = false;    // PBFT-CS: the shim (with `shim_options`) over a probe over the service
  shim::ShimOptions shim_options;
  bool strip_predicates = false;  // an OpRewriter over the shim that strips predicates (needs `shim`)
  bool corrupt_fs_writes = false;  // an OpRewriter over the shim that alters WRITE data (needs `shim`)
  bool strip_epoch_entries = false;  // an OpRewriter over the shim that empties EPOCHs (needs `shim`)
  fs::FsOptions fs_options;       // kFs: the file service's (every replica and the oracle use the same)
};

// One simulated replica's services. Members are declared from the bottom of the stack up, so that each is
// destroyed before what it refers to.
class SimStack final : public ServiceStack {
 public:
  // Builds the stack over `store` (services recover from it at a restart).
  SimStack(const SimStackOptions& options, MemorySnapshotStore& store);
  Service& top() override { return *recording; }

  std::unique_ptr<Service> service;       // CounterService, NullService or FsService
  CounterService* counter = nullptr;      // `service` when it is the counter
  fs::FsService* fs = nullptr;            // `service` when it is the file service
  std::unique_ptr<StreamOpAudit> audit;   // the file service: property 12 around STAGE and EPOCH (spec_audit.h)
  std::unique_ptr<ExecutionProbe> probe;  // PBFT-CS: between the shim and the service
  std::unique_ptr<shim::Shim> shim;       // PBFT-CS: the shim over the probe
  std::unique_ptr<OpRewriter> saboteur;   // strip_predicates or corrupt_fs_writes
  std::unique_ptr<RecordingService> recording;
};

// A stack of one service of type S, built by `make(store)`.
template <typename S>
class PlainStack final : public ServiceStack {
 public:
  explicit PlainStack(std::unique_ptr<S> s) : service(std::move(s)) {}
  Service& top() override { return *service; }
  std::unique_ptr<S> service;
};

// An inner service of type S under the PBFT-CS shim (whose logs live in the same store).
template <typename S>
class ShimStack final : public ServiceStack {
 public:
  ShimStack(std::unique_ptr<S> s, MemorySnapshotStore& store)
      : inner(std::move(s)), shim(std::make_unique<shim::Shim>(*inner, &store)) {}
  Service& top() override { return *shim; }
  std::unique_ptr<S> inner;
  std::unique_ptr<shim::Shim> shim;
};

// Factories of those stacks, from a function that builds the service over the replica's store.
template <typename S>
ServiceFactory plain_stack(std::function<std::unique_ptr<S>(SnapshotStore*)> make) {
  return [make](NodeId, MemorySnapshotStore& store) { return std::make_unique<PlainStack<S>>(make(&store)); };
}
template <typename S>
ServiceFactory shim_stack(std::function<std::unique_ptr<S>(SnapshotStore*)> make) {
  return [make](NodeId, MemorySnapshotStore& store) { return std::make_unique<ShimStack<S>>(make(&store), store); };
}

}  // namespace bftfs::sim
