// The file service's wire format: round trips, precise rejections, and robustness to mutated input.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "common/prng.h"
#include "services/fs/fs_codec.h"
#include "shim/shim.h"
#include "test_fs_util.h"

using namespace fstest;

static_assert(kFsResultBytesMax <= bftfs::shim::kInnerResultBytesMax, "file-service results must fit behind the shim");

namespace {

// One op of every code, with every field the code uses set to a non-default value.
std::vector<Op> every_op() {
  const Cred c = user(1000, 100, {4, 27});
  const Handle h = Handle::of(42, 3);
  std::vector<Op> ops;
  ops.push_back(lookup(h, "name", c));
  ops.push_back(getattr(Handle::result_of(0), c));
  Op sa = setattr_op(h, c);
  sa.mask = setattr::kMode | setattr::kUid | setattr::kGid | setattr::kSize | setattr::kAtime | setattr::kMtimeNow;
  sa.mode = 04755;
  sa.uid = 5;
  sa.gid = 6;
  sa.size = 1ull << 33;
  sa.atime_ns = 77;
  ops.push_back(sa);
  ops.push_back(read(h, 1ull << 40, 4096, c));
  ops.push_back(write(h, 12345, std::string("hello"), c));
  ops.push_back(create(h, "f", 0600, true, c));
  ops.push_back(remove(h, "f", c));
  ops.push_back(mkdir(h, "d", 0700, c));
  ops.push_back(rmdir(h, "d", c));
  ops.push_back(rename(h, "a", Handle::result_of(5), "b", c));
  ops.push_back(link(Handle::result_of(5), h, "l", c));
  ops.push_back(symlink(h, "s", "../target", c));
  ops.push_back(readlink(h, c));
  ops.push_back(readdir(h, 99, 100, c));
  ops.push_back(statfs(h, c));
  ops.push_back(fsync(h, c));
  Op plus = readdir(Handle::result_of(7), 3, 1000, c);
  plus.code = OpCode::kReaddirPlus;
  ops.push_back(plus);
  ops.push_back(mknod(h, "fifo", FileType::kFifo, 0600, 0, c));
  ops.push_back(append(h, "tail", c));
  ops.push_back(access(h, 5, c));
  ops.push_back(mknod(h, "sda", FileType::kBlockDevice, 0660, 0x0800, c));
  ops[3] = expecting_errno(ops[3], err::kNoEnt);
  OpResult r;
  r.code = OpCode::kGetattr;
  ops[1] = expecting(ops[1], r);
  return ops;
}

std::vector<OpResult> every_result() {
  std::vector<OpResult> out;
  Attr a{9, 2, FileType::kCharDevice, 0600, 1, 5, 6, 10, 0, 1, 2, 3, 0x0801};
  for (std::uint8_t code = 1; code <= kFileOpCodeMax; ++code) {  // the speculation ops: test_fs_codec_speculation.cc
    OpResult r;
    r.code = static_cast<OpCode>(code);
    if (returns_attr(r.code)) r.attr = a;
    switch (r.code) {
      case OpCode::kRead:
        r.eof = true;
        r.data = Bytes{1, 2, 3};
        break;
      case OpCode::kWrite: r.count = 3; break;
      case OpCode::kAccess: r.granted = 4; break;
      case OpCode::kReadlink: r.target = "x/y"; break;
      case OpCode::kReaddir:
        r.eof = false;
        r.entries = {DirEntry{1, 1, FileType::kDirectory, ".", Attr{}},
                     DirEntry{7, 12, FileType::kRegular, "f", Attr{}}};
        break;
      case OpCode::kReaddirPlus:
        r.eof = true;
        r.entries = {DirEntry{7, 12, FileType::kRegular, "f", a}};
        break;
      case OpCode::kStatfs: r.statfs = StatFs{65536, 10, 9, 9, 100, 98, 255}; break;
      default: break;
    }
    out.push_back(r);
  }
  OpResult failed;
  failed.code = OpCode::kLookup;
  failed.err = err::kNoEnt;
  out.push_back(failed);
  return out;
}

}  // namespace

TEST_CASE("fs request of every op code round-trips canonically", "[fs]") {
  const Request req{every_op()};
  const Bytes bytes = encode_request(req);
  Request back;
  REQUIRE(decode_request(bytes, back) == FsDecodeError::kOk);
  CHECK(back == req);
  CHECK(encode_request(back) == bytes);
}

TEST_CASE("fs result of every op code round-trips canonically", "[fs]") {
  Result res;
  res.results = every_result();
  const Bytes bytes = encode_result(res);
  Result back;
  REQUIRE(decode_result(bytes, back) == FsDecodeError::kOk);
  CHECK(back == res);
  CHECK(encode_result(back) == bytes);

  Result stopped;
  stopped.outcome = Outcome::kOpFailed;
  stopped.stop = 0;
  stopped.results = {every_result().back()};
  REQUIRE(decode_result(encode_result(stopped), back) == FsDecodeError::kOk);
  CHECK(back == stopped);
}

