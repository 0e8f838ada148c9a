// Wide-area latency emulated in user space (this kernel has no sch_netem), for the PBFT-CS evaluation setup
// (NSDI'09 §6): nodes live at "sites"; traffic between two different sites gets one fixed one-way delay, traffic
// inside a site none. The transport applies it (runtime/transport.h, "WAN emulation").
//
// Sites. site(node) is sites[node] when given, else the node id itself, so by default every node is its own
// site. Site numbers share the node-id space on purpose: "client 4 at replica 0's site" is `4=0`. The paper's
// topologies with the primary of view 0 (replica 0) and client 4:
//   LAN             delay 0
//   uniform         a delay, no sites given (the client is at a site of its own, equally far from everyone)
//   primary-local   a delay, sites {4: 0}
//   primary-remote  a delay, sites {4: 1}
// The NO-REP server authenticates as replica 0, so it is at node 0's site. Every process of a run must be given
// the same spec (each one delays only what it sends, so a mismatch makes the two directions of a link differ).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/types.h"

namespace bftfs {

inline constexpr double kWanDelayMsMax = 10000;

struct WanSpec {
  double delay_ms = 0;                       // one-way delay between two different sites; 0 = LAN
  std::map<NodeId, std::uint32_t> sites;     // node -> site; nodes not named are their own site

  std::uint32_t site(NodeId node) const;
  // The one-way delay between two different sites in nanoseconds (0 when disabled).
  std::uint64_t site_delay_ns() const;
  // The one-way delay from `from` to `to` in nanoseconds: 0 within a site or without a delay.
  std::uint64_t delay_ns(NodeId from, NodeId to) const;
  bool enabled() const { return delay_ms > 0; }
  // "LAN", or e.g. "15 ms one-way between sites; sites 4=0", for logs.
  std::string describe() const;
};

// Parses a delay in milliseconds: decimal digits with an optional fraction ("15", "2.5"), in
// [0, kWanDelayMsMax]. No sign, exponent, hex, inf or nan. Returns "" or the reason it is rejected.
[[nodiscard]] std::string parse_wan_delay_ms(const std::string& text, double& out);
// Parses "NODE=SITE[,NODE=SITE...]": decimal numbers below 2^32, no empty items, no blanks, each node at most
// once. Returns "" (and replaces `out`) or the reason it is rejected (and leaves `out` alone).
[[nodiscard]] std::string parse_wan_sites(const std::string& text, std::map<NodeId, std::uint32_t>& out);
// The inverse of parse_wan_sites ("" for none), for passing a spec on to child processes.
std::string format_wan_sites(const std::map<NodeId, std::uint32_t>& sites);

}  // namespace bftfs
