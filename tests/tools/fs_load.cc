// fs_load: a test and benchmark client for the file service on a replica cluster (replicas started with
// `bftfs replica --service fs --shim`). It is not the file system client (that is the relay and the FUSE mount):
// it submits file-service compounds (services/fs/fs_codec.h) in the shim's envelope through the PBFT client
// runtime, one at a time, and checks every result.
//
//   fs_load --config C --id CLIENT --mode write  --prefix P (--files N | --duration-s S) --file-bytes B
//   fs_load --config C --id CLIENT --mode verify --prefix P --files N --file-bytes B
//
// write: creates (or overwrites) P0, P1, ... under the root, each holding pattern(P, i) of B bytes (one
// compound: create, then write through a result reference). verify: reads each back (B <= 512 KiB) and compares.
// Progress on stderr once a second; a JSON summary on stdout. Exit 0 on success, 1 on a wrong result or a
// timeout, 2 on bad usage (or when the client cannot be set up). `fs_load --help` lists the options.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "common/log.h"
#include "runtime/client_runtime.h"
#include "runtime/event_raii.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "shim/envelope.h"

using namespace bftfs;

namespace {

// The bytes of file i of `prefix`: an xorshift64 stream seeded from both (benchmarks/bench_fs_recovery.py
// computes the same stream to find a file's bytes in a data file).
Bytes pattern(const std::string& prefix, std::uint64_t i, std::size_t size) {
  std::uint64_t x = 0x9E3779B97F4A7C15ull ^ (i + 1);
  for (char c : prefix) x = (x ^ static_cast<std::uint8_t>(c)) * 0x100000001B3ull;
  if (x == 0) x = 1;
  Bytes b(size);
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<std::uint8_t>(x);
  }
  return b;
}

fs::Op make_op(fs::OpCode code) {
  fs::Op o;
  o.code = code;
  o.cred = fs::Cred{0, 0, {}};
  return o;
}

struct LoadArgs {
  std::string config;
  std::uint32_t id = 0;
  std::string mode;  // write | verify
  std::string prefix = "f";
  std::optional<std::uint64_t> files;  // none: write for --duration-s
  double duration_s = 0;
  std::uint32_t file_bytes = 4096;
  double timeout_s = 60;
};

// Parses the command line into `a`. Returns nullopt to go on, or the exit code (0 after --help, 2 after a usage
// error, printed on one line).
std::optional<int> parse_args(int argc, char** argv, LoadArgs& a) {
  CLI::App app("A file-service load client for tests and benchmarks (tests/tools/fs_load.cc).", "fs_load");
  app.option_defaults()->always_capture_default();
  app.add_option("--config", a.config, "cluster.conf of the replicas")->required();
  app.add_option("--id", a.id, "the client id to use")->required();
  app.add_option("--mode", a.mode, "write the files, or verify their content")->required()
      ->check(CLI::IsMember({"write", "verify"}));
  app.add_option("--prefix", a.prefix, "file i is named <prefix><i>, under the root");
  app.add_option("--files", a.files, "how many files (without it, write for --duration-s)");
  app.add_option("--duration-s", a.duration_s, "write: seconds to keep writing when --files is not given")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--file-bytes", a.file_bytes, "bytes per file")->check(CLI::Range(0, 512 * 1024));
  app.add_option("--timeout-s", a.timeout_s, "give up on a request after this many seconds")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fs_load: %s (see fs_load --help)\n", e.what());
    return 2;
  }
  if (!a.files && (a.mode == "verify" || a.duration_s <= 0)) {
    std::fprintf(stderr, "fs_load: --files is required (or, to write, --duration-s)\n");
    return 2;
  }
  return std::nullopt;
}

