// The wire format of the speculation ops (docs/SPECULATION.md §5.1): round trips, precise rejections, result
// bounds, and robustness to mutated input.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/crypto.h"
#include "common/prng.h"
#include "services/fs/fs_codec.h"
#include "test_fs_speculation_util.h"

using namespace fstest;

namespace {

const Handle kFile = Handle::of(42, 3);

// Entries with each kind of expectation.
std::vector<Entry> sample_entries() {
  std::vector<Entry> out;
  out.push_back(entry_of(entry_request(100, {create(kRoot, "f"), write(Handle::result_of(1), 0, "x")})));
  out.push_back(entry_of(entry_request(101, {lookup(kRoot, "g")}), Outcome::kOpFailed, 1, err::kNoEnt));
  out.push_back(entry_of(entry_request(102, {expecting_errno(lookup(kRoot, "h"), err::kNoEnt)}),
                         Outcome::kPredicateFailed, 1, 0));
  return out;
}

// One request per speculation op (stream ops are alone in theirs), and TIME and FETCH together with file ops.
std::vector<Request> every_speculation_request() {
  std::vector<Request> out;
  out.push_back(Request{{time_op(1234), getattr(kFile), time_op(5678), read(kFile, 0, 10)}});
  out.push_back(Request{{time_op(1), fetch_trace(9, entry_request(7, {lookup(kRoot, "a"), getattr(kFile)}))}});
  out.push_back(Request{{fetch_keys({ObjectKey::super(), ObjectKey::dir_name(1, "n"), ObjectKey::data(5, 7),
                                     ObjectKey{0, Kind::kStaged, 0, std::string(20, '\x01')}})}});
  out.push_back(Request{{reserve_op(9, 4096)}});
  out.push_back(Request{{stage_op(9, 3, 4095, sample_entries())}});
  out.push_back(Request{{epoch_op(9, 3, 2, sample_entries(), 2, bftfs::digest_of(Bytes{1, 2}))}});
  out.push_back(Request{{epoch_op(9, 1, 0, {})}});
  out.push_back(Request{{stream_close_op(9)}});
  return out;
}

OpResult epoch_result(EpochVerdict v) {
  OpResult r;
  r.code = OpCode::kEpoch;
  r.verdict = v;
  r.last_before = 17;
  return r;
}

std::vector<OpResult> every_speculation_result() {
  std::vector<OpResult> out;
  OpResult t;
  t.code = OpCode::kTime;
  out.push_back(t);
  OpResult f;
  f.code = OpCode::kFetch;
  f.complete = true;
  f.facts.push_back(Fact{FactKind::kValue, ObjectKey::inode(5), Bytes{1, 2, 3}, std::nullopt});
  f.facts.push_back(Fact{FactKind::kAbsent, ObjectKey::dir_name(1, "x"), {}, std::nullopt});
  f.facts.push_back(Fact{FactKind::kNext, ObjectKey::entry(1, 3), {}, ObjectKey::entry(1, 90)});
  f.facts.push_back(Fact{FactKind::kNext, ObjectKey::data(9, 0), {}, std::nullopt});
  out.push_back(f);
  OpResult rs;
  rs.code = OpCode::kReserve;
  rs.pool_first = 12;
  rs.reserved = {ReservedInode{5, 1}, ReservedInode{77, 4}};
  out.push_back(rs);
  OpResult st;
  st.code = OpCode::kStage;
  st.parts_present = 3;
  st.staged_bytes = 1u << 20;
  out.push_back(st);
  out.push_back(epoch_result(EpochVerdict::kApplied));
  out.push_back(epoch_result(EpochVerdict::kChain));
  out.push_back(epoch_result(EpochVerdict::kStaging));
  OpResult done = epoch_result(EpochVerdict::kEntry);
  done.entry = 4;
  out.push_back(done);  // the entry ran to the end although it was expected to fail
  OpResult failed = epoch_result(EpochVerdict::kEntry);
  failed.entry = 2;
  failed.entry_outcome = Outcome::kOpFailed;
  failed.entry_stop = 1;
  failed.entry_err = err::kExist;
  failed.entry_result.push_back(OpResult{});
  failed.entry_result[0].code = OpCode::kCreate;
  failed.entry_result[0].err = err::kExist;
  out.push_back(failed);
  OpResult predicate = epoch_result(EpochVerdict::kEntry);
  predicate.entry_outcome = Outcome::kPredicateFailed;
  predicate.entry_stop = 1;
  predicate.entry_result.push_back(OpResult{});
  predicate.entry_result[0].code = OpCode::kGetattr;
  predicate.entry_result[0].attr = Attr{9, 2, FileType::kRegular, 0644, 1, 5, 6, 10, 0, 1, 2, 3, 0};
  out.push_back(predicate);
  OpResult close;
  close.code = OpCode::kStreamClose;
  out.push_back(close);
  return out;
}

FsDecodeError decode_op(const Op& op) {
  Request out;
  return decode_request(encode_request(Request{{op}}), out);
}

FsDecodeError decode_one_result(const OpResult& r) {
  Result res;
  res.results = {r};
  Result out;
  return decode_result(encode_result(res), out);
}

}  // namespace

