// The PBFT-CS client library (relay/spec_client.h) on a libevent loop: connected to every replica, ticking
// every millisecond, delivering each operation's events (first reply, then commit or rollback) to a callback.
// Replicas must run the shim (`--shim`) for the operations to mean anything; with early replies (`--early-replies`)
// the first reply is the primary's speculative one (NSDI'09 §3.1).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "relay/spec_client.h"
#include "runtime/client_runtime.h"
#include "runtime/wan.h"

namespace bftfs {

class SpecClientRuntime {
 public:
  // Called for every event of one operation: at most one kFirst, then exactly one kCommit or kRollback.
  using Callback = std::function<void(const SpecEvent&)>;

  // `options.client.n`/`f` are taken from the configuration. `base` must outlive the client. `wan` as for
  // ClientRuntime::create.
  [[nodiscard]] static std::string create(event_base* base, const std::string& config_path, NodeId id,
                                          SpecClientOptions options, std::unique_ptr<SpecClientRuntime>& out,
                                          const WanSpec& wan = {});
  ~SpecClientRuntime();
  SpecClientRuntime(const SpecClientRuntime&) = delete;
  SpecClientRuntime& operator=(const SpecClientRuntime&) = delete;

  // See SpecClient::submit for the preconditions on `depends_on`. The callback may submit.
  std::uint64_t submit(Bytes op, std::span<const SpecDependency> depends_on, bool read_only, Callback cb);
  std::size_t in_flight() const { return core_->in_flight(); }
  NodeId id() const { return link_->id(); }
  const SpecClientStats& stats() const { return core_->stats(); }
  const ClientStats& client_stats() const { return core_->client_stats(); }
  bool trusts(NodeId replica) const { return core_->trusts(replica); }
  std::uint64_t first_compared(NodeId replica) const { return core_->first_compared(replica); }
  std::uint64_t first_mismatched(NodeId replica) const { return core_->first_mismatched(replica); }

 private:
  SpecClientRuntime() = default;
  void drain();
  std::unique_ptr<SpecClient> core_;  // refers to link_'s crypto: the destructor destroys it first
  std::unique_ptr<ClientLink> link_;
  std::map<std::uint64_t, Callback> callbacks_;
  bool draining_ = false;
};

}  // namespace bftfs
