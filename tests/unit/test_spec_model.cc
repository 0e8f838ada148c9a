// The local model predicts exactly (docs/SPECULATION.md §6.3, §15): random requests of a simulated program
// (sim/fs_workload.h) answered by the model, with facts fetched from a replica-side file service through FETCH,
// then applied there as one EPOCH: every entry matches, and the replica ends exactly where the model's overlay
// says. With another client's change injected before the batch, the EPOCH fails at the entry that observed it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/prng.h"
#include "services/fs/checkpointed_store.h"
#include "sim/fs_workload.h"
#include "spec/entry_builder.h"
#include "spec/epoch_log.h"
#include "spec/local_model.h"
#include "test_fs_speculation_util.h"

using namespace fstest;
using bftfs::NodeId;
using bftfs::spec::EpochLog;
using bftfs::spec::LocalModel;
using bftfs::spec::SealedEpoch;

namespace {

constexpr NodeId kClient = 7;
constexpr NodeId kOther = 8;
constexpr std::uint64_t kStream = 1;
constexpr int kFetchRoundsMax = 64;

FsOptions model_options() {
  FsOptions o;
  o.partitions = 64;
  o.capacity_bytes = 256ull << 20;
  o.inodes_max = 100000;
  o.root_mode = 0777;  // the workload's users create under the root
  return o;
}

// A replica-side file service whose objects the test reads.
class Replica {
 public:
  Replica() {
    auto store = std::make_unique<MemoryCheckpointedStore>(nullptr, model_options().partitions);
    store_ = store.get();
    svc_ = std::make_unique<FsService>(std::move(store), model_options());
  }
  Result run(const Request& r, NodeId client = kClient) {
    const ExecContext ctx{++seq_, client, seq_, time_ += 1000};
    Result res;
    REQUIRE(decode_result(svc_->execute(ctx, encode_request(r)), res) == FsDecodeError::kOk);
    return res;
  }
  OpResult run1(const Request& req) {
    const Result r = run(req);
    REQUIRE(r.outcome == Outcome::kDone);
    return r.results[0];
  }
  OpResult run1(const Op& op) { return run1(Request{{op}}); }
  Result read_only(const Request& r) {
    Bytes out;
    REQUIRE(svc_->execute_read_only(kClient, encode_request(r), out));
    Result res;
    REQUIRE(decode_result(out, res) == FsDecodeError::kOk);
    return res;
  }
  // Every object but the streams' records and staged parts (what the tree's changes are compared on).
  std::map<ObjectKey, Bytes> objects() const {
    std::map<ObjectKey, Bytes> out;
    for (std::uint64_t p = 0; p < store_->partition_count(); ++p) {
      store_->for_each_in_partition(p, [&](const ObjectKey& k, const Value& v) {
        if (k.kind != Kind::kStream && k.kind != Kind::kStaged) out.emplace(k, *v);
      });
    }
    return out;
  }
  FsService& svc() { return *svc_; }
  std::uint64_t seq() const { return seq_; }

 private:
  MemoryCheckpointedStore* store_;
  std::unique_ptr<FsService> svc_;
  std::uint64_t seq_ = 0;
  std::uint64_t time_ = 1'000'000;
};

// Requests of another client, executed plainly on the replicas.
void run_other(std::vector<Replica*> replicas, bftfs::sim::FsWorkload& work, Prng& prng, int n) {
  for (int i = 0; i < n; ++i) {
    const bftfs::sim::FsWorkRequest w = work.next(prng);
    Result r;
    for (Replica* rep : replicas) r = rep->run(w.request, kOther);
    work.on_result(w.request, r);
  }
}

// A speculating client: the workload draws its program's requests, the model answers them, the log records them.
struct Speculator {
  Speculator(std::uint64_t seed, std::size_t part_bytes)
      : prng(seed), model(model_options(), kClient, kStream), log(kStream, part_bytes) {}