TEST_CASE("fs speculation requests round-trip canonically and every prefix is rejected", "[fs][codec]") {
  for (const Request& req : every_speculation_request()) {
    const Bytes bytes = encode_request(req);
    Request back;
    REQUIRE(decode_request(bytes, back) == FsDecodeError::kOk);
    CHECK(back == req);
    CHECK(encode_request(back) == bytes);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      CHECK(decode_request(std::span(bytes).first(n), back) != FsDecodeError::kOk);
    }
  }
}

TEST_CASE("fs speculation results round-trip canonically", "[fs][codec]") {
  for (const OpResult& r : every_speculation_result()) {
    Result res;
    res.results = {r};
    const Bytes bytes = encode_result(res);
    Result back;
    INFO("op code " << static_cast<int>(r.code));
    REQUIRE(decode_result(bytes, back) == FsDecodeError::kOk);
    CHECK(back == res);
    CHECK(encode_result(back) == bytes);
  }
}

TEST_CASE("fs stream ops stand alone and entries hold only file ops after a TIME", "[fs][codec]") {
  Request out;
  CHECK(decode_request(encode_request(Request{{reserve_op(1, 1), getattr(kRoot)}}), out) ==
        FsDecodeError::kStreamOpNotAlone);
  CHECK(decode_request(encode_request(Request{{time_op(1), epoch_op(1, 2, 1, {})}}), out) ==
        FsDecodeError::kStreamOpNotAlone);
  CHECK(decode_request(encode_request(Request{{stream_close_op(1), stream_close_op(2)}}), out) ==
        FsDecodeError::kStreamOpNotAlone);
  // FETCH may share its request; a traced request or an entry may not hold FETCH or a stream op.
  CHECK(decode_request(encode_request(Request{{getattr(kRoot), fetch_keys({ObjectKey::super()})}}), out) ==
        FsDecodeError::kOk);
  CHECK(decode_op(fetch_trace(1, entry_request(1, {fetch_keys({ObjectKey::super()})}))) ==
        FsDecodeError::kStreamOpInEntry);
  CHECK(decode_op(fetch_trace(1, Request{{getattr(kRoot)}})) == FsDecodeError::kEntryWithoutTime);
  CHECK(decode_op(stage_op(1, 1, 0, {entry_of(entry_request(1, {reserve_op(1, 1)}))})) ==
        FsDecodeError::kStreamOpInEntry);
  CHECK(decode_op(epoch_op(1, 2, 1, {entry_of(Request{{getattr(kRoot), time_op(1)}})})) ==
        FsDecodeError::kEntryWithoutTime);
  // An entry inside an entry is never decoded: the op code stops it.
  const Op inner = epoch_op(1, 2, 1, {entry_of(entry_request(1, {getattr(kRoot)}))});
  CHECK(decode_op(epoch_op(1, 2, 1, {entry_of(entry_request(1, {inner}))})) == FsDecodeError::kStreamOpInEntry);
}

