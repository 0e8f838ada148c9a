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
  // Over a given store (the replica's disk store in test_fs_disk_store.cc).
  Harness(std::unique_ptr<CheckpointedStore> store, FsOptions o) : svc(std::move(store), o) {}

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

// A random workload over a small namespace, with several users: every op kind, successes and failures. It
// draws handles from those the service returned so far (as a client would), so most ops meet real objects.
class Workload {
 public:
  explicit Workload(std::uint64_t seed) : prng_(seed) {}

  std::vector<Op> next() {
    static const std::vector<std::string> names = {"a", "b", "c", "d", "e", "f"};
    const Cred creds[] = {root_cred(), root_cred(), user(1000, 100), user(1001, 100), user(1002, 200, {100})};
    const auto name = [&] { return names[prng_.below(names.size())]; };
    std::vector<Op> ops;
    const std::size_t n = prng_.range(1, 3);
    for (std::size_t i = 0; i < n; ++i) {
      // A directory or a file the client knows (sometimes the other kind, a result reference or a stale one).
      const auto handle = [&](bool dir) {
        if (i > 0 && prng_.chance(1, 6)) return Handle::result_of(static_cast<std::uint8_t>(prng_.below(i)));
        if (prng_.chance(1, 30)) return Handle::of(prng_.range(1, 12), prng_.range(1, 3));
        if (prng_.chance(1, 15)) dir = !dir;
        const std::vector<Handle>& pool = dir || files_.empty() ? dirs_ : files_;
        return pool[prng_.below(pool.size())];
      };
      const Cred c = creds[prng_.below(5)];
      const Handle d = handle(true);
      const Handle d2 = handle(true);
      const Handle f = handle(false);
      const std::string n1 = name();
      const std::string n2 = name();
      const std::uint64_t offset = prng_.below(300000);
      const std::uint64_t length = prng_.range(1, 70000);
      const auto fill = static_cast<std::uint8_t>(prng_.next());
      Op op;
      switch (prng_.below(18)) {
        case 0: op = lookup(d, n1, c); break;
        case 1: op = getattr(f, c); break;
        case 2: op = chmod(prng_.chance(1, 2) ? f : d, static_cast<std::uint32_t>(prng_.below(010000)), c); break;
        case 3: op = read(f, offset, static_cast<std::uint32_t>(length), c); break;
        case 4:
        case 5: op = write(f, offset, Bytes(length, fill), c); break;
        case 6: op = create(d, n1, static_cast<std::uint32_t>(prng_.below(01000)), prng_.chance(1, 2), c); break;
        case 7: op = remove(d, n1, c); break;
        case 8: op = mkdir(d, n1, 0777, c); break;
        case 9: op = rmdir(d, n1, c); break;
        case 10: op = rename(d, n1, d2, n2, c); break;
        case 11: op = link(f, d2, n1, c); break;
        case 12: op = symlink(d, n1, "t" + n2, c); break;
        case 13: op = readdir(d, prng_.below(8), static_cast<std::uint32_t>(prng_.range(1, 5)), c); break;
        case 14: op = truncate(f, offset, c); break;
        case 15: op = chown(f, 1000 + static_cast<std::uint32_t>(prng_.below(3)), 100, c); break;
        case 16: op = mknod(d, n1, static_cast<FileType>(prng_.range(4, 7)), 0644, length, c); break;
        default: op = statfs(d, c); break;
      }
      if (op.code == OpCode::kReaddir && prng_.chance(1, 2)) op.code = OpCode::kReaddirPlus;
      if (op.code == OpCode::kWrite && prng_.chance(1, 4)) {
        op.append = true;
        op.offset = 0;
      }
      if (op.code == OpCode::kStatfs && prng_.chance(1, 2)) {
        op = access(f, static_cast<std::uint8_t>(prng_.below(8)), c);
      }
      if (prng_.chance(1, 10)) op = expecting_errno(op, prng_.chance(1, 2) ? err::kOk : err::kNoEnt);
      ops.push_back(op);
    }
    return ops;
  }

  // Remembers the handles a result returned (at most 20 of each kind, replacing at random).
  void learn(const Result& r) {
    for (const OpResult& res : r.results) {
      if (res.err != err::kOk || !returns_attr(res.code)) continue;
      if (res.attr.type != FileType::kDirectory && res.attr.type != FileType::kRegular) continue;
      std::vector<Handle>& pool = res.attr.type == FileType::kDirectory ? dirs_ : files_;
      if (pool.size() < 20) {
        pool.push_back(res.attr.handle());
      } else {
        pool[prng_.below(pool.size())] = res.attr.handle();
      }
    }
  }

  // Runs one request on `h` and learns from it.
  void step(Harness& h) { learn(h.run(next())); }

 private:
  Prng prng_;
  std::vector<Handle> dirs_{kRoot};
  std::vector<Handle> files_;
};


}  // namespace fstest
