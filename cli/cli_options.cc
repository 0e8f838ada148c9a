#include "cli/cli_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "cli/cli_common.h"
#include "common/assert.h"
#include "runtime/transport.h"

namespace bftfs::cli {
namespace {

// The help layout of every command: the usage line first, then what the command does, then one line per
// option (value name in the left column; description, "(required)" and the default in the right one). The
// root's list of commands shows the first line of each command's description.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(32); }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::ostringstream out;
    out << make_usage(app, name) << "\n" << make_description(app);
    out << make_positionals(app) << make_groups(app, mode) << make_subcommands(app, mode);
    const std::string footer = make_footer(app);
    if (!footer.empty()) out << "\n" << footer;
    return out.str();
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string& d = sub->get_description();
    std::ostringstream out;
    CLI::detail::format_help(out, sub->get_name(), d.substr(0, d.find('\n')), column_width_);
    return out.str();
  }

  std::string make_option_opts(const CLI::Option* opt) const override {
    if (opt->get_type_size() == 0 || opt->get_type_name().empty()) return "";
    return " " + opt->get_type_name();
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string d = opt->get_description();
    if (opt->get_required()) {
      d += " (required)";
    } else if (opt->get_type_size() != 0 && !opt->get_default_str().empty()) {
      d += " (default " + opt->get_default_str() + ")";
    }
    return d;
  }
};

// The chain of commands the parse reached ("cluster start"), and the app of the last one.
const CLI::App* deepest_command(const CLI::App& root, std::string& name) {
  const CLI::App* app = &root;
  name.clear();
  while (!app->get_subcommands().empty()) {
    app = app->get_subcommands().front();
    name += (name.empty() ? "" : " ") + app->get_name();
  }
  return app;
}

// The one-line message for a parse error. An argument the command does not know is named first (CLI11 would
// report a missing required option first, which hides the typo that caused it); where a command name was
// expected, it is an unknown command.
std::string describe(const CLI::ParseError& e, const CLI::App& app) {
  const bool expects_command =
      !app.get_subcommands([](const CLI::App*) { return true; }).empty() && app.get_subcommands().empty();
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());  // `bftfs run ... -- CMD` leaves it there
  // CLI11 names no option in the message of a hidden one (": why"): such an option's validator names itself.
  const std::string what = std::string(e.what()).rfind(": ", 0) == 0 ? std::string(e.what()).substr(2) : e.what();
  if (rest.empty()) return expects_command ? "a command is required" : what;
  const std::string& first = rest.front();
  if (first.rfind('-', 0) == 0 && first.size() > 1) return "unknown option " + first;
  return (expects_command ? "unknown command '" : "unexpected argument '") + first + "'";
}

// strtod over the whole of `text`; false if it is not a number.
bool read_number(const std::string& text, double& out) {
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return !text.empty() && end != nullptr && *end == '\0';
}

}  // namespace

void configure_root(CLI::App& root) {
  root.formatter(std::make_shared<HelpFormatter>());
  root.set_help_flag("-h,--help", "print this help and exit");
  root.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->always_capture_default();
  root.require_subcommand(1);
}

std::optional<int> parse_command_line(CLI::App& root, int argc, char** argv) {
  try {
    root.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(root.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::string name;
    const CLI::App* app = deepest_command(root, name);
    const std::string prefix = name.empty() ? "bftfs" : "bftfs " + name;
    std::fprintf(stderr, "%s: %s (see %s --help)\n", prefix.c_str(), describe(e, *app).c_str(), prefix.c_str());
    return kExitUsage;
  }
  return std::nullopt;
}

CLI::Validator decimal(std::uint64_t min, std::uint64_t max) {
  BFT_ASSERT(min <= max);
  return CLI::Validator(
      [min, max](std::string& v) -> std::string {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || v.size() > 19) {
          return "expected a non-negative integer, got '" + v + "'";
        }
        const std::uint64_t x = std::strtoull(v.c_str(), nullptr, 10);
        if (x < min || x > max) {
          return v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]";
        }
        v = std::to_string(x);
        return "";
      },
      "");
}

CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        double x = 0;
        if (!read_number(v, x) || !(x >= 0)) return "expected a non-negative number, got '" + v + "'";
        return "";
      },
      "");
}

CLI::Validator number_up_to(double max) {
  return CLI::Validator(
      [max](std::string& v) -> std::string {
        double x = 0;
        if (!read_number(v, x) || !(x >= 0) || x > max) {
          char range[64];
          std::snprintf(range, sizeof range, "[0, %g]", max);
          return std::string("expected a number in ") + range + ", got '" + v + "'";
        }
        return "";
      },
      "");
}

CLI::Validator fraction() { return number_up_to(1); }

CLI::Validator octal(std::uint32_t max) {
  return CLI::Validator(
      [max](std::string& v) -> std::string {
        char* end = nullptr;
        const unsigned long m = std::strtoul(v.c_str(), &end, 8);
        if (v.empty() || *end != '\0' || v[0] == '-' || v[0] == '+' || m > max) {
          return "expected octal permissions such as 0644, got '" + v + "'";
        }
        return "";
      },
      "");
}

CLI::Validator host_port() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        ReplicaAddress a;
        return parse_host_port(v, a);
      },
      "");
}

CLI::Validator one_of(std::vector<std::string> names) {
  return CLI::Validator(
      [names](std::string& v) -> std::string {
        if (std::find(names.begin(), names.end(), v) != names.end()) return "";
        std::string list;
        for (const std::string& n : names) list += (list.empty() ? "" : "|") + n;
        return "expected " + list + ", got '" + v + "'";
      },
      "");
}

CLI::Option* add_log_level(CLI::App& app, std::string& out, const std::string& help) {
  return app.add_option("--log-level", out, help)->type_name("LEVEL")->check(one_of({"debug", "info", "warn", "error"}));
}

LogLevel log_level_of(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  BFT_ASSERT(name == "error");
  return LogLevel::kError;
}

std::uint32_t octal_value(const std::string& text) {
  char* end = nullptr;
  const unsigned long m = std::strtoul(text.c_str(), &end, 8);
  BFT_ASSERT(!text.empty() && *end == '\0' && m <= 07777);
  return static_cast<std::uint32_t>(m);
}

void add_wan_options(CLI::App& app, WanArgs& out) {
  app.add_option("--wan-delay-ms", out.delay_ms,
                 "emulated one-way delay in ms between different sites, in [0, 10000]; 0 = LAN. Give every "
                 "process of a run the same --wan-* options")
      ->type_name("D")
      ->check([](const std::string& v) {
        double ms = 0;
        return parse_wan_delay_ms(v, ms);
      });
  app.add_option("--wan-site", out.sites,
                 "put NODE at SITE; a node not named is its own site (e.g. 4=0: client 4 at replica 0's site)")
      ->type_name("NODE=SITE,...")
      ->check([](const std::string& v) {
        std::map<NodeId, std::uint32_t> sites;
        return parse_wan_sites(v, sites);
      });
}

WanSpec wan_spec(const WanArgs& args) {
  WanSpec spec;
  const std::string delay_error = parse_wan_delay_ms(args.delay_ms, spec.delay_ms);
  BFT_ASSERT(delay_error.empty());
  if (!args.sites.empty()) {
    const std::string sites_error = parse_wan_sites(args.sites, spec.sites);
    BFT_ASSERT(sites_error.empty());
  }
  return spec;
}

std::vector<std::string> wan_arguments(const WanArgs& args) {
  std::vector<std::string> out = {"--wan-delay-ms", args.delay_ms};
  if (!args.sites.empty()) {
    out.push_back("--wan-site");
    out.push_back(args.sites);
  }
  return out;
}

}  // namespace bftfs::cli
