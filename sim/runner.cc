// Running seeds in forked children (simulator.h: run_isolated, run_many) and the regression-seed file format.
//
// Forking is fine here because a run is pure computation: a child inherits nothing it could share with its
// siblings but the code. It lets an assertion that aborts inside a core fail one seed instead of the whole
// sweep, and lets two cores work on seeds at once.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/assert.h"
#include "sim/simulator.h"

#ifndef BFTFS_SOURCE_DIR
#define BFTFS_SOURCE_DIR "."
#endif

namespace bftfs::sim {

namespace {

void put_string(std::string& out, const std::string& s) {
  const std::uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(s);
}

bool get_string(const std::string& in, std::size_t& pos, std::string& s) {
  std::uint64_t n = 0;
  if (in.size() - pos < sizeof n) return false;
  std::memcpy(&n, in.data() + pos, sizeof n);
  pos += sizeof n;
  if (in.size() - pos < n) return false;
  s.assign(in, pos, n);
  pos += n;
  return true;
}

// The child's result, as bytes: SimStats is plain data and both ends are the same binary.
std::string serialize(const SimResult& r) {
  std::string out;
  out.append(reinterpret_cast<const char*>(&r.seed), sizeof r.seed);
  const char passed = r.passed ? 1 : 0;
  out.push_back(passed);
  out.append(reinterpret_cast<const char*>(&r.stats), sizeof r.stats);
  put_string(out, r.failure);
  put_string(out, r.scenario);
  return out;
}

bool deserialize(const std::string& in, SimResult& r) {
  std::size_t pos = 0;
  if (in.size() < sizeof r.seed + 1 + sizeof r.stats) return false;
  std::memcpy(&r.seed, in.data(), sizeof r.seed);
  pos += sizeof r.seed;
  r.passed = in[pos] != 0;
  pos += 1;
  std::memcpy(&r.stats, in.data() + pos, sizeof r.stats);
  pos += sizeof r.stats;
  return get_string(in, pos, r.failure) && get_string(in, pos, r.scenario) && pos == in.size();
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::size_t index = 0;
  std::string data;
};

Child spawn(const SimConfig& config, std::size_t index) {
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  BFT_ASSERT(pipe(fds) == 0);
  const pid_t pid = fork();
  BFT_ASSERT(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    const SimResult r = run_simulation(config);
    const std::string bytes = serialize(r);
    std::size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t w = write(fds[1], bytes.data() + off, bytes.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) _exit(3);
      off += static_cast<std::size_t>(w);
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(r.passed ? 0 : 1);
  }
  close(fds[1]);
  Child c;
  c.pid = pid;
  c.fd = fds[0];
  c.index = index;
  return c;
}

// Reads what is available; true at end of file.
bool read_some(Child& c) {
  char buf[65536];
  for (;;) {
    const ssize_t n = read(c.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    c.data.append(buf, static_cast<std::size_t>(n));
    return false;
  }
}

SimResult reap(Child& c, const SimConfig& config) {
  close(c.fd);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  SimResult r;
  if (deserialize(c.data, r)) return r;
  r.seed = config.seed;
  r.passed = false;
  if (WIFSIGNALED(status)) {
    r.failure = "FAIL seed=" + std::to_string(config.seed) + ": the run died of signal " +
                std::to_string(WTERMSIG(status)) +
                " (an assertion in a core or in the simulator; its message and the last events are on stderr)";
  } else {
    r.failure = "FAIL seed=" + std::to_string(config.seed) + ": the run exited with status " +
                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + " without a result";
  }
  return r;
}

}  // namespace

SimResult run_isolated(const SimConfig& config) {
  Child c = spawn(config, 0);
  while (!read_some(c)) {
  }
  return reap(c, config);
}

std::vector<SimResult> run_many(const std::vector<SimConfig>& configs, unsigned jobs,
                                const std::function<void(const SimResult&)>& done) {
  if (jobs == 0) jobs = 1;
  std::vector<SimResult> results(configs.size());
  std::vector<Child> running;
  std::size_t next = 0;
  while (next < configs.size() || !running.empty()) {
    while (running.size() < jobs && next < configs.size()) {
      running.push_back(spawn(configs[next], next));
      ++next;
    }
    std::vector<pollfd> fds;
    for (const auto& c : running) fds.push_back(pollfd{c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      BFT_ASSERT(errno == EINTR);
      continue;
    }
    for (std::size_t i = running.size(); i-- > 0;) {
      if (fds[i].revents == 0) continue;
      if (!read_some(running[i])) continue;
      Child c = std::move(running[i]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      results[c.index] = reap(c, configs[c.index]);
      if (done) done(results[c.index]);
    }
  }
  return results;
}

bool parse_regression_line(const std::string& line, SimConfig& out, bool& empty, std::string& error) {
  const std::string text = line.substr(0, line.find('#'));
  std::istringstream in(text);
  std::string word;
  empty = true;
  if (!(in >> word)) return true;
  empty = false;
  SimConfig c;
  char* end = nullptr;
  c.seed = std::strtoull(word.c_str(), &end, 10);
  if (end == word.c_str() || *end != '\0') {
    error = "not a seed: '" + word + "'";
    return false;
  }
  while (in >> word) {
    const auto eq = word.find('=');
    if (eq == std::string::npos) {
      error = "expected key=value, got '" + word + "'";
      return false;
    }
    const std::string key = word.substr(0, eq);
    const std::string value = word.substr(eq + 1);
    const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    const bool numeric = !value.empty() && *end == '\0';
    if (key == "f" && numeric && v >= 1 && v <= 21) {
      c.f = static_cast<std::uint32_t>(v);
    } else if (key == "ticks" && numeric && v > 0) {
      c.fault_ticks = v;
    } else if (key == "scenario" && !value.empty()) {
      c.scenario = value;
    } else if (key == "service" && (value == "counter" || value == "null" || value == "fs")) {
      c.service = value;
    } else if (key == "byzantine" && numeric && v <= 1) {
      c.byzantine = v == 1;
    } else if (key == "cs" && numeric && v <= 1) {
      c.speculation = static_cast<int>(v);
    } else {
      error = "bad option '" + word + "'";
      return false;
    }
  }
  out = c;
  return true;
}

std::string read_regression_seeds(const std::string& path, std::vector<SimConfig>& out) {
  std::ifstream in(path);
  if (!in) return path + ": cannot read";
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    SimConfig c;
    bool empty = false;
    std::string error;
    if (!parse_regression_line(line, c, empty, error)) return path + ":" + std::to_string(lineno) + ": " + error;
    if (empty) continue;
    if (std::string bad = check_config(c); !bad.empty()) return path + ":" + std::to_string(lineno) + ": " + bad;
    out.push_back(c);
  }
  return "";
}

std::string regression_seeds_path() { return std::string(BFTFS_SOURCE_DIR) + "/sim/regression-seeds.txt"; }

}  // namespace bftfs::sim