  // The model's result for entry request `req`, fetching from `from` until the model knows enough.
  Result answer(Replica& from, const Request& req) {
    for (int round = 0; round < kFetchRoundsMax; ++round) {
      const EntryRun run = model.execute(log.open_epoch(), req);
      if (run.inconsistent) {
        REQUIRE(lie_percent > 0);  // only lies make facts contradict each other
        ++inconsistent;
        model.drop_clean();
        continue;
      }
      if (run.complete()) return run.result;
      ++fetches;
      if (round >= 2) ++key_fetches;
      // The trace first (everything the replica's execution reads), then the keys still missing.
      const Op fetch = round < 2 ? fetch_trace(kStream, req) : fetch_keys(run.missing);
      const Result fr = from.read_only(Request{{fetch}});
      REQUIRE(fr.outcome == Outcome::kDone);
      REQUIRE(fr.results[0].complete);
      std::vector<Fact> facts = fr.results[0].facts;
      if (lie_percent > 0) lie(facts);
      REQUIRE(model.insert(facts).invalid == 0);
    }
    FAIL("the model still misses facts after " << kFetchRoundsMax << " fetches");
    return {};
  }

  // One request of the program: answered, learned from, logged; a part that filled goes to the replicas.
  void step(std::vector<Replica*> replicas) {
    const bftfs::sim::FsWorkRequest w = work.next(prng);
    const Request req = bftfs::spec::with_time(w.request, time += 1000);
    const Result res = answer(*replicas.front(), req);
    work.on_result(w.request, bftfs::spec::without_time(res));
    entries.push_back(bftfs::spec::build_entry(req, res));
    if (std::optional<Request> stage = log.append(entries.back())) {
      for (Replica* rep : replicas) REQUIRE(rep->run(*stage).outcome == Outcome::kDone);
      ++stages;
    }
  }

  void reserve(std::vector<Replica*> replicas, std::uint16_t n) {
    OpResult r;
    for (Replica* rep : replicas) r = rep->run1(reserve_op(kStream, n));
    model.insert_reserved(r);
  }

  // A lying first reply (docs/SPECULATION.md §12): plausible changes to the facts, each with lie_percent:
  // a value swapped for another fact's value of the same kind, a fact dropped, an interval claimed empty.
  void lie(std::vector<Fact>& facts) {
    std::vector<Fact> told;
    for (std::size_t i = 0; i < facts.size(); ++i) {
      Fact f = facts[i];
      if (prng.chance(lie_percent, 100)) {
        const Fact& other = facts[prng.below(facts.size())];
        if (f.kind == FactKind::kValue && other.kind == FactKind::kValue && other.key.kind == f.key.kind) {
          f.value = other.value;
        } else if (f.kind == FactKind::kNext) {
          f.next.reset();
        } else {
          continue;  // dropped
        }
        ++lies;
      }
      told.push_back(std::move(f));
    }
    facts = std::move(told);
  }

  Prng prng;
  std::uint32_t lie_percent = 0;
  int lies = 0;
  int inconsistent = 0;
  bftfs::sim::FsWorkload work;
  LocalModel model;
  EpochLog log;
  std::vector<Entry> entries;  // of the open epoch
  std::uint64_t time = 1'700'000'000'000'000'000ull;
  int fetches = 0;
  int key_fetches = 0;
  int stages = 0;
};

// `objects` with the overlay applied: what the replica holds after the epoch if the model predicted exactly.
std::map<ObjectKey, Bytes> with_overlay(std::map<ObjectKey, Bytes> objects,
                                        const std::vector<std::pair<ObjectKey, Value>>& dirty) {
  for (const auto& [k, v] : dirty) {
    if (k.kind == Kind::kStream || k.kind == Kind::kStaged) continue;
    if (v == nullptr) {
      objects.erase(k);
    } else {
      objects[k] = *v;
    }
  }
  return objects;
}

}  // namespace

