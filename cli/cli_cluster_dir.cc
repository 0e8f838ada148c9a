#include "cli/cli_cluster_dir.h"

#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <fstream>
#include <sstream>

namespace bftfs::cli {

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  if (!(in >> pid) || pid <= 0) return 0;
  return static_cast<pid_t>(pid);
}

bool is_our_process(pid_t pid, const char* role) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cmd = ss.str();
  for (auto& c : cmd) {
    if (c == '\0') c = ' ';
  }
  return cmd.find("bftfs") != std::string::npos && cmd.find(std::string(" ") + role + " ") != std::string::npos;
}

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

}  // namespace bftfs::cli
