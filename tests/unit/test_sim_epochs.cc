// The simulator's epoch clients and checker properties 11-13 (docs/SPECULATION.md §14; sim/fs_epoch_client.h,
// sim/spec_audit.h): seeds with an epoch client pass with batches that apply, fail at an entry and fail at the
// chain; a cluster that applies batches whose entries do not hold fails the run with property 11; the replica-side
// audit objects to a service that changes the tree in an EPOCH that did not apply (property 12).
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <span>

#include "protocol/forwarding_service.h"
#include "services/fs/fs_service.h"
#include "sim/simulator.h"
#include "sim/spec_audit.h"
#include "test_fs_speculation_util.h"

namespace {

using bftfs::sim::SimConfig;
using bftfs::sim::SimResult;

// A file service that also makes a directory whenever it executes an EPOCH, whatever the verdict: what a service
// that leaks part of a failed batch would do.
class LeakyEpochs final : public bftfs::ForwardingService {
 public:
  explicit LeakyEpochs(fstest::FsService& fs) : ForwardingService(fs), fs_(fs) {}
  bftfs::Bytes execute(const bftfs::ExecContext& ctx, std::span<const std::uint8_t> op) override {
    bftfs::Bytes result = fs_.execute(ctx, op);
    fstest::Request r;
    if (fstest::decode_request(op, r) == fstest::FsDecodeError::kOk && r.ops[0].code == fstest::OpCode::kEpoch) {
      (void)fs_.execute(ctx, fstest::encode_request(fstest::Request{{fstest::mkdir(fstest::kRoot, "leak")}}));
    }
    return result;
  }

 private:
  fstest::FsService& fs_;
};

}  // namespace

TEST_CASE("seeds with an epoch client pass: batches apply, fail at an entry and at the chain", "[sim][fs][epoch]") {
  bftfs::sim::SimStats sum;
  for (std::uint64_t seed : {2, 3, 5}) {
    SimConfig c;
    c.seed = seed;
    c.service = "fs";
    c.epochs = 1;
    const SimResult r = bftfs::sim::run_isolated(c);
    INFO("seed " << seed << " " << r.scenario << "\n" << r.failure);
    REQUIRE(r.passed);
    CHECK(r.stats.epoch_clients == 1);
    sum.epoch_hist_applied += r.stats.epoch_hist_applied;
    sum.epoch_hist_entry += r.stats.epoch_hist_entry;
    sum.epoch_hist_chain += r.stats.epoch_hist_chain;
    sum.epoch_rollbacks += r.stats.epoch_rollbacks;
    sum.epoch_entries_replayed += r.stats.epoch_entries_replayed;
    sum.epoch_replica_audits += r.stats.epoch_replica_audits;
    sum.epoch_firsts_wrong += r.stats.epoch_firsts_wrong;
  }
  CHECK(sum.epoch_hist_applied > 0);
  CHECK(sum.epoch_hist_entry > 0);
  CHECK(sum.epoch_hist_chain > 0);
  CHECK(sum.epoch_rollbacks > 0);
  CHECK(sum.epoch_entries_replayed > 0);
  CHECK(sum.epoch_replica_audits > 0);
  CHECK(sum.epoch_firsts_wrong > 0);  // a lying primary's FETCH replies reached the model
}

TEST_CASE("the epoch replay sees the cluster: replicas that apply batches without their entries fail the run",
          "[sim][fs][epoch]") {
  SimConfig c;
  c.seed = 5;
  c.service = "fs";
  c.epochs = 1;
  c.sabotage_epochs = true;
  const SimResult r = bftfs::sim::run_isolated(c);
  INFO(r.scenario << "\n" << r.failure);
  REQUIRE_FALSE(r.passed);
  CHECK(r.failure.find("predicates hold where applied (property 11)") != std::string::npos);
}

TEST_CASE("the replicas' audit objects to an EPOCH that did not apply but changed the tree", "[sim][fs][epoch]") {
  fstest::FsOptions o;
  o.root_mode = 0777;
  fstest::FsService fs(static_cast<bftfs::SnapshotStore*>(nullptr), o);
  LeakyEpochs leaky(fs);
  bftfs::sim::StreamOpAudit audit(leaky, fs);
  // An EPOCH whose prev is not the stream's last applied epoch: verdict CHAIN, and nothing may change.
  const fstest::Request epoch{{fstest::epoch_op(1, 2, 1, {})}};
  (void)audit.execute(bftfs::ExecContext{1, 7, 1, 1000}, fstest::encode_request(epoch));
  CHECK(audit.audited() == 1);
  CHECK(audit.violation().find("all or nothing (property 12)") != std::string::npos);

  fstest::FsService honest_fs(static_cast<bftfs::SnapshotStore*>(nullptr), o);
  bftfs::sim::StreamOpAudit honest(honest_fs, honest_fs);
  (void)honest.execute(bftfs::ExecContext{1, 7, 1, 1000}, fstest::encode_request(epoch));
  const fstest::Request empty_epoch{{fstest::epoch_op(1, 1, 0, {})}};  // applies: the stream's first epoch
  (void)honest.execute(bftfs::ExecContext{2, 7, 2, 2000}, fstest::encode_request(empty_epoch));
  CHECK(honest.audited() == 2);
  CHECK(honest.violation().empty());
}
