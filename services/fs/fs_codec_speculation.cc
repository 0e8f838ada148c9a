// The wire format of the speculation ops (TIME, FETCH, RESERVE, STAGE, EPOCH, STREAM_CLOSE; docs/SPECULATION.md
// §5.1) and of entries and facts: op bodies, result bodies and their bounds. fs_codec.cc holds the frame of
// requests and results and names these functions in its op table (fs_codec_internal.h).
#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "common/codec.h"
#include "common/crypto.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_codec_internal.h"

namespace bftfs::fs {

namespace {

using namespace codec_internal;

constexpr std::size_t kOpResultHeaderBytes = 1 + 4;
// An EPOCH's report without the entry's OpResult: verdict, last_before, entry, outcome, stop, err, has_result.
constexpr std::size_t kEpochReportBytes = 1 + 8 + 4 + 1 + 1 + 4 + 1;
// The largest OpResult an entry's op can give: a READ of kIoBytesMax (Attr, eof, length, data). A READDIRPLUS
// of kReaddirEntriesMax entries and a READLINK are smaller (asserted below).
constexpr std::size_t kEntryOpResultBytesMax = kOpResultHeaderBytes + kAttrBytes + 1 + 4 + kIoBytesMax;
static_assert(kEntryOpResultBytesMax >=
                  kOpResultHeaderBytes + 1 + 4 + kReaddirEntriesMax * (8 + 8 + 1 + 2 + kNameBytesMax + kAttrBytes),
              "a READ is the largest op result");
static_assert(kEntryOpResultBytesMax >= kOpResultHeaderBytes + 2 + kSymlinkBytesMax, "a READ is the largest");
// The smallest encodings, which bound a count before anything is allocated for it.
constexpr std::size_t kKeyBytesMin = 8 + 1 + 2;      // a name kind with an empty name
constexpr std::size_t kFactBytesMin = 1 + kKeyBytesMin;
constexpr std::size_t kEntryBytesMin = 1 + 1 + 4 + 4 + 2;

// ---- keys and entries ----

bool get_key(ByteReader& r, ObjectKey& k, FsDecodeError& e) {
  ByteReader probe = r;  // to tell a short input (truncated) from a key that is not one (unknown kind)
  std::uint64_t ino = 0;
  std::uint8_t kind = 0;
  if (!probe.u64(ino) || !probe.u8(kind)) return r.skip(r.remaining() + 1);
  if (kind < 1 || kind > kKindMax) return reject(r, e, FsDecodeError::kBadKey);
  std::uint16_t name_len = 0;
  if (is_name_kind(static_cast<Kind>(kind)) && probe.u16(name_len) && name_len > kKeyNameBytesMax) {
    return reject(r, e, FsDecodeError::kBadKey);
  }
  return read_key(r, k);
}

void put_entry(ByteWriter& w, const Entry& entry) {
  w.u8(static_cast<std::uint8_t>(entry.expect_outcome));
  w.u8(entry.expect_stop);
  w.u32(entry.expect_err);
  w.blob(encode_request(entry.request));
}

// The expectation agrees with itself and with the request's op count.
bool expectation_ok(const Entry& entry) {
  if (entry.expect_stop >= entry.request.ops.size()) return false;
  switch (entry.expect_outcome) {
    case Outcome::kDone: return entry.expect_stop == 0 && entry.expect_err == 0;
    case Outcome::kOpFailed: return entry.expect_err != 0;
    case Outcome::kPredicateFailed: return true;  // op #stop's errno: 0 when it succeeded with another result
    case Outcome::kMalformed: return false;
  }
  return false;
}

bool get_entry(ByteReader& r, Entry& entry, FsDecodeError& e) {
  std::uint8_t outcome = 0;
  std::uint32_t len = 0;
  std::span<const std::uint8_t> request;
  if (!r.u8(outcome) || !r.u8(entry.expect_stop) || !r.u32(entry.expect_err)) return false;
  if (outcome > static_cast<std::uint8_t>(Outcome::kPredicateFailed)) {
    return reject(r, e, FsDecodeError::kBadEntryExpect);
  }
  entry.expect_outcome = static_cast<Outcome>(outcome);
  if (!r.u32(len) || !r.view(len, request)) return false;
  const FsDecodeError inner = decode_entry_request(request, entry.request);
  if (inner != FsDecodeError::kOk) return reject(r, e, inner);
  if (!expectation_ok(entry)) return reject(r, e, FsDecodeError::kBadEntryExpect);
  return true;
}

// u32 n || n * Entry, with n in min_count..kEntriesMax.
void put_entries(ByteWriter& w, std::span<const Entry> entries) {
  BFT_ASSERT(entries.size() <= kEntriesMax);
  w.u32(static_cast<std::uint32_t>(entries.size()));
  for (const Entry& entry : entries) put_entry(w, entry);
}

bool get_entries(ByteReader& r, std::uint32_t min_count, std::vector<Entry>& out, FsDecodeError& e) {
  std::uint32_t n = 0;
  if (!r.u32(n)) return false;
  if (n < min_count || n > kEntriesMax) return reject(r, e, FsDecodeError::kBadEntryCount);
  if (n > r.remaining() / kEntryBytesMin) return r.skip(r.remaining() + 1);  // more than the bytes can hold
  out.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    Entry entry;
    if (!get_entry(r, entry, e)) return false;
    out.push_back(std::move(entry));
  }
  return true;
}

// ---- facts ----

void put_fact(ByteWriter& w, Bytes& out, const Fact& f) {
  w.u8(static_cast<std::uint8_t>(f.kind));
  encode_key(f.key, out);
  if (f.kind == FactKind::kValue) w.blob(f.value);
  if (f.kind != FactKind::kNext) return;
  w.u8(f.next.has_value() ? 1 : 0);
  if (f.next.has_value()) encode_key(*f.next, out);
}

bool get_fact(ByteReader& r, Fact& f, FsDecodeError& e) {
  std::uint8_t tag = 0;
  if (!r.u8(tag)) return false;
  if (tag < 1 || tag > static_cast<std::uint8_t>(FactKind::kNext)) return reject(r, e, FsDecodeError::kBadFact);
  f.kind = static_cast<FactKind>(tag);
  if (!get_key(r, f.key, e)) return false;
  if (f.kind == FactKind::kValue) {
    std::uint32_t len = 0;
    if (!r.u32(len)) return false;
    if (len > kFactValueBytesMax) return reject(r, e, FsDecodeError::kBadFact);
    if (!r.bytes(len, f.value)) return false;
  }
  if (f.kind != FactKind::kNext) return true;
  bool has = false;
  if (!get_bool(r, has, e)) return false;
  if (!has) return true;
  f.next.emplace();
  if (!get_key(r, *f.next, e)) return false;
  if (*f.next < f.key) return reject(r, e, FsDecodeError::kBadFact);
  return true;
}

bool get_fetch_result(ByteReader& r, OpResult& res, FsDecodeError& e) {
  std::uint32_t n = 0;
  if (!get_bool(r, res.complete, e) || !r.u32(n)) return false;
  if (n > r.remaining() / kFactBytesMin) return r.skip(r.remaining() + 1);  // more than the bytes can hold
  const std::size_t start = r.remaining();
  res.facts.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    Fact f;
    if (!get_fact(r, f, e)) return false;
    res.facts.push_back(std::move(f));
    if (start - r.remaining() > kFetchFactBytesMax) return reject(r, e, FsDecodeError::kTooManyFacts);
  }
  return true;
}