TEST_CASE("fs an entry's expectation must agree with itself and its request", "[fs][codec]") {
  const Request r = entry_request(1, {lookup(kRoot, "x")});
  const auto check = [&](Outcome o, std::uint8_t stop, std::uint32_t e) {
    return decode_op(stage_op(1, 1, 0, {entry_of(r, o, stop, e)}));
  };
  CHECK(check(Outcome::kDone, 0, 0) == FsDecodeError::kOk);
  CHECK(check(Outcome::kOpFailed, 1, err::kNoEnt) == FsDecodeError::kOk);
  CHECK(check(Outcome::kPredicateFailed, 1, 0) == FsDecodeError::kOk);
  CHECK(check(Outcome::kPredicateFailed, 1, err::kNoEnt) == FsDecodeError::kOk);  // the probe's errno
  CHECK(check(Outcome::kDone, 1, 0) == FsDecodeError::kBadEntryExpect);
  CHECK(check(Outcome::kDone, 0, err::kNoEnt) == FsDecodeError::kBadEntryExpect);
  CHECK(check(Outcome::kOpFailed, 1, 0) == FsDecodeError::kBadEntryExpect);
  CHECK(check(Outcome::kOpFailed, 2, err::kNoEnt) == FsDecodeError::kBadEntryExpect);  // beyond the ops
  CHECK(check(Outcome::kMalformed, 0, 0) == FsDecodeError::kBadEntryExpect);
}

TEST_CASE("fs speculation op fields are checked one by one", "[fs][codec]") {
  CHECK(decode_op(stage_op(1, 1, 0, {})) == FsDecodeError::kBadEntryCount);
  CHECK(decode_op(stage_op(1, 0, 0, sample_entries())) == FsDecodeError::kBadEpoch);
  CHECK(decode_op(stage_op(1, 1, kStagePartsMax, sample_entries())) == FsDecodeError::kBadPart);
  CHECK(decode_op(epoch_op(1, 4, 4, {})) == FsDecodeError::kBadEpoch);
  CHECK(decode_op(epoch_op(1, 3, 4, {})) == FsDecodeError::kBadEpoch);
  CHECK(decode_op(epoch_op(1, 5, 4, {}, kStagePartsMax)) == FsDecodeError::kOk);
  CHECK(decode_op(epoch_op(1, 5, 4, {}, kStagePartsMax + 1)) == FsDecodeError::kBadPart);
  CHECK(decode_op(reserve_op(1, 0)) == FsDecodeError::kBadReserveCount);
  CHECK(decode_op(reserve_op(1, kReserveCountMax + 1)) == FsDecodeError::kBadReserveCount);
  CHECK(decode_op(fetch_keys(std::vector<ObjectKey>(kFetchKeysMax, ObjectKey::super()))) == FsDecodeError::kOk);

  // Fields the encoder never writes wrong, patched in the bytes (offsets after a root op's 13-byte head).
  constexpr std::size_t kBody = 13;
  Request out;
  Bytes b = encode_request(Request{{fetch_keys({ObjectKey::super()})}});
  b[kBody] = 2;
  CHECK(decode_request(b, out) == FsDecodeError::kBadFetchMode);
  b = encode_request(Request{{fetch_keys({ObjectKey::super()})}});
  b[kBody + 1] = 0;  // u16 count
  CHECK(decode_request(b, out) == FsDecodeError::kBadKeyCount);
  b[kBody + 1] = 1;
  b[kBody + 3 + 8] = kKindMax + 1;  // the key's kind (after mode, count and ino)
  CHECK(decode_request(b, out) == FsDecodeError::kBadKey);
  b[kBody + 3 + 8] = 0;
  CHECK(decode_request(b, out) == FsDecodeError::kBadKey);
  CHECK(decode_op(fetch_keys({ObjectKey::dir_name(1, std::string(kKeyNameBytesMax, 'a'))})) == FsDecodeError::kOk);
  CHECK(decode_op(fetch_keys({ObjectKey::dir_name(1, std::string(kKeyNameBytesMax + 1, 'a'))})) ==
        FsDecodeError::kBadKey);
  b = encode_request(Request{{stage_op(1, 1, 0, sample_entries())}});
  b[kBody + 20] = 0x01;  // entry count 65,537
  b[kBody + 22] = 0x01;
  CHECK(decode_request(b, out) == FsDecodeError::kBadEntryCount);
}

