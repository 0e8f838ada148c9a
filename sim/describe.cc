// Message descriptions for the trace (describe.h).
#include "sim/describe.h"

#include <type_traits>
#include <variant>

#include "sim/strfmt.h"

namespace bftfs::sim {

std::string describe_batch(const Batch& b) {
  std::string out = " [";
  for (std::size_t i = 0; i < b.requests.size() && i < 6; ++i) {
    out += fmt("%sc%ur%llu", i == 0 ? "" : " ", b.requests[i].client, ull(b.requests[i].request_id));
  }
  if (b.requests.size() > 6) out += fmt(" +%zu", b.requests.size() - 6);
  return out + "]";
}

std::string describe(const Message& m) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Request>) {
          return fmt("REQUEST c%u r%llu%s", x.client, ull(x.request_id), x.read_only() ? " ro" : "");
        } else if constexpr (std::is_same_v<T, PrePrepare>) {
          return fmt("PRE-PREPARE v%llu s%llu", ull(x.view), ull(x.seq)) + describe_batch(x.batch);
        } else if constexpr (std::is_same_v<T, Prepare>) {
          return fmt("PREPARE v%llu s%llu %s", ull(x.view), ull(x.seq), x.digest.short_hex().c_str());
        } else if constexpr (std::is_same_v<T, Commit>) {
          return fmt("COMMIT v%llu s%llu %s", ull(x.view), ull(x.seq), x.digest.short_hex().c_str());
        } else if constexpr (std::is_same_v<T, Reply>) {
          return fmt("REPLY v%llu c%u r%llu flags=%x %s", ull(x.view), x.client, ull(x.request_id), x.flags,
                     x.result_digest.short_hex().c_str());
        } else if constexpr (std::is_same_v<T, Checkpoint>) {
          return fmt("CHECKPOINT s%llu %s", ull(x.seq), x.state_digest.short_hex().c_str());
        } else if constexpr (std::is_same_v<T, ViewChange>) {
          return fmt("VIEW-CHANGE v%llu r%u h=%llu C=%zu P=%zu Q=%zu", ull(x.new_view), x.replica,
                     ull(x.stable_seq), x.checkpoints.size(), x.prepared.size(), x.pre_prepared.size());
        } else if constexpr (std::is_same_v<T, NewView>) {
          return fmt("NEW-VIEW v%llu S=%zu", ull(x.view), x.view_changes.size());
        } else if constexpr (std::is_same_v<T, Status>) {
          return fmt("STATUS v%llu%s h=%llu e=%llu c=%llu", ull(x.view), x.in_view_change ? " vc" : "",
                     ull(x.stable_seq), ull(x.last_executed), ull(x.last_committed));
        } else if constexpr (std::is_same_v<T, FetchBatch>) {
          return fmt("FETCH-BATCH s%llu %s", ull(x.seq), x.digest.short_hex().c_str());
        } else if constexpr (std::is_same_v<T, BatchData>) {
          return fmt("BATCH-DATA s%llu", ull(x.seq)) + describe_batch(x.batch);
        } else if constexpr (std::is_same_v<T, FetchState>) {
          return fmt("FETCH-STATE s%llu l%u i%llu", ull(x.checkpoint_seq), x.level, ull(x.index));
        } else if constexpr (std::is_same_v<T, StateNode>) {
          return fmt("STATE-NODE s%llu l%u i%llu n=%zu", ull(x.checkpoint_seq), x.level, ull(x.index),
                     x.children.size());
        } else {
          return fmt("STATE-LEAF s%llu i%llu %zuB", ull(x.checkpoint_seq), ull(x.index), x.data.size());
        }
      },
      m);
}

}  // namespace bftfs::sim