// ---- RESERVE and EPOCH results ----

bool get_reserve_result(ByteReader& r, OpResult& res, FsDecodeError& e) {
  std::uint16_t n = 0;
  if (!r.u64(res.pool_first) || !r.u16(n)) return false;
  if (n < 1 || n > kReserveCountMax) return reject(r, e, FsDecodeError::kBadReserveCount);
  res.reserved.resize(n);
  for (ReservedInode& ri : res.reserved) {
    if (!r.u64(ri.ino) || !r.u64(ri.generation)) return false;
  }
  return true;
}

void put_epoch_result(ByteWriter& w, const OpResult& res) {
  w.u8(static_cast<std::uint8_t>(res.verdict));
  w.u64(res.last_before);
  w.u32(res.entry);
  w.u8(static_cast<std::uint8_t>(res.entry_outcome));
  w.u8(res.entry_stop);
  w.u32(res.entry_err);
  BFT_ASSERT(res.entry_result.size() <= 1);
  w.u8(static_cast<std::uint8_t>(res.entry_result.size()));
}

// The fields of a verdict agree with it: only kEntry reports an entry, and its OpResult exactly when the entry
// did not run to the end (that op's errno is the report's).
bool epoch_report_ok(const OpResult& res, bool has_result) {
  if (res.verdict != EpochVerdict::kEntry) {
    return res.entry == 0 && res.entry_outcome == Outcome::kDone && res.entry_stop == 0 && res.entry_err == 0 &&
           !has_result;
  }
  switch (res.entry_outcome) {
    case Outcome::kDone: return res.entry_stop == 0 && res.entry_err == 0 && !has_result;
    case Outcome::kOpFailed: return res.entry_err != 0 && has_result;
    case Outcome::kPredicateFailed: return has_result;
    case Outcome::kMalformed: return false;
  }
  return false;
}

