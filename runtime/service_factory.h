// The services a daemon can run, by name ("counter", "null", "fs").
#pragma once

#include <memory>
#include <string>

#include "protocol/service.h"

namespace bftfs {

// Makes service `name` over `store` (may be null: no durability). Returns null for an unknown name.
std::unique_ptr<Service> make_service(const std::string& name, SnapshotStore* store);

// A service as the replicas run it: the named service, optionally behind the PBFT-CS shim (shim/shim.h), which
// evaluates the predicates of speculative requests (NSDI'09 §3.2, §5). `top` is what the engine executes; it is
// destroyed before `inner`, which it wraps.
struct ServiceStack {
  std::unique_ptr<Service> inner;
  std::unique_ptr<Service> shim;  // null without the shim
  Service* top() const { return shim ? shim.get() : inner.get(); }
};
// Returns "" or an error (an unknown name, a data directory the service cannot use). `clients` bounds the
// clients whose results the shim logs. `data_dir` (may be empty: state in memory) is the replica's data
// directory: the file service keeps its state on disk in <data_dir>/fs (storage/disk_object_store.h); the
// other services checkpoint through `store`.
[[nodiscard]] std::string make_service_stack(const std::string& name, SnapshotStore* store,
                                             const std::string& data_dir, bool with_shim, std::uint32_t clients,
                                             ServiceStack& out);
// "counter|null|fs", for --help texts and errors.
const char* service_names();

}  // namespace bftfs
