// Four real replicas running the file service behind the PBFT-CS shim, each with its state in the disk store of
// its data directory (storage/disk_object_store.h), on loopback TCP in this process; a PBFT client submits
// file-service requests. Shows the two storage must-shows end to end:
//   - a block corrupted on one replica's disk is detected, no client ever reads it, and that replica repairs it
//     from the others (its checksums verify again);
//   - a replica whose data directory is wiped rejoins under load by state transfer.
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "runtime/client_runtime.h"
#include "storage/disk_object_store.h"
#include "replica/replica_runtime.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "shim/envelope.h"
#include "tests/unit/test_runtime_util.h"

using namespace bftfs;
using namespace bftfs::testing;

namespace {

class FsCluster {
 public:
  FsCluster() {
    port_ = free_port_range(4);
    REQUIRE(generate_cluster(dir_.path, 1, 4, {"127.0.0.1"}, port_).empty());
    conf_ = dir_.path + "/cluster.conf";
    for (NodeId i = 0; i < 4; ++i) start(i);
  }
  ~FsCluster() {
    for (NodeId i = 0; i < 4; ++i) {
      if (rt_[i]) stop(i);
    }
  }
  void start(NodeId i) {
    REQUIRE(rt_[i] == nullptr);
    ReplicaRuntimeOptions o;
    o.config_path = conf_;
    o.id = i;
    o.data_dir = data_dir(i);
    o.service = "fs";
    o.shim = true;
    o.core.checkpoint_interval = 16;  // checkpoints (and so repairs) come often in a short test
    o.core.log_window = 32;
    o.wal.compact_bytes_min = 0;
    o.check_invariants = true;
    const std::string err = ReplicaRuntime::create(o, rt_[i]);
    INFO(err);
    REQUIRE(err.empty());
    ReplicaRuntime* rt = rt_[i].get();
    threads_[i] = std::thread([rt] { rt->run(); });
  }
  void stop(NodeId i) {
    rt_[i]->stop();
    threads_[i].join();
    rt_[i].reset();
  }
  void wipe(NodeId i) { REQUIRE(std::system(("rm -rf '" + data_dir(i) + "'").c_str()) == 0); }
  std::string data_dir(NodeId i) const { return dir_.path + "/r" + std::to_string(i); }
  ReplicaSnapshot snap(NodeId i) const { return rt_[i]->snapshot(); }
  const std::string& conf() const { return conf_; }

 private:
  TempDir dir_;
  std::uint16_t port_ = 0;
  std::string conf_;
  std::array<std::unique_ptr<ReplicaRuntime>, 4> rt_;
  std::array<std::thread, 4> threads_;
};

// A client submitting file-service compounds (in the shim's envelope, no dependencies) one at a time.
class FsClient {
 public:
  explicit FsClient(const std::string& conf) : base_(make_event_base()) {
    ClientOptions co;
    co.first_request_id = fresh_first_request_id();
    REQUIRE(ClientRuntime::create(base_.get(), conf, 4, co, client_).empty());
  }

  fs::Result call(const std::vector<fs::Op>& ops, bool read_only = false) {
    std::optional<Bytes> out;
    client_->submit(shim::encode_envelope({}, fs::encode_request(fs::Request{ops})), read_only,
                    [&](const Completion& c) { out = c.result; });
    REQUIRE(run_until(base_.get(), [&] { return out.has_value(); }, 20000));
    shim::ShimResult sr;
    REQUIRE(shim::decode_envelope_result(*out, sr));
    REQUIRE(sr.status == shim::ShimStatus::kExecuted);
    fs::Result r;
    REQUIRE(fs::decode_result(sr.inner, r) == fs::FsDecodeError::kOk);
    return r;
  }
  fs::OpResult ok(fs::Op op, bool read_only = false) {
    const fs::Result r = call({std::move(op)}, read_only);
    REQUIRE(r.results.size() == 1);
    INFO("errno " << r.results[0].err);
    REQUIRE(r.results[0].err == 0);
    return r.results[0];
  }

 private:
  EventBasePtr base_;
  std::unique_ptr<ClientRuntime> client_;
};

fs::Op op(fs::OpCode code) {
  fs::Op o;
  o.code = code;
  o.cred = fs::Cred{0, 0, {}};
  return o;
}
const fs::Handle kRoot = fs::Handle::of(fs::kRootIno, 1);

fs::Op create(const std::string& name) {
  fs::Op o = op(fs::OpCode::kCreate);
  o.handle = kRoot;
  o.name = name;
  o.mode = 0644;
  return o;
}
fs::Op write(fs::Handle h, std::uint64_t offset, Bytes data) {
  fs::Op o = op(fs::OpCode::kWrite);
  o.handle = h;
  o.offset = offset;
  o.data = std::move(data);
  return o;
}
fs::Op read(fs::Handle h, std::uint64_t offset, std::uint32_t count) {
  fs::Op o = op(fs::OpCode::kRead);
  o.handle = h;
  o.offset = offset;
  o.count = count;
  return o;
}

// Content no other file has (so its bytes can be found in a data file): a stream of a small PRNG.
Bytes pattern(std::uint64_t seed, std::size_t size) {
  Bytes b(size);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<std::uint8_t>(x);
  }
  return b;
}

// Creates `name` holding `data`; returns its handle.
fs::Handle put_file(FsClient& c, const std::string& name, const Bytes& data) {
  const fs::Result r = c.call({create(name), write(fs::Handle::result_of(0), 0, data)});
  REQUIRE(r.outcome == fs::Outcome::kDone);
  return r.results[0].attr.handle();
}

