// fuzz_seed_corpus <dir>: writes valid inputs for every fuzz target into <dir>/corpus-<target>/, so that the
// fuzzers start from encodings that pass every check and mutate from there instead of rediscovering the
// formats. Deterministic: the same files every run (libFuzzer skips inputs it already has by content).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/config.h"
#include "fuzz/fuzz_common.h"
#include "fuzz/samples.h"
#include "protocol/wire.h"
#include "fuzz/spec_control_samples.h"
#include "relay/relay_wire.h"
#include "services/fs/fs_codec.h"
#include "shim/envelope.h"

namespace {

using namespace bftfs;

class CorpusWriter {
 public:
  explicit CorpusWriter(std::filesystem::path root) : root_(std::move(root)) {}
  void add(const std::string& target, std::span<const std::uint8_t> bytes) {
    const auto dir = root_ / ("corpus-" + target);
    std::filesystem::create_directories(dir);
    const auto path = dir / ("seed-" + std::to_string(counts_[target]++));
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "fuzz_seed_corpus: cannot write %s\n", path.c_str());
      std::exit(1);
    }
    ++total_;
  }
  void add(const std::string& target, std::string_view text) {
    add(target, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  }
  std::size_t total() const { return total_; }

 private:
  std::filesystem::path root_;
  std::map<std::string, std::size_t> counts_;
  std::size_t total_ = 0;
};

ClusterConfig config_for(std::uint32_t f, std::uint32_t clients) {
  ClusterConfig c;
  c.f = f;
  c.n = 3 * f + 1;
  for (NodeId id = 0; id < c.n + clients; ++id) {
    SecretKeys sec;
    generate_keys_from_seed(f, id, c.public_keys[id], sec);
    if (id < c.n) {
      c.replicas.push_back({id % 2 == 0 ? "127.0.0.1" : "::1", static_cast<std::uint16_t>(7000 + id)});
    } else {
      c.clients.push_back(id);
    }
  }
  return c;
}

}  // namespace