TEST_CASE("fs request decoder names the first check that failed", "[fs]") {
  Request one{{getattr(kRoot)}};
  const Bytes good = encode_request(one);
  Request out;
  CHECK(decode_request({}, out) == FsDecodeError::kTruncated);

  Bytes b = good;
  b[0] = 2;
  CHECK(decode_request(b, out) == FsDecodeError::kBadVersion);
  b = good;
  b[1] = 0;
  CHECK(decode_request(b, out) == FsDecodeError::kBadOpCount);
  b[1] = 65;
  CHECK(decode_request(b, out) == FsDecodeError::kBadOpCount);
  b = good;
  b[2] = kOpCodeMax + 1;
  CHECK(decode_request(b, out) == FsDecodeError::kBadOpCode);
  b = good;
  b[2 + 9] = 17;  // ngroups
  CHECK(decode_request(b, out) == FsDecodeError::kTooManyGroups);
  b = good;
  b[2 + 10] = 3;  // predicate kind
  CHECK(decode_request(b, out) == FsDecodeError::kBadExpectKind);
  b = good;
  b[2 + 11] = 2;  // handle tag
  CHECK(decode_request(b, out) == FsDecodeError::kBadHandleTag);
  b = good;
  b.push_back(0);
  CHECK(decode_request(b, out) == FsDecodeError::kTrailingBytes);

  // Every strict prefix of a valid request is rejected, never accepted.
  for (std::size_t n = 0; n < good.size(); ++n) {
    CHECK(decode_request(std::span(good).first(n), out) != FsDecodeError::kOk);
  }

  CHECK(decode_request(encode_request(Request{{getattr(Handle::result_of(0))}}), out) ==
        FsDecodeError::kBadHandleRef);
  CHECK(decode_request(encode_request(Request{{remove(kRoot, "x"), getattr(Handle::result_of(0))}}), out) ==
        FsDecodeError::kBadHandleRef);
  CHECK(decode_request(encode_request(Request{{lookup(kRoot, std::string(kNameWireBytesMax + 1, 'a'))}}), out) ==
        FsDecodeError::kNameTooLongOnWire);
  Op sa = setattr_op(kRoot);
  sa.mask = setattr::kAtime | setattr::kAtimeNow;
  CHECK(decode_request(encode_request(Request{{sa}}), out) == FsDecodeError::kBadSetattrMask);
  CHECK(decode_request(encode_request(Request{{read(kRoot, 0, kIoBytesMax + 1)}}), out) ==
        FsDecodeError::kIoTooLarge);
  CHECK(decode_request(encode_request(Request{{readdir(kRoot, 0, 0)}}), out) == FsDecodeError::kBadReaddirCount);
  CHECK(decode_request(encode_request(Request{{read(kRoot, 0, kIoBytesMax), read(kRoot, 0, kIoBytesMax)}}), out) ==
        FsDecodeError::kResultTooLarge);
  CHECK(decode_request(encode_request(Request{{mknod(kRoot, "x", FileType::kRegular)}}), out) ==
        FsDecodeError::kBadNodeType);
  Op bad_append = append(kRoot, "x");
  bad_append.offset = 1;
  CHECK(decode_request(encode_request(Request{{bad_append}}), out) == FsDecodeError::kAppendWithOffset);
  CHECK(decode_request(encode_request(Request{{access(kRoot, 8)}}), out) == FsDecodeError::kBadAccessMask);
  Bytes excl = encode_request(Request{{create(kRoot, "f")}});
  excl.back() = 2;
  CHECK(decode_request(excl, out) == FsDecodeError::kBadBoolean);
}

TEST_CASE("fs result decoder rejects outcomes inconsistent with their results", "[fs]") {
  Result out;
  CHECK(decode_result(Bytes{0, 0, 0}, out) == FsDecodeError::kBadResultCount);  // done with no results
  CHECK(decode_result(Bytes{4, 0, 0}, out) == FsDecodeError::kBadOutcome);
  CHECK(decode_result(Bytes{3, 0, 0}, out) == FsDecodeError::kBadOutcome);      // malformed without a reason
  CHECK(decode_result(Bytes{3, 1, 0}, out) == FsDecodeError::kOk);
  Result failed;
  failed.outcome = Outcome::kOpFailed;
  OpResult ok;
  ok.code = OpCode::kRemove;
  failed.results = {ok};
  CHECK(decode_result(encode_result(failed), out) == FsDecodeError::kBadErrno);
}

TEST_CASE("fs decoders survive mutated input and accept only canonical bytes", "[fs]") {
  Prng prng(20261123);
  Result res;
  res.results = every_result();
  const std::vector<Bytes> seeds = {encode_request(Request{every_op()}), encode_result(res)};
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
