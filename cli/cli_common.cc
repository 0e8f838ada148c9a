#include <algorithm>
#include "cli/cli_common.h"

#include "common/log.h"

#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace bftfs::cli {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {
  flag("help", "print this help and exit");
}

ArgParser& ArgParser::option(const std::string& name, const std::string& value_name, const std::string& help,
                             const std::string& def) {
  specs_.push_back(Spec{name, value_name, help, def, false});
  return *this;
}

ArgParser& ArgParser::flag(const std::string& name, const std::string& help) {
  specs_.push_back(Spec{name, "", help, "", false});
  return *this;
}

ArgParser& ArgParser::required(const std::string& name) {
  for (auto& s : specs_) {
    if (s.name == name) s.required = true;
  }
  return *this;
}

std::string ArgParser::usage() const {
  std::ostringstream o;
  o << "usage: bftfs " << command_;
  for (const auto& s : specs_) {
    if (s.required) o << " --" << s.name << " " << s.value_name;
  }
  o << " [options]\n\n" << summary_ << "\n\noptions:\n";
  for (const auto& s : specs_) {
    std::string left = "  --" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    if (left.size() < 28) left.resize(28, ' ');
    o << left << " " << s.help;
    if (s.required) o << " (required)";
    if (!s.def.empty()) o << " (default " << s.def << ")";
    o << "\n";
  }
  return o.str();
}

std::optional<int> ArgParser::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h") a = "--help";
    if (a.rfind("--", 0) != 0) {
      error(command_, "unexpected argument '" + a + "' (see --help)");
      return kExitUsage;
    }
    std::string name = a.substr(2);
    std::string value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const Spec* spec = nullptr;
    for (const auto& s : specs_) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      error(command_, "unknown option --" + name + " (see --help)");
      return kExitUsage;
    }
    if (spec->value_name.empty()) {
      if (inline_value) {
        error(command_, "--" + name + " takes no value");
        return kExitUsage;
      }
      values_[name] = "1";
    } else {
      if (!inline_value) {
        if (i + 1 >= argc) {
          error(command_, "--" + name + " needs a value " + spec->value_name);
          return kExitUsage;
        }
        value = argv[++i];
      }
      values_[name] = value;
    }
  }
  if (has("help")) {
    std::fputs(usage().c_str(), stdout);
    return kExitOk;
  }
  for (const auto& s : specs_) {
    if (s.required && values_.count(s.name) == 0) {
      error(command_, "missing --" + s.name + " (see --help)");
      return kExitUsage;
    }
  }
  return std::nullopt;
}

bool ArgParser::has(const std::string& name) const {
  if (values_.count(name) != 0) return true;
  for (const auto& s : specs_) {
    if (s.name == name && !s.def.empty()) return true;
  }
  return false;
}

std::string ArgParser::get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  for (const auto& s : specs_) {
    if (s.name == name) return s.def;
  }
  return "";
}

std::uint64_t ArgParser::get_u64(const std::string& name, bool& ok, std::uint64_t min, std::uint64_t max) const {
  const std::string v = get(name);
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19) {
    error(command_, "--" + name + ": expected a non-negative integer, got '" + v + "'");
    ok = false;
    return 0;
  }
  const std::uint64_t x = std::strtoull(v.c_str(), nullptr, 10);
  if (x < min || x > max) {
    error(command_, "--" + name + ": " + v + " is out of range [" + std::to_string(min) + ", " +
                        std::to_string(max) + "]");
    ok = false;
    return 0;
  }
  return x;
}

double ArgParser::get_double(const std::string& name, bool& ok) const {
  const std::string v = get(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end == nullptr || *end != '\0' || !(x >= 0)) {
    error(command_, "--" + name + ": expected a non-negative number, got '" + v + "'");
    ok = false;
    return 0;
  }
  return x;
}

void add_wan_options(ArgParser& p) {
  p.option("wan-delay-ms", "D",
           "emulated one-way delay in ms between different sites, in [0, 10000]; 0 = LAN. Give every process of a "
           "run the same --wan-* options",
           "0");
  p.option("wan-site", "NODE=SITE,...",
           "put NODE at SITE; a node not named is its own site (e.g. 4=0: client 4 at replica 0's site)");
}

bool get_wan_options(const ArgParser& p, WanSpec& out) {
  WanSpec spec;
  if (std::string err = parse_wan_delay_ms(p.get("wan-delay-ms"), spec.delay_ms); !err.empty()) {
    error(p.command(), "--wan-delay-ms: " + err);
    return false;
  }
  if (p.has("wan-site")) {
    if (std::string err = parse_wan_sites(p.get("wan-site"), spec.sites); !err.empty()) {
      error(p.command(), "--wan-site: " + err);
      return false;
    }
  }
  out = std::move(spec);
  return true;
}

std::vector<std::string> wan_arguments(const ArgParser& p) {
  std::vector<std::string> args = {"--wan-delay-ms", p.get("wan-delay-ms")};
  if (p.has("wan-site")) {
    args.push_back("--wan-site");
    args.push_back(p.get("wan-site"));
  }
  return args;
}

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

bool set_log_level(const std::string& command, const std::string& level) {
  if (level == "debug") {
    log_set_level(LogLevel::kDebug);
  } else if (level == "info") {
    log_set_level(LogLevel::kInfo);
  } else if (level == "warn") {
    log_set_level(LogLevel::kWarn);
  } else if (level == "error") {
    log_set_level(LogLevel::kError);
  } else {
    error(command, "--log-level: expected debug|info|warn|error, got '" + level + "'");
    return false;
  }
  return true;
}


}  // namespace bftfs::cli
