#include "replica/service_factory.h"

#include "services/counter_service.h"
#include "services/fs/fs_service.h"
#include "shim/shim.h"
#include "services/null_service.h"

namespace bftfs {

std::unique_ptr<Service> make_service(const std::string& name, SnapshotStore* store) {
  if (name == "counter") return std::make_unique<CounterService>(store);
  if (name == "null") return std::make_unique<NullService>(store);
  // The file service (docs/FILESERVICE.md). Until its disk-backed store exists it keeps every object in memory
  // and writes each checkpoint whole through `store`; run it behind the shim (--shim).
  if (name == "fs") return std::make_unique<fs::FsService>(store);
  return nullptr;
}

const char* service_names() { return "counter|null|fs"; }

std::string make_service_stack(const std::string& name, SnapshotStore* store, bool with_shim, std::uint32_t clients,
                               ServiceStack& out) {
  out = ServiceStack{};
  out.inner = make_service(name, store);
  if (out.inner == nullptr) return "unknown service '" + name + "' (expected " + service_names() + ")";
  if (with_shim) {
    shim::ShimOptions so;
    so.clients_max = std::max<std::uint32_t>(clients, 1);
    out.shim = std::make_unique<shim::Shim>(*out.inner, store, so);
  }
  return "";
}

}  // namespace bftfs
