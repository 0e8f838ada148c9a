#include "cli/cli_common.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace bftfs::cli {

void error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "bftfs %s: %s\n", command.c_str(), message.c_str());
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "bftfs";
  buf[n] = '\0';
  return buf;
}

double percentile_us(std::vector<std::uint64_t>& ns, double q) {
  if (ns.empty()) return 0;
  const std::size_t k = std::min(ns.size() - 1, static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1) + 0.5));
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(k), ns.end());
  return static_cast<double>(ns[k]) / 1e3;
}

}  // namespace bftfs::cli
