#include "runtime/service_factory.h"

#include "storage/disk_object_store.h"
#include "services/counter_service.h"
#include "services/fs/fs_service.h"
#include "shim/shim.h"
#include "services/null_service.h"

namespace bftfs {

std::unique_ptr<Service> make_service(const std::string& name, SnapshotStore* store) {
  if (name == "counter") return std::make_unique<CounterService>(store);
  if (name == "null") return std::make_unique<NullService>(store);
  // The file service (docs/FILESERVICE.md) with its state in memory, each checkpoint written whole through
  // `store` (tests; the replicas and NO-REP use make_service_stack, which puts it on disk).
  if (name == "fs") return std::make_unique<fs::FsService>(store);
  return nullptr;
}

const char* service_names() { return "counter|null|fs"; }

std::string make_service_stack(const std::string& name, SnapshotStore* store, const std::string& data_dir,
                               bool with_shim, std::uint32_t clients, ServiceStack& out) {
  out = ServiceStack{};
  if (name == "fs" && !data_dir.empty()) {
    // State larger than memory: values on disk, checksums apart, checkpoints as index versions (§6).
    const fs::FsOptions fo;
    DiskStoreOptions dso;
    dso.partitions = fo.partitions;
    std::unique_ptr<DiskObjectStore> disk;
    if (std::string err = DiskObjectStore::open(data_dir + "/fs", dso, disk); !err.empty()) {
      return "file service store: " + err;
    }
    out.inner = std::make_unique<fs::FsService>(std::move(disk), fo);
  } else {
    out.inner = make_service(name, store);
  }
  if (out.inner == nullptr) return "unknown service '" + name + "' (expected " + service_names() + ")";
  if (with_shim) {
    shim::ShimOptions so;
    so.clients_max = std::max<std::uint32_t>(clients, 1);
    out.shim = std::make_unique<shim::Shim>(*out.inner, store, so);
  }
  return "";
}

}  // namespace bftfs
