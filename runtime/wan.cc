#include "runtime/wan.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace bftfs {
namespace {

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// A decimal number below 2^32 ("what" names it in the error). Returns "" or the reason.
std::string parse_u32(const std::string& text, const char* what, const std::string& item, std::uint32_t& out) {
  if (text.empty()) return std::string("'") + item + "': missing " + what;
  if (!all_digits(text)) return std::string("'") + item + "': " + what + " '" + text + "' is not a decimal number";
  if (text.size() > 10) return std::string("'") + item + "': " + what + " " + text + " is out of range (< 2^32)";
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (v > UINT32_MAX) return std::string("'") + item + "': " + what + " " + text + " is out of range (< 2^32)";
  out = static_cast<std::uint32_t>(v);
  return "";
}

}  // namespace

std::uint32_t WanSpec::site(NodeId node) const {
  auto it = sites.find(node);
  return it == sites.end() ? node : it->second;
}

std::uint64_t WanSpec::site_delay_ns() const {
  return enabled() ? static_cast<std::uint64_t>(std::llround(delay_ms * 1e6)) : 0;
}

std::uint64_t WanSpec::delay_ns(NodeId from, NodeId to) const {
  return site(from) == site(to) ? 0 : site_delay_ns();
}

std::string WanSpec::describe() const {
  if (!enabled()) return "LAN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g ms one-way between sites", delay_ms);
  std::string s = buf;
  if (!sites.empty()) s += "; sites " + format_wan_sites(sites);
  return s;
}

std::string parse_wan_delay_ms(const std::string& text, double& out) {
  if (text.empty()) return "empty delay (expected milliseconds, e.g. 2.5)";
  const auto dot = text.find('.');
  const std::string whole = text.substr(0, dot);
  const std::string frac = dot == std::string::npos ? "0" : text.substr(dot + 1);
  if (!all_digits(whole) || !all_digits(frac)) {
    return "'" + text + "' is not a delay in milliseconds (expected digits with an optional fraction, e.g. 2.5)";
  }
  if (whole.size() > 9) return "'" + text + "' is out of range [0, " + std::to_string(static_cast<int>(kWanDelayMsMax)) + "] ms";
  const double v = std::strtod(text.c_str(), nullptr);
  if (!(v >= 0) || v > kWanDelayMsMax) {
    return "'" + text + "' is out of range [0, " + std::to_string(static_cast<int>(kWanDelayMsMax)) + "] ms";
  }
  out = v;
  return "";
}

std::string parse_wan_sites(const std::string& text, std::map<NodeId, std::uint32_t>& out) {
  if (text.empty()) return "empty site list (expected NODE=SITE[,NODE=SITE...])";
  std::map<NodeId, std::uint32_t> sites;
  std::size_t start = 0;
  for (;;) {
    const auto comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) return "empty item in '" + text + "' (expected NODE=SITE[,NODE=SITE...])";
    const auto eq = item.find('=');
    if (eq == std::string::npos) return "'" + item + "': expected NODE=SITE";
    std::uint32_t node = 0;
    std::uint32_t site = 0;
    if (std::string err = parse_u32(item.substr(0, eq), "node", item, node); !err.empty()) return err;
    if (std::string err = parse_u32(item.substr(eq + 1), "site", item, site); !err.empty()) return err;
    if (!sites.emplace(node, site).second) return "node " + std::to_string(node) + " is given more than once";
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  out = std::move(sites);
  return "";
}

std::string format_wan_sites(const std::map<NodeId, std::uint32_t>& sites) {
  std::string s;
  for (const auto& [node, site] : sites) {
    if (!s.empty()) s += ',';
    s += std::to_string(node) + "=" + std::to_string(site);
  }
  return s;
}

}  // namespace bftfs