TEST_CASE("fs speculation results bound what they hold, and every request's result fits", "[fs][codec]") {
  // FETCH's facts (768 KiB) and a 512 KiB READ do not fit one result; two FETCHes neither.
  Request out;
  CHECK(decode_request(encode_request(Request{{fetch_keys({ObjectKey::super()}), read(kFile, 0, kIoBytesMax)}}),
                       out) == FsDecodeError::kResultTooLarge);
  CHECK(decode_request(encode_request(Request{{fetch_keys({ObjectKey::super()}), fetch_keys({ObjectKey::super()})}}),
                       out) == FsDecodeError::kResultTooLarge);
  // An EPOCH's result holds the OpResult of one entry op: the largest of its inline ops, or any op's when parts
  // are staged.
  const Op small = epoch_op(1, 2, 1, {entry_of(entry_request(1, {getattr(kRoot)}))});
  const Op large = epoch_op(1, 2, 1, {entry_of(entry_request(1, {read(kFile, 0, kIoBytesMax)}))});
  CHECK(worst_case_result_bytes(small) == 5 + 20 + 5 + kAttrBytes);
  CHECK(worst_case_result_bytes(large) == 5 + 20 + 5 + kAttrBytes + 5 + kIoBytesMax);
  CHECK(worst_case_result_bytes(epoch_op(1, 2, 1, {}, 1)) == worst_case_result_bytes(large));
  CHECK(3 + worst_case_result_bytes(large) <= kFsResultBytesMax);
  CHECK(worst_case_result_bytes(reserve_op(1, kReserveCountMax)) == 5 + 10 + 16 * kReserveCountMax);

  OpResult facts;
  facts.code = OpCode::kFetch;
  for (int i = 0; i < 13; ++i) facts.facts.push_back(Fact{FactKind::kValue, ObjectKey::data(2, i), Bytes(65536), {}});
  CHECK(decode_one_result(facts) == FsDecodeError::kTooManyFacts);
  facts.facts.resize(11);
  CHECK(decode_one_result(facts) == FsDecodeError::kOk);
  facts.facts = {Fact{FactKind::kNext, ObjectKey::entry(1, 9), {}, ObjectKey::entry(1, 8)}};
  CHECK(decode_one_result(facts) == FsDecodeError::kBadFact);
  facts.facts = {Fact{FactKind::kValue, ObjectKey::data(2, 0), Bytes(kFactValueBytesMax + 1), {}}};
  CHECK(decode_one_result(facts) == FsDecodeError::kBadFact);
}

TEST_CASE("fs epoch verdicts must agree with the fields they carry", "[fs][codec]") {
  OpResult r = epoch_result(EpochVerdict::kChain);
  r.entry = 1;
  CHECK(decode_one_result(r) == FsDecodeError::kBadVerdict);
  r = epoch_result(EpochVerdict::kEntry);
  r.entry_outcome = Outcome::kOpFailed;
  r.entry_stop = 1;
  r.entry_err = err::kNoEnt;
  CHECK(decode_one_result(r) == FsDecodeError::kBadVerdict);  // no OpResult of the op that failed
  r.entry_result.push_back(OpResult{});
  r.entry_result[0].code = OpCode::kLookup;
  r.entry_result[0].err = err::kNoEnt;
  CHECK(decode_one_result(r) == FsDecodeError::kOk);
  r.entry_result[0].err = err::kExist;
  CHECK(decode_one_result(r) == FsDecodeError::kBadVerdict);  // not the errno it reports
  r.entry_result[0].err = err::kNoEnt;
  r.entry_result[0].code = OpCode::kReserve;
  CHECK(decode_one_result(r) == FsDecodeError::kStreamOpInEntry);
  r = epoch_result(EpochVerdict::kEntry);
  r.entry_err = err::kNoEnt;  // an entry that ran to the end has no errno
  CHECK(decode_one_result(r) == FsDecodeError::kBadVerdict);

  Result res;
  res.results = {epoch_result(EpochVerdict::kApplied)};
  Bytes b = encode_result(res);
  b[3 + 5] = kEpochVerdictMax + 1;
  Result out;
  CHECK(decode_result(b, out) == FsDecodeError::kBadVerdict);
  OpResult none;
  none.code = OpCode::kReserve;
  none.reserved = {ReservedInode{2, 1}};
  res.results = {none};
  b = encode_result(res);
  b[3 + 5 + 8] = 0;  // u16 count
  CHECK(decode_result(b, out) == FsDecodeError::kBadReserveCount);
}