bool get_epoch_result(ByteReader& r, OpResult& res, FsDecodeError& e) {
  std::uint8_t verdict = 0;
  std::uint8_t outcome = 0;
  bool has_result = false;
  if (!r.u8(verdict) || !r.u64(res.last_before) || !r.u32(res.entry) || !r.u8(outcome)) return false;
  if (verdict > kEpochVerdictMax) return reject(r, e, FsDecodeError::kBadVerdict);
  if (outcome > static_cast<std::uint8_t>(Outcome::kPredicateFailed)) return reject(r, e, FsDecodeError::kBadVerdict);
  res.verdict = static_cast<EpochVerdict>(verdict);
  res.entry_outcome = static_cast<Outcome>(outcome);
  if (!r.u8(res.entry_stop) || !r.u32(res.entry_err) || !get_bool(r, has_result, e)) return false;
  if (!epoch_report_ok(res, has_result)) return reject(r, e, FsDecodeError::kBadVerdict);
  if (!has_result) return true;
  res.entry_result.resize(1);
  if (!get_op_result(r, res.entry_result[0], e, true)) return false;
  if (res.entry_result[0].err != res.entry_err) return reject(r, e, FsDecodeError::kBadVerdict);
  return true;
}

}  // namespace

namespace codec_internal {

// ---- op bodies ----

void put_time(ByteWriter& w, const Op& op) { w.u64(op.time_ns); }
bool get_time(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError&) { return r.u64(op.time_ns); }

void put_fetch(ByteWriter& w, const Op& op) {
  w.u8(static_cast<std::uint8_t>(op.fetch_mode));
  if (op.fetch_mode == FetchMode::kTrace) {
    w.u64(op.stream);
    w.blob(encode_request(op.trace));
    return;
  }
  BFT_ASSERT(!op.keys.empty());
  BFT_ASSERT(op.keys.size() <= kFetchKeysMax);
  w.u16(static_cast<std::uint16_t>(op.keys.size()));
  for (const ObjectKey& k : op.keys) {
    Bytes key;
    encode_key(k, key);
    w.bytes(key);
  }
}

bool get_fetch(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError& e) {
  std::uint8_t mode = 0;
  if (!r.u8(mode)) return false;
  if (mode > static_cast<std::uint8_t>(FetchMode::kKeys)) return reject(r, e, FsDecodeError::kBadFetchMode);
  op.fetch_mode = static_cast<FetchMode>(mode);
  if (op.fetch_mode == FetchMode::kTrace) {
    std::uint32_t len = 0;
    std::span<const std::uint8_t> traced;
    if (!r.u64(op.stream) || !r.u32(len) || !r.view(len, traced)) return false;
    const FsDecodeError inner = decode_entry_request(traced, op.trace);
    return inner == FsDecodeError::kOk || reject(r, e, inner);
  }
  std::uint16_t n = 0;
  if (!r.u16(n)) return false;
  if (n < 1 || n > kFetchKeysMax) return reject(r, e, FsDecodeError::kBadKeyCount);
  op.keys.resize(n);
  for (ObjectKey& k : op.keys) {
    if (!get_key(r, k, e)) return false;
  }
  return true;
}

void put_reserve(ByteWriter& w, const Op& op) {
  w.u64(op.stream);
  w.u16(op.reserve);
}
bool get_reserve(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError& e) {
  if (!r.u64(op.stream) || !r.u16(op.reserve)) return false;
  if (op.reserve < 1 || op.reserve > kReserveCountMax) return reject(r, e, FsDecodeError::kBadReserveCount);
  return true;
}

void put_stage(ByteWriter& w, const Op& op) {
  w.u64(op.stream);
  w.u64(op.epoch);
  w.u32(op.part);
  put_entries(w, op.entries);
}
bool get_stage(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError& e) {
  if (!r.u64(op.stream) || !r.u64(op.epoch)) return false;
  if (op.epoch == 0) return reject(r, e, FsDecodeError::kBadEpoch);
  if (!r.u32(op.part)) return false;
  if (op.part >= kStagePartsMax) return reject(r, e, FsDecodeError::kBadPart);
  return get_entries(r, 1, op.entries, e);
}

void put_epoch(ByteWriter& w, const Op& op) {
  w.u64(op.stream);
  w.u64(op.epoch);
  w.u64(op.prev);
  w.u32(op.parts);
  w.digest(op.parts_digest);
  put_entries(w, op.entries);
}
bool get_epoch(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError& e) {
  if (!r.u64(op.stream) || !r.u64(op.epoch) || !r.u64(op.prev)) return false;
  if (op.epoch <= op.prev) return reject(r, e, FsDecodeError::kBadEpoch);
  if (!r.u32(op.parts)) return false;
  if (op.parts > kStagePartsMax) return reject(r, e, FsDecodeError::kBadPart);
  return r.digest(op.parts_digest) && get_entries(r, 0, op.entries, e);
}

void put_stream_close(ByteWriter& w, const Op& op) { w.u64(op.stream); }
bool get_stream_close(ByteReader& r, const std::vector<Op>&, Op& op, FsDecodeError&) { return r.u64(op.stream); }

// ---- result bodies ----

void put_speculation_result(ByteWriter& w, const OpResult& res) {
  switch (res.code) {
    case OpCode::kFetch: {
      w.u8(res.complete ? 1 : 0);
      w.u32(static_cast<std::uint32_t>(res.facts.size()));
      Bytes body;
      ByteWriter fw(body);
      for (const Fact& f : res.facts) put_fact(fw, body, f);
      w.bytes(body);
      break;
    }
    case OpCode::kReserve:
      BFT_ASSERT(!res.reserved.empty());
      BFT_ASSERT(res.reserved.size() <= kReserveCountMax);
      w.u64(res.pool_first);
      w.u16(static_cast<std::uint16_t>(res.reserved.size()));
      for (const ReservedInode& ri : res.reserved) {
        w.u64(ri.ino);
        w.u64(ri.generation);
      }
      break;
    case OpCode::kStage:
      w.u32(res.parts_present);
      w.u64(res.staged_bytes);
      break;
    case OpCode::kEpoch:
      put_epoch_result(w, res);
      if (!res.entry_result.empty()) {
        Bytes nested;
        encode_op_result(res.entry_result[0], nested);
        w.bytes(nested);
      }
      break;
    default:
      break;  // TIME, STREAM_CLOSE, and the ops on files (fs_codec.cc) carry nothing here
  }
}

bool get_speculation_result(ByteReader& r, OpResult& res, FsDecodeError& e) {
  switch (res.code) {
    case OpCode::kFetch: return get_fetch_result(r, res, e);
    case OpCode::kReserve: return get_reserve_result(r, res, e);
    case OpCode::kStage: return r.u32(res.parts_present) && r.u64(res.staged_bytes);
    case OpCode::kEpoch: return get_epoch_result(r, res, e);
    default: return true;  // TIME, STREAM_CLOSE
  }
}

std::size_t speculation_result_body_bytes_max(const Op& op) {
  switch (op.code) {
    case OpCode::kFetch: return 1 + 4 + kFetchFactBytesMax;
    case OpCode::kReserve: return 8 + 2 + 16 * static_cast<std::size_t>(op.reserve);
    case OpCode::kStage: return 4 + 8;
    case OpCode::kEpoch: {
      // The OpResult of the op an entry stopped at: staged entries are not in view, so any op's.
      std::size_t nested = op.parts > 0 ? kEntryOpResultBytesMax : 0;
      for (const Entry& entry : op.entries) {
        for (const Op& inner : entry.request.ops) nested = std::max(nested, worst_case_result_bytes(inner));
      }
      return kEpochReportBytes + nested;
    }
    default: return 0;  // TIME, STREAM_CLOSE, and the ops on files (fs_codec.cc)
  }
}

}  // namespace codec_internal

