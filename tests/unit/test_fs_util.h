// Helpers for the file-service tests: op builders (what a client library will do) and a harness that executes
// requests with increasing sequence numbers and agreed timestamps, decodes the results, and checks the
// service's invariants after every request.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/prng.h"
#include "protocol/messages.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"

namespace fstest {

using namespace bftfs::fs;
using bftfs::Bytes;
using bftfs::CheckpointId;
using bftfs::Digest;
using bftfs::ExecContext;
using bftfs::kPartitionBytesMax;
using bftfs::PartitionTree;
using bftfs::Prng;
using bftfs::SnapshotStore;

inline Cred root_cred() { return Cred{0, 0, {}}; }
inline Cred user(std::uint32_t uid, std::uint32_t gid, std::vector<std::uint32_t> groups = {}) {
  return Cred{uid, gid, std::move(groups)};
}
inline const Handle kRoot = Handle::of(kRootIno, 1);

inline Op base(OpCode code, const Cred& c) {
  Op op;
  op.code = code;
  op.cred = c;
  return op;
}
inline Op lookup(Handle dir, std::string name, Cred c = root_cred()) {
  Op op = base(OpCode::kLookup, c);
  op.handle = dir;
  op.name = std::move(name);
  return op;
}
inline Op getattr(Handle h, Cred c = root_cred()) {
  Op op = base(OpCode::kGetattr, c);
  op.handle = h;
  return op;
}
inline Op fsync(Handle h, Cred c = root_cred()) {
  Op op = base(OpCode::kFsync, c);
  op.handle = h;
  return op;
}
inline Op statfs(Handle h, Cred c = root_cred()) {
  Op op = base(OpCode::kStatfs, c);
  op.handle = h;
  return op;
}
inline Op readlink(Handle h, Cred c = root_cred()) {
  Op op = base(OpCode::kReadlink, c);
  op.handle = h;
  return op;
}
inline Op create(Handle dir, std::string name, std::uint32_t mode = 0644, bool exclusive = true,
                 Cred c = root_cred()) {
  Op op = base(OpCode::kCreate, c);
  op.handle = dir;
  op.name = std::move(name);
  op.mode = mode;
  op.exclusive = exclusive;
  return op;
}
inline Op mkdir(Handle dir, std::string name, std::uint32_t mode = 0755, Cred c = root_cred()) {
  Op op = base(OpCode::kMkdir, c);
  op.handle = dir;
  op.name = std::move(name);
  op.mode = mode;
  return op;
}
inline Op symlink(Handle dir, std::string name, std::string target, Cred c = root_cred()) {
  Op op = base(OpCode::kSymlink, c);
  op.handle = dir;
  op.name = std::move(name);
  op.target = std::move(target);
  return op;
}
inline Op mknod(Handle dir, std::string name, FileType type, std::uint32_t mode = 0644, std::uint64_t rdev = 0,
                Cred c = root_cred()) {
  Op op = base(OpCode::kMknod, c);
  op.handle = dir;
  op.name = std::move(name);
  op.mode = mode;
  op.node_type = type;
  op.rdev = rdev;
  return op;
}
inline Op remove(Handle dir, std::string name, Cred c = root_cred()) {
  Op op = base(OpCode::kRemove, c);
  op.handle = dir;
  op.name = std::move(name);
  return op;
}
inline Op rmdir(Handle dir, std::string name, Cred c = root_cred()) {
  Op op = base(OpCode::kRmdir, c);
  op.handle = dir;
  op.name = std::move(name);
  return op;
}
inline Op rename(Handle from, std::string name, Handle to, std::string name2, Cred c = root_cred()) {
  Op op = base(OpCode::kRename, c);
  op.handle = from;
  op.name = std::move(name);
  op.handle2 = to;
  op.name2 = std::move(name2);
  return op;
}
inline Op link(Handle target, Handle dir, std::string name, Cred c = root_cred()) {
  Op op = base(OpCode::kLink, c);
  op.handle = target;
  op.handle2 = dir;
  op.name = std::move(name);
  return op;
}
inline Op write(Handle h, std::uint64_t offset, Bytes data, Cred c = root_cred()) {
  Op op = base(OpCode::kWrite, c);
  op.handle = h;
  op.offset = offset;
  op.data = std::move(data);
  return op;
}
inline Op write(Handle h, std::uint64_t offset, const std::string& s, Cred c = root_cred()) {
  return write(h, offset, Bytes(s.begin(), s.end()), std::move(c));
}
inline Op append(Handle h, const std::string& s, Cred c = root_cred()) {
  Op op = write(h, 0, s, std::move(c));
  op.append = true;
  return op;
}
inline Op access(Handle h, std::uint8_t want, Cred c = root_cred()) {
  Op op = base(OpCode::kAccess, c);
  op.handle = h;
  op.access = want;
  return op;
}
inline Op read(Handle h, std::uint64_t offset, std::uint32_t count, Cred c = root_cred()) {
  Op op = base(OpCode::kRead, c);
  op.handle = h;
  op.offset = offset;
  op.count = count;
  return op;
}
inline Op readdir(Handle dir, std::uint64_t cookie, std::uint32_t max, Cred c = root_cred()) {
  Op op = base(OpCode::kReaddir, c);
  op.handle = dir;
  op.cookie = cookie;
  op.count = max;
  return op;
}
inline Op setattr_op(Handle h, Cred c = root_cred()) {
  Op op = base(OpCode::kSetattr, c);
  op.handle = h;
  return op;
}
inline Op chmod(Handle h, std::uint32_t mode, Cred c = root_cred()) {
  Op op = setattr_op(h, std::move(c));
  op.mask = setattr::kMode;
  op.mode = mode;
  return op;
}
inline Op chown(Handle h, std::uint32_t uid, std::uint32_t gid, Cred c = root_cred()) {
  Op op = setattr_op(h, std::move(c));
  op.mask = setattr::kUid | setattr::kGid;
  op.uid = uid;
  op.gid = gid;
  return op;
}
inline Op truncate(Handle h, std::uint64_t size, Cred c = root_cred()) {
  Op op = setattr_op(h, std::move(c));
  op.mask = setattr::kSize;
  op.size = size;
  return op;
}
inline Op expecting_errno(Op op, std::uint32_t e) {
  op.expect.kind = ExpectKind::kErrno;
  op.expect.err = e;
  return op;
}
inline Op expecting(Op op, const OpResult& r) {
  op.expect.kind = ExpectKind::kDigest;
  op.expect.digest = op_result_digest(r);
  return op;
}
inline std::string str(const Bytes& b) { return std::string(b.begin(), b.end()); }

// A test SnapshotStore: a map that survives the services built on it.
class MemSnapshots final : public SnapshotStore {
 public:
  void put(const std::string& name, std::span<const std::uint8_t> data) override {
    blobs_[name] = Bytes(data.begin(), data.end());
  }
  bool get(const std::string& name, Bytes& out) const override {
    auto it = blobs_.find(name);
    if (it == blobs_.end()) return false;
    out = it->second;
    return true;
  }