// Flips one byte inside every copy of `needle` in `path`; returns how many copies.
int corrupt_copies(const std::string& path, const Bytes& needle) {
  std::ifstream in(path, std::ios::binary);
  const Bytes file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int copies = 0;
  auto it = file.begin();
  while ((it = std::search(it, file.end(), needle.begin(), needle.end())) != file.end()) {
    const auto offset = static_cast<long>(it - file.begin()) + static_cast<long>(needle.size() / 2);
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(offset);
    const char flipped = static_cast<char>(file[static_cast<std::size_t>(offset)] ^ 0x20);
    f.write(&flipped, 1);
    ++copies;
    it += static_cast<long>(needle.size());
  }
  return copies;
}

}  // namespace

TEST_CASE("fs cluster: a block corrupted on one replica's disk is never read by a client and is repaired",
          "[runtime][cluster][fs]") {
  const std::uint64_t errors_before = log_error_count();
  FsCluster cluster;
  FsClient client(cluster.conf());
  const Bytes content = pattern(1, 4 * fs::kBlockBytes);
  const fs::Handle victim = put_file(client, "victim", content);
  for (int i = 0; i < 20; ++i) put_file(client, "f" + std::to_string(i), pattern(100 + i, 1000));
  const std::uint64_t target = cluster.snap(0).last_executed;
  REQUIRE(wait_until([&] { return cluster.snap(3).last_executed >= target; }, 10000));

  // Bit rot on replica 3: one byte inside the victim's second block, in every copy the data file holds.
  const Bytes needle(content.begin() + fs::kBlockBytes, content.begin() + fs::kBlockBytes + 4096);
  REQUIRE(corrupt_copies(cluster.data_dir(3) + "/fs/data", needle) >= 1);

  // Every read returns the written bytes, ordered and read-only alike: replica 3 finds the checksum mismatch and
  // answers nothing, the three others agree.
  for (bool read_only : {false, true, false}) {
    const fs::OpResult r = client.ok(read(victim, 0, static_cast<std::uint32_t>(content.size())), read_only);
    REQUIRE(r.data == content);
  }
  REQUIRE(wait_until([&] { return cluster.snap(3).service_damaged >= 1; }, 10000));
  const std::uint64_t transfers_before = cluster.snap(3).state_transfers;
  const std::uint64_t bytes_before = cluster.snap(3).state_transfer_bytes;

  // Under further writes the others take a checkpoint; replica 3 fetches what differs from its own newest
  // checkpoint (with the damaged partition blanked) and is whole again.
  int more = 0;
  while (cluster.snap(3).state_transfers == transfers_before && more < 200) {
    ++more;
    put_file(client, "g" + std::to_string(more), pattern(500 + static_cast<std::uint64_t>(more), 300));
  }
  REQUIRE(cluster.snap(3).state_transfers > transfers_before);
  std::printf("fs repair: replica 3 fetched %llu bytes (partitions and tree nodes) after %d more requests\n",
              static_cast<unsigned long long>(cluster.snap(3).state_transfer_bytes - bytes_before), more);

  // Its store verifies again, value for value.
  cluster.stop(3);
  {
    std::unique_ptr<DiskObjectStore> store;
    DiskStoreOptions d;
    d.partitions = fs::FsOptions{}.partitions;
    REQUIRE(DiskObjectStore::open(cluster.data_dir(3) + "/fs", d, store).empty());
    CHECK(store->scrub() == 0);
    CHECK(store->corrupt_partitions().empty());
  }
  // And it counts in a quorum again: with replica 1 down, replicas 0, 2 and 3 must agree.
  cluster.start(3);
  cluster.stop(1);
  REQUIRE(client.ok(read(victim, 0, static_cast<std::uint32_t>(content.size()))).data == content);
  put_file(client, "after-repair", pattern(999, 100));
  CHECK(log_error_count() == errors_before);
}

TEST_CASE("fs cluster: a replica whose data directory is wiped rejoins under load", "[runtime][cluster][fs]") {
  const std::uint64_t errors_before = log_error_count();
  FsCluster cluster;
  FsClient client(cluster.conf());
  std::vector<std::pair<fs::Handle, Bytes>> files;
  for (int i = 0; i < 24; ++i) {
    Bytes data = pattern(7000 + i, 40000);
    files.emplace_back(put_file(client, "w" + std::to_string(i), data), data);
  }
  cluster.stop(2);
  cluster.wipe(2);
  const auto started = std::chrono::steady_clock::now();
  cluster.start(2);
  // Load continues while it catches up: it must fetch a checkpoint (its log is gone) and then execute.
  int more = 0;
  while ((cluster.snap(2).state_transfers == 0 || cluster.snap(2).last_executed < cluster.snap(0).last_committed) &&
         more < 400) {
    ++more;
    put_file(client, "x" + std::to_string(more), pattern(9000 + static_cast<std::uint64_t>(more), 2000));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO("after " << more << " requests: replica 2 executed " << cluster.snap(2).last_executed << ", replica 0 committed "
                << cluster.snap(0).last_committed);
  REQUIRE(cluster.snap(2).state_transfers >= 1);
  std::printf("fs wipe: replica 2 rejoined in %.2f s under load (%d requests meanwhile), fetched %llu bytes\n",
              seconds, more, static_cast<unsigned long long>(cluster.snap(2).state_transfer_bytes));
  // It holds the state: with replica 0 down too, replicas 1, 2 and 3 must agree on every file.
  cluster.stop(0);
  for (const auto& [h, data] : files) REQUIRE(client.ok(read(h, 0, 40000)).data == data);
  CHECK(log_error_count() == errors_before);
}
