#include "replica/event_raii.h"

namespace bftfs {

EventBasePtr make_event_base() {
  EventBasePtr base(event_base_new());
  if (base == nullptr) return nullptr;
  if (event_base_priority_init(base.get(), kPriorityCount) != 0) return nullptr;
  return base;
}

}  // namespace bftfs
