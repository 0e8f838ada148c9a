// The services a daemon can run, by name ("counter", "null").
#pragma once

#include <memory>
#include <string>

#include "protocol/service.h"

namespace bftfs {

// Makes service `name` over `store` (may be null: no durability). Returns null for an unknown name.
std::unique_ptr<Service> make_service(const std::string& name, SnapshotStore* store);
// "counter|null", for --help texts and errors.
const char* service_names();

}  // namespace bftfs