TEST_CASE("fs entries: staged bytes, the parts digest and the matching rule", "[fs][codec]") {
  const std::vector<Entry> entries = sample_entries();
  const Bytes part = encode_entries(entries);
  std::vector<Entry> back;
  REQUIRE(decode_entries(part, back) == FsDecodeError::kOk);
  CHECK(back == entries);
  CHECK(decode_entries(Bytes{0, 0, 0, 0}, back) == FsDecodeError::kBadEntryCount);
  Bytes longer = part;
  longer.push_back(0);
  CHECK(decode_entries(longer, back) == FsDecodeError::kTrailingBytes);
  CHECK(parts_digest(std::vector<Bytes>{part, part}) != parts_digest(std::vector<Bytes>{part}));

  Result done;
  done.results = {OpResult{}, OpResult{}};
  Result failed;
  failed.outcome = Outcome::kOpFailed;
  failed.stop = 1;
  failed.results = {OpResult{}, OpResult{}};
  failed.results[1].err = err::kNoEnt;
  Result predicate = failed;
  predicate.outcome = Outcome::kPredicateFailed;
  for (const Result* actual : {&done, &failed, &predicate}) {
    Entry e = entries[0];
    set_expectation(e, *actual);
    CHECK(entry_matches(e, *actual));
  }
  CHECK(entry_matches(entries[0], done));
  CHECK_FALSE(entry_matches(entries[0], failed));
  CHECK(entry_matches(entries[1], failed));
  CHECK_FALSE(entry_matches(entries[1], predicate));
  predicate.results[1].err = err::kOk;  // the probe found the name: its predicate failed with errno 0
  CHECK(entry_matches(entries[2], predicate));
  // The probe failed itself: a handler tells the tree that errno (rename_noreplace), so it is compared too.
  predicate.results[1].err = err::kAccess;
  CHECK_FALSE(entry_matches(entries[2], predicate));
}

TEST_CASE("fs speculation decoders survive mutated input and accept only canonical bytes", "[fs][codec]") {
  Prng prng(20261127);
  std::vector<Bytes> seeds;
  for (const Request& r : every_speculation_request()) seeds.push_back(encode_request(r));
  for (const OpResult& r : every_speculation_result()) seeds.push_back(encode_result(Result{Outcome::kDone, 0, {r}}));
  for (int round = 0; round < 20000; ++round) {
    Bytes b = seeds[static_cast<std::size_t>(round) % seeds.size()];
    const std::uint64_t flips = prng.range(1, 4);
    for (std::uint64_t i = 0; i < flips; ++i) {
      switch (prng.below(3)) {
        case 0: b[prng.below(b.size())] ^= static_cast<std::uint8_t>(1u << prng.below(8)); break;
        case 1: b.resize(prng.below(b.size() + 1)); break;
        default: b.insert(b.begin() + static_cast<std::ptrdiff_t>(prng.below(b.size() + 1)),
                          static_cast<std::uint8_t>(prng.next()));
      }
      if (b.empty()) b.push_back(1);
    }
    Request req;
    if (decode_request(b, req) == FsDecodeError::kOk) REQUIRE(encode_request(req) == b);
    Result r;
    if (decode_result(b, r) == FsDecodeError::kOk) REQUIRE(encode_result(r) == b);
  }
}
