#include "replica/service_factory.h"

#include "services/counter_service.h"
#include "services/null_service.h"

namespace bftfs {

std::unique_ptr<Service> make_service(const std::string& name, SnapshotStore* store) {
  if (name == "counter") return std::make_unique<CounterService>(store);
  if (name == "null") return std::make_unique<NullService>(store);
  return nullptr;
}

const char* service_names() { return "counter|null"; }

}  // namespace bftfs