// ---- public: entries and facts ----

Bytes encode_entries(std::span<const Entry> entries) {
  Bytes out;
  ByteWriter w(out);
  put_entries(w, entries);
  return out;
}

FsDecodeError decode_entries(std::span<const std::uint8_t> bytes, std::vector<Entry>& out) {
  ByteReader r(bytes);
  FsDecodeError e = FsDecodeError::kOk;
  std::vector<Entry> entries;
  if (!get_entries(r, 1, entries, e) || !r.done()) return reason(r, e);
  out = std::move(entries);
  return FsDecodeError::kOk;
}

Digest parts_digest(std::span<const Bytes> parts) {
  DigestBuilder b;
  for (const Bytes& part : parts) b.add(part);
  return b.finish();
}

std::size_t encoded_fact_bytes(const Fact& f) {
  std::size_t n = 1 + encoded_key_bytes(f.key);
  if (f.kind == FactKind::kValue) n += 4 + f.value.size();
  if (f.kind == FactKind::kNext) n += 1 + (f.next.has_value() ? encoded_key_bytes(*f.next) : 0);
  return n;
}

namespace {
// The errno the matching rule compares: op #stop's when the request stopped (by an op's failure or by its
// predicate: a handler tells the tree the errno of a probe whose predicate failed, e.g. rename_noreplace's
// LOOKUP, so a serial run must give the same one), none when it is done.
std::uint32_t compared_err(const Result& actual) {
  if (actual.outcome == Outcome::kDone) return 0;
  BFT_ASSERT(actual.stop < actual.results.size());
  return actual.results[actual.stop].err;
}
}  // namespace

bool entry_matches(const Entry& entry, const Result& actual) {
  if (actual.outcome == Outcome::kMalformed) return false;
  return actual.outcome == entry.expect_outcome && actual.stop == entry.expect_stop &&
         compared_err(actual) == entry.expect_err;
}

void set_expectation(Entry& entry, const Result& actual) {
  BFT_ASSERT(actual.outcome != Outcome::kMalformed);
  entry.expect_outcome = actual.outcome;
  entry.expect_stop = actual.outcome == Outcome::kDone ? 0 : actual.stop;
  entry.expect_err = compared_err(actual);
}

}  // namespace bftfs::fs