 private:
  std::map<std::string, Bytes> blobs_;
};

// Small partition counts keep tests fast; the default (2^16) is exercised where it matters.
inline FsOptions small_options() {
  FsOptions o;
  o.partitions = 256;
  o.capacity_bytes = 64ull << 20;
  o.inodes_max = 1000;
  o.root_mode = 0777;  // tests create as several users directly under the root
  return o;
}

struct Harness {
  explicit Harness(FsOptions o = small_options(), SnapshotStore* snaps = nullptr) : svc(snaps, o) {}

  Result run(const std::vector<Op>& ops) {
    Request req{ops};
    return run_bytes(encode_request(req));
  }
  Result run_bytes(const Bytes& op) {
    ExecContext ctx;
    ctx.seq = ++seq;
    ctx.client = 7;
    ctx.request_id = seq;
    ctx.timestamp_ns = time_ns += 1000;
    const Bytes out = svc.execute(ctx, op);
    last_bytes = out;
    Result r;
    REQUIRE(decode_result(out, r) == FsDecodeError::kOk);
    if (check_invariants) REQUIRE(svc.check_invariants() == "");
    return r;
  }
  OpResult one(Op op) {
    const Result r = run({std::move(op)});
    REQUIRE(r.results.size() == 1);
    return r.results[0];
  }
  std::uint32_t err_of(Op op) { return one(std::move(op)).err; }
  // The op must succeed; returns its result.
  OpResult ok(Op op) {
    OpResult r = one(std::move(op));
    INFO("errno " << r.err);
    REQUIRE(r.err == err::kOk);
    return r;
  }
  Handle make_file(Handle dir, const std::string& name, std::uint32_t mode = 0644, Cred c = root_cred()) {
    return ok(create(dir, name, mode, true, std::move(c))).attr.handle();
  }
  Handle make_dir(Handle dir, const std::string& name, std::uint32_t mode = 0755, Cred c = root_cred()) {
    return ok(mkdir(dir, name, mode, std::move(c))).attr.handle();
  }
  Attr attr(Handle h) { return ok(getattr(h)).attr; }
  Digest digest_at_checkpoint() { return svc.checkpoint(seq).digest; }

  FsService svc;
  bool check_invariants = true;  // a full walk of the state after every request (off for very long runs)
  std::uint64_t seq = 0;
  std::uint64_t time_ns = 1'000'000;
  Bytes last_bytes;
};

}  // namespace fstest
