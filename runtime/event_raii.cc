#include "runtime/event_raii.h"

namespace bftfs {

EventBasePtr make_event_base(bool precise_timer) {
  EventConfigPtr config(event_config_new());
  if (config == nullptr) return nullptr;
  if (precise_timer && event_config_set_flag(config.get(), EVENT_BASE_FLAG_PRECISE_TIMER) != 0) return nullptr;
  EventBasePtr base(event_base_new_with_config(config.get()));
  if (base == nullptr) return nullptr;
  if (event_base_priority_init(base.get(), kPriorityCount) != 0) return nullptr;
  return base;
}

}  // namespace bftfs