TEST_CASE("spec the model predicts every entry the replicas replay, and the replicas end at its overlay",
          "[spec]") {
  int fetches = 0;
  int key_fetches = 0;
  int stages = 0;
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    const std::size_t part_bytes = seed % 2 == 0 ? bftfs::spec::kPartBytesMax : 24000;  // inline, or many parts
    INFO("seed " << seed << ", parts of " << part_bytes << " bytes");
    Replica replica;
    Prng other_prng(seed * 1000 + 7);
    bftfs::sim::FsWorkload other;
    run_other({&replica}, other, other_prng, 40);
    Speculator spec(seed, part_bytes);
    spec.reserve({&replica}, 1000);
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (int i = 0; i < 40; ++i) spec.step({&replica});
      const std::map<ObjectKey, Bytes> expected = with_overlay(replica.objects(), spec.model.dirty_objects());
      const SealedEpoch sealed = spec.log.seal();
      const OpResult v = replica.run1(sealed.request);
      INFO("epoch " << sealed.epoch << ": verdict " << static_cast<int>(v.verdict) << " at entry " << v.entry);
      REQUIRE(v.verdict == EpochVerdict::kApplied);
      REQUIRE(replica.objects() == expected);
      REQUIRE(replica.svc().check_invariants() == "");
      spec.log.committed(sealed.epoch);
      spec.model.commit_through(sealed.epoch);
      spec.entries.clear();
      // Another client works between epochs; the model forgets its clean facts (as after a rollback) and
      // fetches again.
      run_other({&replica}, other, other_prng, 3);
      spec.model.drop_clean();
    }
    fetches += spec.fetches;
    key_fetches += spec.key_fetches;
    stages += spec.stages;
  }
  CHECK(fetches > 0);
  CHECK(key_fetches > 0);  // where the model's overlay led it off the trace's path
  CHECK(stages > 0);
}

TEST_CASE("spec another client's change before the batch fails the epoch at the entry that observed it",
          "[spec]") {
  int failed = 0;
  int applied = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    Replica a;
    Replica oracle;  // the same history; the entries run one by one on it, to find the first that changed
    Prng other_prng(seed * 31 + 5);
    bftfs::sim::FsWorkload other;
    run_other({&a, &oracle}, other, other_prng, 30);
    Speculator spec(seed + 100, seed % 2 == 0 ? bftfs::spec::kPartBytesMax : 24000);
    spec.reserve({&a, &oracle}, 200);
    for (int i = 0; i < 25; ++i) spec.step({&a, &oracle});
    run_other({&a, &oracle}, other, other_prng, 2);  // the change, between the model and the batch
    std::optional<std::uint32_t> first_mismatch;
    for (std::size_t i = 0; i < spec.entries.size() && !first_mismatch; ++i) {
      const ExecContext ctx{oracle.seq() + 1, kClient, 0, 0};
      const EntryRun run = oracle.svc().execute_entry(ctx, kStream, spec.entries[i].request);
      REQUIRE(run.complete());
      if (!entry_matches(spec.entries[i], run.result)) first_mismatch = static_cast<std::uint32_t>(i);
    }
    const std::map<ObjectKey, Bytes> before = a.objects();
    const OpResult v = a.run1(spec.log.seal().request);
    if (first_mismatch.has_value()) {
      CHECK(v.verdict == EpochVerdict::kEntry);
      CHECK(v.entry == *first_mismatch);
      CHECK(a.objects() == before);
      ++failed;
    } else {
      CHECK(v.verdict == EpochVerdict::kApplied);
      ++applied;
    }
  }
  CHECK(failed > 0);
  CHECK(applied > 0);
}

TEST_CASE("spec a lookup that found nothing fails its epoch once another client creates the name", "[spec]") {
  Replica replica;
  replica.run(Request{{create(kRoot, "f")}}, kOther);
  Speculator spec(1, bftfs::spec::kPartBytesMax);
  spec.reserve({&replica}, 8);
  const std::vector<Request> program = {Request{{create(kRoot, "x")}}, Request{{lookup(kRoot, "y")}},
                                        Request{{lookup(kRoot, "f")}}};
  for (const Request& r : program) {
    const Request req = bftfs::spec::with_time(r, spec.time += 1000);
    spec.entries.push_back(bftfs::spec::build_entry(req, spec.answer(replica, req)));
    spec.log.append(spec.entries.back());
  }
  CHECK(spec.entries[1].expect_outcome == Outcome::kOpFailed);
  CHECK(spec.entries[1].expect_err == err::kNoEnt);
  replica.run(Request{{create(kRoot, "y")}}, kOther);
  const std::map<ObjectKey, Bytes> before = replica.objects();
  const OpResult v = replica.run1(spec.log.seal().request);
  CHECK(v.verdict == EpochVerdict::kEntry);
  CHECK(v.entry == 1);
  CHECK(v.entry_outcome == Outcome::kDone);  // the lookup found it
  CHECK(replica.objects() == before);
  CHECK(replica.run(Request{{lookup(kRoot, "x")}}).results[0].err == err::kNoEnt);
}

