// The parts of the local model and the epochs (spec/): the store of facts, the entry builder, the epoch log.
#include <catch2/catch.hpp>

#include <optional>
#include <vector>

#include "services/fs/fs_service.h"
#include "spec/caching_store.h"
#include "spec/entry_builder.h"
#include "spec/epoch_log.h"
#include "test_fs_speculation_util.h"

using namespace fstest;
using bftfs::spec::CachingObjectStore;
using bftfs::spec::EpochLog;

namespace {

Fact value_fact(const ObjectKey& k, Bytes v) { return Fact{FactKind::kValue, k, std::move(v), std::nullopt}; }
Fact next_fact(const ObjectKey& k, std::optional<ObjectKey> next) { return Fact{FactKind::kNext, k, {}, next}; }

// The key an unknown read reports, or nullopt if the read was answered.
template <typename F>
std::optional<ObjectKey> unknown(F&& read) {
  try {
    read();
  } catch (const UnknownKey& u) {
    return u.key;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("spec the store answers from facts, reports where they stop, and never overwrites what it knows",
          "[spec]") {
  CachingObjectStore s(16);
  const ObjectKey d1 = ObjectKey::data(9, 1);
  const ObjectKey d5 = ObjectKey::data(9, 5);
  CHECK(unknown([&] { s.get(d1); }) == d1);
  CHECK(s.insert(value_fact(d1, Bytes{1})) == CachingObjectStore::Insert::kKept);
  CHECK(s.insert(value_fact(d1, Bytes{2})) == CachingObjectStore::Insert::kKnown);
  CHECK(*s.get(d1) == Bytes{1});
  CHECK(s.insert(value_fact(ObjectKey::data(9, 2), Bytes{})) == CachingObjectStore::Insert::kInvalid);

  // A scan from data(9, 0): unknown until an interval covers [data(9, 0), data(9, 1)).
  CHECK(unknown([&] { s.first_at_or_after(ObjectKey::data(9, 0)); }) == ObjectKey::data(9, 0));
  CHECK(s.insert(next_fact(ObjectKey::data(9, 0), d1)) == CachingObjectStore::Insert::kKept);
  CHECK(s.first_at_or_after(ObjectKey::data(9, 0)) == d1);
  // Past d1 nothing is known: a scan from d1's successor stops there.
  CHECK(unknown([&] { s.first_at_or_after(ObjectKey::data(9, 2)); }) == ObjectKey::data(9, 2));
  CHECK(s.insert(next_fact(ObjectKey::data(9, 2), d5)) == CachingObjectStore::Insert::kKept);
  CHECK(s.first_at_or_after(ObjectKey::data(9, 2)) == d5);
  CHECK(unknown([&] { s.get(d5); }) == d5);  // known to exist, value unknown
  CHECK(s.insert(value_fact(d5, Bytes{5})) == CachingObjectStore::Insert::kKept);
  CHECK(*s.get(d5) == Bytes{5});
  // A key known only to exist that a newer state says is gone (the start of a next fact, or an absent fact):
  // taken, or a read of it would ask for ever (found by the simulator, sim/FINDINGS.md F11).
  {
    CachingObjectStore t(16);
    const ObjectKey d8 = ObjectKey::data(9, 8);
    CHECK(t.insert(next_fact(ObjectKey::data(9, 7), d8)) == CachingObjectStore::Insert::kKept);
    CHECK(unknown([&] { t.get(d8); }) == d8);
    CHECK(t.insert(next_fact(d8, ObjectKey::data(9, 10))) == CachingObjectStore::Insert::kKept);
    CHECK(t.get(d8) == nullptr);
    CHECK(t.first_at_or_after(ObjectKey::data(9, 7)) == ObjectKey::data(9, 10));
    const ObjectKey d12 = ObjectKey::data(9, 12);
    CHECK(t.insert(next_fact(ObjectKey::data(9, 11), d12)) == CachingObjectStore::Insert::kKept);
    CHECK(t.insert(Fact{FactKind::kAbsent, d12, {}, std::nullopt}) == CachingObjectStore::Insert::kKept);
    CHECK(t.get(d12) == nullptr);
    CHECK(t.insert(Fact{FactKind::kAbsent, d12, {}, std::nullopt}) == CachingObjectStore::Insert::kKnown);
  }

  // The model's own changes: erasing d1 lets a scan walk past it; a put inside an interval is found.
  s.erase(d1);
  CHECK(s.first_at_or_after(ObjectKey::data(9, 0)) == d5);
  s.put(ObjectKey::data(9, 3), bftfs::fs::make_value(Bytes{3}));
  CHECK(s.first_at_or_after(ObjectKey::data(9, 0)) == ObjectKey::data(9, 3));
  // Fetched facts never overwrite them: an interval over both leaves them as they are.
  CHECK(s.insert(next_fact(d1, d5)) == CachingObjectStore::Insert::kKept);
  CHECK(s.get(d1) == nullptr);
  CHECK(*s.get(ObjectKey::data(9, 3)) == Bytes{3});
  CHECK(s.insert(value_fact(ObjectKey::data(9, 3), Bytes{4})) == CachingObjectStore::Insert::kKnown);
  CHECK(s.intervals() == 1);  // [data(9, 0), d5), merged

  // Merged intervals, and the end of the key space.
  CHECK(s.insert(next_fact(ObjectKey::data(9, 6), std::nullopt)) == CachingObjectStore::Insert::kKept);
  CHECK(s.first_at_or_after(ObjectKey::data(9, 6)) == std::nullopt);
  CHECK(s.get(ObjectKey::inode(100)) == nullptr);
  CHECK(s.insert(next_fact(ObjectKey::data(9, 7), std::nullopt)) == CachingObjectStore::Insert::kKnown);

  // Undo of a key whose value was unknown forgets it.
  CHECK_FALSE(s.get_for_undo(ObjectKey::dir_name(1, "x")).has_value());
  CHECK(s.get_for_undo(ObjectKey::inode(100)).value() == nullptr);
  s.drop_except([](const ObjectKey& k) { return k == ObjectKey::data(9, 3); });
  CHECK(s.knows(ObjectKey::data(9, 3)));
  CHECK_FALSE(s.knows(d5));
  CHECK(s.intervals() == 0);
}

TEST_CASE("spec entries: TIME first, references moved, digests of what the tree saw", "[spec]") {
  const Request handler{{create(kRoot, "f"), write(Handle::result_of(0), 0, std::string("x")),
                         getattr(Handle::result_of(0)), expecting_errno(lookup(kRoot, "g"), err::kNoEnt)}};
  const Request req = bftfs::spec::with_time(handler, 42);
  REQUIRE(req.ops.size() == 5);
  CHECK(req.ops[0].code == OpCode::kTime);
  CHECK(req.ops[0].time_ns == 42);
  CHECK(req.ops[2].handle == Handle::result_of(1));
  CHECK(req.ops[3].handle == Handle::result_of(1));
  Result res;
  res.results.resize(5);
  for (std::size_t i = 0; i < 5; ++i) res.results[i].code = req.ops[i].code;
  res.results[4].err = err::kNoEnt;
  const Entry e = bftfs::spec::build_entry(req, res);
  CHECK(e.expect_outcome == Outcome::kDone);
  CHECK(e.request.ops[0].expect.kind == ExpectKind::kNone);   // TIME
  CHECK(e.request.ops[1].expect.kind == ExpectKind::kDigest);  // CREATE: the tree saw its attributes
  CHECK(e.request.ops[2].expect.kind == ExpectKind::kNone);   // WRITE: only that it succeeded
  CHECK(e.request.ops[3].expect.digest == op_result_digest(res.results[3]));
  CHECK(e.request.ops[4].expect == req.ops[4].expect);  // the handler's own predicate stays
  // "Expect success" on an op whose result the tree sees (a READ's bytes) becomes the digest of that result:
  // alone it would let the batch apply with other bytes than the tree was given.
  const Request read_req = bftfs::spec::with_time(Request{{expecting_errno(read(kRoot, 0, 10), err::kOk)}}, 43);
  Result read_res;
  read_res.results.resize(2);
  read_res.results[0].code = OpCode::kTime;
  read_res.results[1].code = OpCode::kRead;
  read_res.results[1].data = Bytes{1, 2, 3};
  const Entry r = bftfs::spec::build_entry(read_req, read_res);
  CHECK(r.request.ops[1].expect.kind == ExpectKind::kDigest);
  CHECK(r.request.ops[1].expect.digest == op_result_digest(read_res.results[1]));
  Request back;
  CHECK(decode_request(encode_request(Request{{stage_op(1, 1, 0, {e})}}), back) == FsDecodeError::kOk);

  Result stopped;
  stopped.outcome = Outcome::kOpFailed;
  stopped.stop = 1;
  stopped.results = {res.results[0], OpResult{}};
  stopped.results[1].code = OpCode::kCreate;
  stopped.results[1].err = err::kExist;
  const Entry f = bftfs::spec::build_entry(req, stopped);
  CHECK(f.expect_err == err::kExist);
  CHECK(f.request == req);  // no predicates added
  const Result view = bftfs::spec::without_time(stopped);
  CHECK(view.stop == 0);
  CHECK(view.results.size() == 1);
}

TEST_CASE("spec the epoch log stages full parts, seals inline rest, and chains epochs", "[spec]") {
  EpochLog log(3, 400);
  std::vector<Entry> entries;
  std::vector<Request> stages;
  for (int i = 0; i < 12; ++i) {
    entries.push_back(entry_of(entry_request(static_cast<std::uint64_t>(i), {create(kRoot, "n" + std::to_string(i))})));
    if (std::optional<Request> st = log.append(entries.back())) stages.push_back(*st);
  }
  REQUIRE(stages.size() >= 2);
  std::vector<Bytes> parts;
  std::size_t staged_entries = 0;
  for (std::size_t p = 0; p < stages.size(); ++p) {
    const Op& op = stages[p].ops[0];
    CHECK(op.code == OpCode::kStage);
    CHECK(op.epoch == 1);
    CHECK(op.part == p);
    parts.push_back(encode_entries(op.entries));
    CHECK(parts.back().size() <= 400);
    staged_entries += op.entries.size();
  }
  const bftfs::spec::SealedEpoch s1 = log.seal();
  const Op& e1 = s1.request.ops[0];
  CHECK(s1.epoch == 1);
  CHECK(s1.prev == 0);
  CHECK(e1.parts == stages.size());
  CHECK(e1.parts_digest == parts_digest(parts));
  CHECK(staged_entries + e1.entries.size() == entries.size());
  Request back;
  CHECK(decode_request(encode_request(s1.request), back) == FsDecodeError::kOk);

  CHECK(log.open_epoch() == 2);
  const bftfs::spec::SealedEpoch s2 = log.seal();
  const bftfs::spec::SealedEpoch s3 = log.seal();
  CHECK(s2.prev == 1);
  CHECK(s3.prev == 2);
  CHECK(s3.request.ops[0].parts == 0);
  CHECK(log.descends_from(3, 1));
  CHECK_FALSE(log.descends_from(1, 2));
  log.committed(1);
  // Epoch 2 fails: 3 and the open epoch 4 go with it; the re-run is 5, chained to 1.
  log.failed(2);
  CHECK(log.open_epoch() == 5);
  CHECK_FALSE(log.descends_from(3, 1));
  const bftfs::spec::SealedEpoch s5 = log.seal();
  CHECK(s5.epoch == 5);
  CHECK(s5.prev == 1);
  CHECK(log.descends_from(5, 1));
}
