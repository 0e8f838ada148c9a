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
// timeout, 2 on bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

int usage(const char* why) {
  std::fprintf(stderr,
               "fs_load: %s\nusage: fs_load --config C --id CLIENT --mode write|verify --prefix P "
               "(--files N | --duration-s S) --file-bytes B [--timeout-s T]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config;
  std::string mode;
  std::string prefix = "f";
  long long id = -1;
  long long files = -1;
  double duration_s = 0;
  long long file_bytes = 4096;
  double timeout_s = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--config") config = v;
    else if (a == "--id") id = std::atoll(v);
    else if (a == "--mode") mode = v;
    else if (a == "--prefix") prefix = v;
    else if (a == "--files") files = std::atoll(v);
    else if (a == "--duration-s") duration_s = std::atof(v);
    else if (a == "--file-bytes") file_bytes = std::atoll(v);
    else if (a == "--timeout-s") timeout_s = std::atof(v);
    else return usage(("unknown option " + a).c_str());
  }
  if (config.empty() || id < 0) return usage("--config and --id are required");
  if (mode != "write" && mode != "verify") return usage("--mode must be write or verify");
  if (file_bytes < 0 || file_bytes > 512 * 1024) return usage("--file-bytes must be in [0, 524288]");
  if (files < 0 && (mode == "verify" || duration_s <= 0)) return usage("--files (or, to write, --duration-s)");
  log_set_level(LogLevel::kWarn);

  EventBasePtr base = make_event_base();
  std::unique_ptr<ClientRuntime> client;
  ClientOptions co;
  co.first_request_id = fresh_first_request_id();
  if (std::string err = ClientRuntime::create(base.get(), config, static_cast<NodeId>(id), co, client); !err.empty()) {
    std::fprintf(stderr, "fs_load: %s\n", err.c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  double last_progress = 0;
  std::uint64_t done = 0;
  const auto size = static_cast<std::size_t>(file_bytes);
  for (std::uint64_t i = 0;; ++i) {
    if (files >= 0 && i >= static_cast<std::uint64_t>(files)) break;
    if (files < 0 && elapsed() >= duration_s) break;
    const std::string name = prefix + std::to_string(i);
    const Bytes data = pattern(prefix, i, size);
    fs::Request req;
    fs::Op lookup_or_create = make_op(fs::OpCode::kCreate);
    lookup_or_create.handle = fs::Handle::of(fs::kRootIno, 1);
    lookup_or_create.name = name;
    lookup_or_create.mode = 0644;
    lookup_or_create.exclusive = false;  // an existing file is returned (and overwritten by write)
    req.ops.push_back(lookup_or_create);
    bool read_only = false;
    if (mode == "write") {
      fs::Op w = make_op(fs::OpCode::kWrite);
      w.handle = fs::Handle::result_of(0);
      w.data = data;
      req.ops.push_back(w);
    } else {
      req.ops[0] = make_op(fs::OpCode::kLookup);
      req.ops[0].handle = fs::Handle::of(fs::kRootIno, 1);
      req.ops[0].name = name;
      fs::Op r = make_op(fs::OpCode::kRead);
      r.handle = fs::Handle::result_of(0);
      r.count = static_cast<std::uint32_t>(size);
      req.ops.push_back(r);
      read_only = true;
    }
    std::optional<Bytes> out;
    client->submit(shim::encode_envelope({}, fs::encode_request(req)), read_only,
                   [&](const Completion& c) { out = c.result; });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!out && std::chrono::steady_clock::now() < deadline) {
      timeval tv{0, 1000};
      event_base_loopexit(base.get(), &tv);
      event_base_loop(base.get(), 0);
    }
    if (!out) {
      std::fprintf(stderr, "fs_load: %s: no result within %.0f s\n", name.c_str(), timeout_s);
      return 1;
    }
    shim::ShimResult sr;
    fs::Result res;
    if (!shim::decode_envelope_result(*out, sr) || sr.status != shim::ShimStatus::kExecuted ||
        fs::decode_result(sr.inner, res) != fs::FsDecodeError::kOk || res.outcome != fs::Outcome::kDone ||
        res.results.size() != 2) {
      std::fprintf(stderr, "fs_load: %s: the request failed\n", name.c_str());
      return 1;
    }
    if (mode == "verify" && res.results[1].data != data) {
      std::fprintf(stderr, "fs_load: %s: WRONG CONTENT\n", name.c_str());
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
              mode.c_str(), static_cast<unsigned long long>(done), file_bytes, secs, secs > 0 ? static_cast<double>(done) / secs : 0.0);
  return 0;
}