// The speculation ops (docs/SPECULATION.md §5): a request of each, entries of each expectation, and each
// result body, so that the fuzzer mutates nested entries, keys and facts from valid encodings.
void add_fs_speculation_seeds(CorpusWriter& out) {
  fs::Op time;
  time.code = fs::OpCode::kTime;
  time.time_ns = 1700000000000000000ull;
  fs::Op lookup;
  lookup.code = fs::OpCode::kLookup;
  lookup.handle = fs::Handle::of(1, 1);
  lookup.name = "x";
  const fs::Request entry_request{{time, lookup}};
  std::vector<fs::Entry> entries(2);
  entries[0].request = entry_request;
  entries[1] = fs::Entry{fs::Outcome::kOpFailed, 1, 2, entry_request};
  fs::Op op;
  op.code = fs::OpCode::kFetch;
  op.stream = 9;
  op.trace = entry_request;
  out.add("fuzz_fs_codec", fs::encode_request(fs::Request{{time, op}}));
  op.fetch_mode = fs::FetchMode::kKeys;
  op.keys = {fs::ObjectKey::super(), fs::ObjectKey::dir_name(1, "x"), fs::ObjectKey::data(5, 2)};
  out.add("fuzz_fs_codec", fs::encode_request(fs::Request{{op}}));
  for (fs::OpCode code : {fs::OpCode::kReserve, fs::OpCode::kStage, fs::OpCode::kEpoch, fs::OpCode::kStreamClose}) {
    fs::Op s;
    s.code = code;
    s.stream = 9;
    s.reserve = code == fs::OpCode::kReserve ? 16 : 0;
    s.epoch = code == fs::OpCode::kStage || code == fs::OpCode::kEpoch ? 3 : 0;
    s.prev = code == fs::OpCode::kEpoch ? 2 : 0;
    s.parts = code == fs::OpCode::kEpoch ? 1 : 0;
    if (code == fs::OpCode::kStage || code == fs::OpCode::kEpoch) s.entries = entries;
    out.add("fuzz_fs_codec", fs::encode_request(fs::Request{{s}}));
  }
  fs::Result result;
  result.results.resize(4);
  result.results[0].code = fs::OpCode::kFetch;
  result.results[0].complete = true;
  result.results[0].facts = {fs::Fact{fs::FactKind::kValue, fs::ObjectKey::inode(5), Bytes{1, 2}, std::nullopt},
                             fs::Fact{fs::FactKind::kAbsent, fs::ObjectKey::dir_name(1, "y"), {}, std::nullopt},
                             fs::Fact{fs::FactKind::kNext, fs::ObjectKey::entry(1, 3), {}, fs::ObjectKey::entry(1, 7)}};
  result.results[1].code = fs::OpCode::kReserve;
  result.results[1].reserved = {fs::ReservedInode{5, 1}, fs::ReservedInode{6, 2}};
  result.results[2].code = fs::OpCode::kStage;
  result.results[2].parts_present = 1;
  result.results[3].code = fs::OpCode::kEpoch;
  result.results[3].verdict = fs::EpochVerdict::kEntry;
  result.results[3].entry_outcome = fs::Outcome::kOpFailed;
  result.results[3].entry_stop = 1;
  result.results[3].entry_err = 2;
  result.results[3].entry_result.resize(1);
  result.results[3].entry_result[0].code = fs::OpCode::kLookup;
  result.results[3].entry_result[0].err = 2;
  out.add("fuzz_fs_codec", fs::encode_result(result));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <dir>  (writes <dir>/corpus-<target>/seed-N)\n", argv[0]);
    return 2;
  }
  CorpusWriter out(argv[1]);
  const auto& net = fuzz::cluster();
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    for (bool large : {false, true}) {
      Prng prng(seed * 1000 + (large ? 1 : 0));
      for (const Message& m : samples::messages(prng, fuzz::kReplicas, large)) {
        const auto t = static_cast<std::uint8_t>(type_of(m));
        const Bytes body = encode_body(m);
        out.add("fuzz_body_" + std::string(fuzz::kBodyTargetNames[t - 1]), body);

        const auto route = samples::route_of(m, fuzz::kReplicas);
        // fuzz_frame, MACed mode: [type selector][sender][receiver][mode 0] body.
        Bytes steered = {static_cast<std::uint8_t>(t - 1), static_cast<std::uint8_t>(route.sender % 9),
                         static_cast<std::uint8_t>(route.receiver % fuzz::kNodes), 0};
        steered.insert(steered.end(), body.begin(), body.end());
        out.add("fuzz_frame", steered);
        if (route.sender < fuzz::kNodes && route.receiver < fuzz::kNodes) {
          // Raw mode: a whole valid frame.
          const Bytes frame = encode_frame(m, route.sender, route.receiver, net.at(route.sender));
          Bytes raw = {0, 0, static_cast<std::uint8_t>(route.receiver), 1};
          raw.insert(raw.end(), frame.begin(), frame.end());
          out.add("fuzz_frame", raw);
          out.add("fuzz_frame_length", std::span<const std::uint8_t>(frame).first(kHeaderBytes));
        }
      }
      for (const PersistRecord& r : samples::records(prng, fuzz::kReplicas, large)) {
        out.add("fuzz_record", encode_record(r));
      }
    }
  }
  out.add("fuzz_config", format_cluster(config_for(1, 0)));
  out.add("fuzz_config", format_cluster(config_for(1, 3)));
  out.add("fuzz_config", format_cluster(config_for(2, 1)));
  // Shim envelopes: no dependencies, a few, the most allowed; and each result status.
  for (std::size_t deps : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{shim::kDependenciesMax}}) {
    std::vector<shim::Dependency> list;
    for (std::size_t i = 0; i < deps; ++i) {
      Digest d;
      d.bytes.fill(static_cast<std::uint8_t>(i + 1));
      list.push_back(shim::Dependency{i + 1, d});
    }
    out.add("fuzz_shim_envelope", shim::encode_envelope(list, Bytes{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  }
  out.add("fuzz_shim_envelope", shim::encode_envelope_result(shim::ShimStatus::kExecuted, Bytes(17, 7)));
  out.add("fuzz_shim_envelope", shim::encode_envelope_result(shim::ShimStatus::kRetryPredicateFailed, {}));
  // File-service compounds (create, write through a result reference, read back) and their result.
  {
    fs::Op create;
    create.code = fs::OpCode::kCreate;
    create.handle = fs::Handle::of(1, 1);
    create.name = "f";
    create.mode = 0644;
    fs::Op write;
    write.code = fs::OpCode::kWrite;
    write.handle = fs::Handle::result_of(0);
    write.data = Bytes{1, 2, 3};
    fs::Op read;
    read.code = fs::OpCode::kRead;
    read.handle = fs::Handle::result_of(0);
    read.count = 3;
    read.expect.kind = fs::ExpectKind::kErrno;
    out.add("fuzz_fs_codec", fs::encode_request(fs::Request{{create, write, read}}));
    fs::Result result;
    fs::OpResult r;
    r.code = fs::OpCode::kRead;
    r.data = Bytes{1, 2, 3};
    result.results = {r};
    out.add("fuzz_fs_codec", fs::encode_result(result));
  }
  add_fs_speculation_seeds(out);
  {
    // Relay frames: the fuzz target decodes its input as one body and as a stream, so seed both forms.
    const fs::Request lookup{{fs::Op{}}};
    const relay::MountMsg mount_msgs[] = {
        relay::Hello{}, relay::Submit{7, relay::kFlagReportFirst, {}, fs::encode_request(lookup)},
        relay::Submit{8, relay::kFlagReadOnly, {7}, Bytes{1, 2, 3}}, relay::Cancel{7}, relay::StatusQuery{}};
    const relay::RelayMsg relay_msgs[] = {
        relay::HelloOk{relay::kRelayWireVersion, 4, 4, 1}, relay::First{7, 0, Bytes{0, 0, 0}},
        relay::Final{7, relay::FinalStatus::kCommitted, Bytes{0, 0, 0}},
        relay::Final{8, relay::FinalStatus::kRefused, Bytes{'n', 'o'}}, relay::StatusReply{"client_id 4\n"}};
    Bytes stream;
    for (const auto& m : mount_msgs) {
      const Bytes frame = relay::encode_relay_frame(m);
      out.add("fuzz_relay_wire", std::span<const std::uint8_t>(frame).subspan(relay::kFrameLengthBytes));
      stream.insert(stream.end(), frame.begin(), frame.end());
    }
    for (const auto& m : relay_msgs) {
      const Bytes frame = relay::encode_relay_frame(m);
      out.add("fuzz_relay_wire", std::span<const std::uint8_t>(frame).subspan(relay::kFrameLengthBytes));
      stream.insert(stream.end(), frame.begin(), frame.end());
    }
    out.add("fuzz_relay_wire", stream);
  }
  {
    // Control frames (spec/control_wire.h): each body, and all of them as one stream.
    Bytes stream;
    auto add = [&](const Bytes& frame) {
      out.add("fuzz_spec_control", std::span<const std::uint8_t>(frame).subspan(spec::kControlLengthBytes));
      stream.insert(stream.end(), frame.begin(), frame.end());
    };
    for (const auto& m : samples::control_supervisor_msgs()) add(spec::encode_control_frame(m));
    for (const auto& m : samples::control_daemon_msgs()) add(spec::encode_control_frame(m));
    out.add("fuzz_spec_control", stream);
  }
  std::printf("fuzz_seed_corpus: wrote %zu seeds under %s\n", out.total(), argv[1]);
  return 0;
}
