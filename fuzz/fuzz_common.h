// Shared by the libFuzzer harnesses and the seed-corpus generator: the fixed cluster the frame harness
// authenticates against, the per-type target names, and how a harness reports a broken invariant.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string_view>

#include "common/crypto.h"
#include "protocol/messages.h"

namespace bftfs::fuzz {

// n for every decoder under fuzzing: requests carry exactly this many MACs.
inline constexpr std::uint32_t kReplicas = 4;
// Nodes of the frame harness's cluster: replicas 0..3 and clients 4..7.
inline constexpr NodeId kNodes = 8;
// A sender id no node knows (no session key), for the unknown-sender path.
inline constexpr NodeId kUnknownNode = 100;

// The name suffix of the body target of each MsgType (fuzz_body_<name>); index = MsgType value - 1. Must list
// the same names, in the same order, as BODY_TYPES in fuzz/CMakeLists.txt.
inline constexpr std::string_view kBodyTargetNames[] = {
    "request", "pre_prepare", "prepare", "commit", "reply", "checkpoint", "view_change",
    "new_view", "status", "fetch_batch", "batch_data", "fetch_state", "state_node", "state_leaf"};
static_assert(std::size(kBodyTargetNames) == static_cast<std::size_t>(MsgType::kStateLeaf));

// A broken invariant in a harness: print what and abort, which libFuzzer reports as a crash with the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
  std::abort();
}

// Deterministic keys for kNodes nodes, and one Crypto per node.
struct Cluster {
  std::map<NodeId, PublicKeys> pub;
  std::map<NodeId, SecretKeys> sec;
  std::map<NodeId, std::unique_ptr<Crypto>> nodes;
  Cluster() {
    for (NodeId id = 0; id < kNodes; ++id) generate_keys_from_seed(0xF022, id, pub[id], sec[id]);
    for (NodeId id = 0; id < kNodes; ++id) nodes[id] = std::make_unique<Crypto>(id, sec[id], pub);
  }
  const Crypto& at(NodeId id) const { return *nodes.at(id); }
};

inline const Cluster& cluster() {
  static const Cluster c;
  return c;
}

}  // namespace bftfs::fuzz