TEST_CASE("spec one FETCH tells the model a directory's listing: later creates in it need none", "[spec]") {
  Replica replica;
  // A directory that existed before the run, with names on both sides of those the program creates.
  for (const char* name : {"a", "m", "n5", "z"}) replica.run(Request{{create(kRoot, name)}}, kOther);
  Speculator spec(2, bftfs::spec::kPartBytesMax);
  spec.reserve({&replica}, 64);
  for (int i = 0; i < 40; ++i) {
    const Request req = bftfs::spec::with_time(Request{{create(kRoot, "n" + std::to_string(i))}}, spec.time += 1000);
    spec.entries.push_back(bftfs::spec::build_entry(req, spec.answer(replica, req)));
    spec.log.append(spec.entries.back());
    if (i == 5) CHECK(spec.entries.back().expect_outcome == Outcome::kOpFailed);  // n5 exists
  }
  // The first create fetched its trace; every later name and cookie lay in the listing it brought, except n5,
  // which the listing names but whose value the failed create reads.
  CHECK(spec.fetches == 2);
  CHECK(spec.model.store().intervals() > 0);
  const OpResult v = replica.run1(spec.log.seal().request);
  CHECK(v.verdict == EpochVerdict::kApplied);
  CHECK(replica.run(Request{{lookup(kRoot, "n39")}}).results[0].err == err::kOk);
}

TEST_CASE("spec the model's memory bound forgets committed data blocks, which a later read fetches again",
          "[spec]") {
  Replica replica;
  const Handle file = replica.run1(create(kRoot, "big")).attr.handle();
  Speculator spec(3, bftfs::spec::kPartBytesMax);
  constexpr std::uint64_t kBound = 256u << 10;
  spec.model.set_memory_bound(kBound);
  Bytes data(128u << 10);
  for (int i = 0; i < 8; ++i) {
    std::fill(data.begin(), data.end(), static_cast<std::uint8_t>(i + 1));
    const Request req = bftfs::spec::with_time(Request{{write(file, std::uint64_t(i) * data.size(), data)}},
                                               spec.time += 1000);
    spec.entries.push_back(bftfs::spec::build_entry(req, spec.answer(replica, req)));
    if (std::optional<Request> stage = spec.log.append(spec.entries.back())) {
      REQUIRE(replica.run(*stage).outcome == Outcome::kDone);
    }
  }
  CHECK(spec.model.store().value_bytes() > kBound);  // the overlay is never forgotten
  const SealedEpoch sealed = spec.log.seal();
  REQUIRE(replica.run1(sealed.request).verdict == EpochVerdict::kApplied);
  spec.model.commit_through(sealed.epoch);
  CHECK(spec.model.store().value_bytes() <= kBound);
  // Block 0 was forgotten (key order): reading it back takes a FETCH and gives what was written.
  const int fetches = spec.fetches;
  const Request rd = bftfs::spec::with_time(Request{{read(file, 0, 4096)}}, spec.time += 1000);
  const Result r = spec.answer(replica, rd);
  CHECK(spec.fetches > fetches);
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(bftfs::spec::without_time(r).results[0].data == Bytes(4096, 1));
}

TEST_CASE("spec lies in fetched facts cost at most a failed epoch, never a crash or a wrong effect", "[spec]") {
  int lies = 0;
  int failed = 0;
  for (std::uint64_t seed = 1; seed <= 24; ++seed) {
    INFO("seed " << seed);
    Replica replica;
    Prng other_prng(seed * 7 + 3);
    bftfs::sim::FsWorkload other;
    run_other({&replica}, other, other_prng, 40);
    Speculator spec(seed + 500, bftfs::spec::kPartBytesMax);
    spec.lie_percent = 25;
    spec.reserve({&replica}, 100);
    for (int i = 0; i < 30; ++i) spec.step({&replica});
    const std::map<ObjectKey, Bytes> before = replica.objects();
    const OpResult v = replica.run1(spec.log.seal().request);
    REQUIRE((v.verdict == EpochVerdict::kApplied || v.verdict == EpochVerdict::kEntry));
    if (v.verdict == EpochVerdict::kEntry) {
      CHECK(replica.objects() == before);
      ++failed;
    }
    // Whatever applied is what the replicas' own replay gave: their state is consistent.
    REQUIRE(replica.svc().check_invariants() == "");
    lies += spec.lies;
  }
  CHECK(lies > 0);
  CHECK(failed > 0);
}