// The compound request for file `name`: create (or open) and write `data`, or look up and read it back.
fs::Request file_request(const LoadArgs& a, const std::string& name, const Bytes& data, bool& read_only) {
  fs::Request req;
  read_only = a.mode == "verify";
  fs::Op first = make_op(read_only ? fs::OpCode::kLookup : fs::OpCode::kCreate);
  first.handle = fs::Handle::of(fs::kRootIno, 1);
  first.name = name;
  if (!read_only) {
    first.mode = 0644;
    first.exclusive = false;  // an existing file is returned (and overwritten by write)
  }
  req.ops.push_back(first);
  fs::Op second = make_op(read_only ? fs::OpCode::kRead : fs::OpCode::kWrite);
  second.handle = fs::Handle::result_of(0);
  if (read_only) {
    second.count = static_cast<std::uint32_t>(data.size());
  } else {
    second.data = data;
  }
  req.ops.push_back(second);
  return req;
}

// Submits one request and runs the loop until its result arrives or `timeout_s` passes.
std::optional<Bytes> submit_and_wait(event_base* base, ClientRuntime& client, const fs::Request& req,
                                     bool read_only, double timeout_s) {
  std::optional<Bytes> out;
  client.submit(shim::encode_envelope({}, fs::encode_request(req)), read_only,
                [&](const Completion& c) { out = c.result; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!out && std::chrono::steady_clock::now() < deadline) {
    timeval tv{0, 1000};
    event_base_loopexit(base, &tv);
    event_base_loop(base, 0);
  }
  return out;
}

// Checks the result of file `name`'s request; returns "" or what is wrong.
std::string check_result(const LoadArgs& a, const Bytes& result, const Bytes& data) {
  shim::ShimResult sr;
  fs::Result res;
  if (!shim::decode_envelope_result(result, sr) || sr.status != shim::ShimStatus::kExecuted ||
      fs::decode_result(sr.inner, res) != fs::FsDecodeError::kOk || res.outcome != fs::Outcome::kDone ||
      res.results.size() != 2) {
    return "the request failed";
  }
  if (a.mode == "verify" && res.results[1].data != data) return "WRONG CONTENT";
  return "";
}

// Writes or verifies the files one request at a time. Returns the exit code.
int run_load(const LoadArgs& a, event_base* base, ClientRuntime& client) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double last_progress = 0;
  std::uint64_t done = 0;
  for (std::uint64_t i = 0;; ++i) {
    if (a.files && i >= *a.files) break;
    if (!a.files && elapsed() >= a.duration_s) break;
    const std::string name = a.prefix + std::to_string(i);
    const Bytes data = pattern(a.prefix, i, a.file_bytes);
    bool read_only = false;
    const fs::Request req = file_request(a, name, data, read_only);
    const std::optional<Bytes> out = submit_and_wait(base, client, req, read_only, a.timeout_s);
    if (!out) {
      std::fprintf(stderr, "fs_load: %s: no result within %.0f s\n", name.c_str(), a.timeout_s);
      return 1;
    }
    if (std::string err = check_result(a, *out, data); !err.empty()) {
      std::fprintf(stderr, "fs_load: %s: %s\n", name.c_str(), err.c_str());
      return 1;
    }
    ++done;
    if (elapsed() - last_progress >= 1.0) {
      last_progress = elapsed();
      std::fprintf(stderr, "fs_load: %llu done\n", static_cast<unsigned long long>(done));
    }
  }
  const double secs = elapsed();
  std::printf("{\"mode\": \"%s\", \"files\": %llu, \"file_bytes\": %lld, \"seconds\": %.3f, \"ops_per_s\": %.1f}\n",
              a.mode.c_str(), static_cast<unsigned long long>(done), static_cast<long long>(a.file_bytes), secs,
              secs > 0 ? static_cast<double>(done) / secs : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  LoadArgs a;
  if (const auto rc = parse_args(argc, argv, a)) return *rc;
  log_set_level(LogLevel::kWarn);
  EventBasePtr base = make_event_base();
  std::unique_ptr<ClientRuntime> client;
  ClientOptions co;
  co.first_request_id = fresh_first_request_id();
  if (std::string err = ClientRuntime::create(base.get(), a.config, static_cast<NodeId>(a.id), co, client);
      !err.empty()) {
    std::fprintf(stderr, "fs_load: %s\n", err.c_str());
    return 2;
  }
  return run_load(a, base.get(), *client);
}
