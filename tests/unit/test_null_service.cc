// The null service of the micro-benchmarks and the in-memory snapshot store.
#include <catch2/catch.hpp>

#include <cstdint>

#include "protocol/messages.h"
#include "services/null_service.h"

using namespace bftfs;

namespace {

Bytes exec(NullService& s, std::uint64_t seq, const Bytes& op) {
  ExecContext ctx;
  ctx.seq = seq;
  ctx.client = 4;
  ctx.request_id = seq;
  return s.execute(ctx, op);
}

}  // namespace

TEST_CASE("null op carries the result size and is padded to the argument size") {
  CHECK(null_op(0, 0).size() == 4);
  CHECK(null_op(4096, 0).size() == 4096);
  const Bytes op = null_op(8, 300);
  CHECK(op.size() == 8);
  CHECK(op[0] == (300 & 0xFF));
  CHECK(op[1] == (300 >> 8));
}

TEST_CASE("null service returns a result of the requested size") {
  NullService s(nullptr);
  CHECK(exec(s, 1, null_op(0, 0)).empty());
  CHECK(exec(s, 1, null_op(1024, 4096)).size() == 4096);
  CHECK(exec(s, 2, null_op(4, 1)).size() == 1);
  // Malformed: too short for the size field, or a size over the limit. An empty result, deterministically.
  CHECK(exec(s, 3, Bytes{1, 2}).empty());
  Bytes too_big(4, 0xFF);
  CHECK(exec(s, 3, too_big).empty());
}

TEST_CASE("null service answers read-only requests without changing state") {
  NullService s(nullptr);
  const CheckpointId before = s.checkpoint(0);
  Bytes out;
  REQUIRE(s.execute_read_only(4, null_op(0, 64), out));
  CHECK(out.size() == 64);
  CHECK_FALSE(s.execute_read_only(4, Bytes{1}, out));
  CHECK(s.checkpoint(0).digest == before.digest);
}

TEST_CASE("null service state counts executions: checkpoints change, rollback restores") {
  NullService a(nullptr);
  NullService b(nullptr);
  const CheckpointId zero = a.checkpoint(0);
  exec(a, 1, null_op(0, 0));
  exec(b, 1, null_op(0, 0));
  const CheckpointId one = a.checkpoint(1);
  CHECK(one.digest != zero.digest);
  CHECK(b.checkpoint(1).digest == one.digest);  // deterministic

  exec(a, 2, null_op(0, 0));
  exec(a, 3, null_op(0, 0));
  a.rollback_to(1);
  CHECK(a.checkpoint(1).digest == one.digest);
  CHECK(a.read_partition(1, 0) == b.read_partition(1, 0));
}

TEST_CASE("null service restarts from its snapshot and installs a peer's checkpoint") {
  MemorySnapshotStore store;
  CheckpointId id;
  {
    NullService s(&store);
    for (std::uint64_t seq = 1; seq <= 3; ++seq) exec(s, seq, null_op(0, 0));
    id = s.checkpoint(3);
  }
  NullService restarted(&store);
  CHECK(restarted.recovered_checkpoint().seq == 3);
  CHECK(restarted.recovered_checkpoint().digest == id.digest);

  NullService fresh(nullptr);
  fresh.begin_install(3);
  fresh.install_partition(0, restarted.read_partition(3, 0));
  CHECK(fresh.finish_install(3).digest == id.digest);

  fresh.begin_install(4);
  fresh.install_partition(0, Bytes{1});  // not a count
  CHECK(fresh.finish_install(4).digest.is_zero());
  CHECK(fresh.checkpoint_tree(3).root() == id.digest);
}

TEST_CASE("memory snapshot store keeps the last put of each name") {
  MemorySnapshotStore store;
  Bytes out;
  CHECK_FALSE(store.get("a", out));
  store.put("a", Bytes{1, 2});
  store.put("b", Bytes{3});
  store.put("a", Bytes{4});
  REQUIRE(store.get("a", out));
  CHECK(out == Bytes{4});
  REQUIRE(store.get("b", out));
  CHECK(out == Bytes{3});
}
