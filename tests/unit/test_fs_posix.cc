// POSIX semantics of the file service, op by op (the harness checks the service's invariants after each request).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include "test_fs_util.h"

using namespace fstest;

TEST_CASE("fs root is a directory owned by root with '.' and '..' pointing at itself", "[fs]") {
  Harness h;
  const Attr a = h.attr(kRoot);
  CHECK(a.type == FileType::kDirectory);
  CHECK(a.mode == small_options().root_mode);
  CHECK(a.uid == 0);
  CHECK(a.nlink == 2);
  CHECK(h.ok(lookup(kRoot, "..")).attr.ino == kRootIno);
  CHECK(h.ok(lookup(kRoot, ".")).attr.ino == kRootIno);
}

TEST_CASE("fs create returns attributes that lookup and getattr agree on", "[fs]") {
  Harness h;
  const OpResult c = h.ok(create(kRoot, "f", 0640, true, user(1000, 100)));
  CHECK(c.attr.type == FileType::kRegular);
  CHECK(c.attr.mode == 0640);
  CHECK(c.attr.uid == 1000);
  CHECK(c.attr.gid == 100);
  CHECK(c.attr.nlink == 1);
  CHECK(c.attr.size == 0);
  CHECK(c.attr.atime_ns == h.time_ns);
  CHECK(c.attr.mtime_ns == h.time_ns);
  CHECK(c.attr.ctime_ns == h.time_ns);
  CHECK(h.ok(lookup(kRoot, "f")).attr == c.attr);
  CHECK(h.attr(c.attr.handle()) == c.attr);
  CHECK(h.err_of(lookup(kRoot, "g")) == err::kNoEnt);
}

TEST_CASE("fs exclusive create of an existing name is EEXIST and a plain create opens it", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.make_dir(kRoot, "d");
  CHECK(h.err_of(create(kRoot, "f", 0644, true)) == err::kExist);
  CHECK(h.ok(create(kRoot, "f", 0600, false)).attr.handle() == f);
  CHECK(h.attr(f).mode == 0644);  // opening does not change the mode
  CHECK(h.err_of(create(kRoot, "d", 0644, false)) == err::kIsDir);
  CHECK(h.err_of(mkdir(kRoot, "f")) == err::kExist);
  CHECK(h.err_of(create(kRoot, ".", 0644, true)) == err::kExist);
}

TEST_CASE("fs names: 255 bytes work, 256 are ENAMETOOLONG, '/' is EINVAL, empty is ENOENT", "[fs]") {
  Harness h;
  const std::string longest(255, 'n');
  h.make_file(kRoot, longest);
  CHECK(h.ok(lookup(kRoot, longest)).err == err::kOk);
  CHECK(h.err_of(create(kRoot, std::string(256, 'n'))) == err::kNameTooLong);
  CHECK(h.err_of(lookup(kRoot, std::string(256, 'n'))) == err::kNameTooLong);
  CHECK(h.err_of(create(kRoot, "a/b")) == err::kInval);
  CHECK(h.err_of(create(kRoot, std::string("a\0b", 3))) == err::kInval);
  CHECK(h.err_of(create(kRoot, "")) == err::kNoEnt);
  const OpResult r = h.ok(readdir(kRoot, 0, 10));
  REQUIRE(r.entries.size() == 3);
  CHECK(r.entries[2].name == longest);
}

TEST_CASE("fs write then read returns the bytes; holes read as zeros; reads stop at EOF", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  CHECK(h.ok(write(f, 0, std::string("hello"))).count == 5);
  const OpResult w = h.ok(write(f, 200000, std::string("world")));  // leaves a hole across blocks
  CHECK(w.attr.size == 200005);
  // Only what was written is stored: "hello" (one 512-byte unit) and the partial block up to "world".
  CHECK(w.attr.blocks == (5 + (200005 - 3 * kBlockBytes) + 511) / 512);
  OpResult r = h.ok(read(f, 0, 5));
  CHECK(str(r.data) == "hello");
  CHECK_FALSE(r.eof);
  r = h.ok(read(f, 5, 100));
  CHECK(r.data == Bytes(100, 0));
  r = h.ok(read(f, 199998, 100));
  CHECK(r.data == Bytes({0, 0, 'w', 'o', 'r', 'l', 'd'}));
  CHECK(r.eof);
  r = h.ok(read(f, 1'000'000, 10));
  CHECK(r.data.empty());
  CHECK(r.eof);
}

TEST_CASE("fs truncate down discards data and truncate up exposes zeros", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  Bytes data(3 * kBlockBytes, 0);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i % 251 + 1);
  h.ok(write(f, 0, data));
  CHECK(h.attr(f).blocks == 3 * (kBlockBytes / 512));
  CHECK(h.ok(truncate(f, kBlockBytes + 10)).attr.size == kBlockBytes + 10);
  CHECK(h.attr(f).blocks == kBlockBytes / 512 + 1);
  h.ok(truncate(f, 3 * kBlockBytes));
  const OpResult r = h.ok(read(f, kBlockBytes, 20));
  CHECK(std::equal(r.data.begin(), r.data.begin() + 10, data.begin() + kBlockBytes));
  CHECK(Bytes(r.data.begin() + 10, r.data.end()) == Bytes(10, 0));
  CHECK(h.ok(read(f, 2 * kBlockBytes, 100)).data == Bytes(100, 0));
  h.ok(truncate(f, 0));
  CHECK(h.attr(f).blocks == 0);
  CHECK(h.attr(f).size == 0);
}

TEST_CASE("fs a large file spreads over many partitions and reads back", "[fs]") {
  FsOptions o = small_options();
  o.partitions = 1024;
  Harness h(o);
  const Handle f = h.make_file(kRoot, "big");
  h.svc.checkpoint(h.seq);
  const std::uint64_t chunk = kIoBytesMax;
  for (std::uint64_t i = 0; i < 16; ++i) {  // 8 MiB: twice a partition's limit
    Bytes d(chunk, static_cast<std::uint8_t>(i + 1));
    h.ok(write(f, i * chunk, d));
  }
  const CheckpointId before = h.svc.checkpoint(h.seq);
  std::uint64_t nonempty = 0;
  for (std::uint64_t p = 0; p < o.partitions; ++p) {
    if (h.svc.read_partition(before.seq, p).size() > 4) ++nonempty;
  }
  CHECK(nonempty > 100);  // 128 blocks, hashed
  for (std::uint64_t i = 0; i < 16; ++i) {
    const OpResult r = h.ok(read(f, i * chunk + chunk - 2, 4));
    CHECK(r.data[0] == static_cast<std::uint8_t>(i + 1));
    if (i + 1 < 16) CHECK(r.data[3] == static_cast<std::uint8_t>(i + 2));
  }
}

TEST_CASE("fs offsets beyond the maximum file size are EFBIG", "[fs]") {
  FsOptions o = small_options();
  o.file_bytes_max = 1 << 20;
  Harness h(o);
  const Handle f = h.make_file(kRoot, "f");
  CHECK(h.err_of(write(f, (1 << 20) - 1, std::string("ab"))) == err::kFBig);
  CHECK(h.ok(write(f, (1 << 20) - 2, std::string("ab"))).attr.size == 1 << 20);
  CHECK(h.err_of(write(f, UINT64_MAX, std::string("a"))) == err::kFBig);
  CHECK(h.err_of(truncate(f, (1 << 20) + 1)) == err::kFBig);
}

TEST_CASE("fs data capacity gives ENOSPC deterministically and removal frees it", "[fs]") {
  FsOptions o = small_options();
  o.capacity_bytes = 4 * kBlockBytes;
  Harness h(o);
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, Bytes(3 * kBlockBytes, 1)));
  CHECK(h.ok(statfs(kRoot)).statfs.bfree == 1);
  CHECK(h.err_of(write(f, 3 * kBlockBytes, Bytes(kBlockBytes + 1, 2))) == err::kNoSpc);
  CHECK(h.attr(f).size == 3 * kBlockBytes);  // the failed write left nothing
  h.ok(write(f, 3 * kBlockBytes, Bytes(kBlockBytes, 2)));
  CHECK(h.err_of(write(f, 10 * kBlockBytes, std::string("x"))) == err::kNoSpc);
  h.ok(write(f, 0, std::string("overwrite in place needs no space")));
  h.ok(remove(kRoot, "f"));
  CHECK(h.ok(statfs(kRoot)).statfs.bfree == 4);
}

TEST_CASE("fs inode capacity gives ENOSPC", "[fs]") {
  FsOptions o = small_options();
  o.inodes_max = 3;
  Harness h(o);
  h.make_file(kRoot, "a");
  h.make_dir(kRoot, "b");
  CHECK(h.err_of(create(kRoot, "c")) == err::kNoSpc);
  CHECK(h.err_of(symlink(kRoot, "c", "a")) == err::kNoSpc);
  CHECK(h.ok(statfs(kRoot)).statfs.ffree == 0);
  h.ok(remove(kRoot, "a"));
  h.make_file(kRoot, "c");
}

TEST_CASE("fs a handle goes stale when its inode number is reused", "[fs]") {
  Harness h;
  const Handle a = h.make_file(kRoot, "a");
  h.ok(write(a, 0, std::string("old")));
  h.ok(remove(kRoot, "a"));
  CHECK(h.err_of(getattr(a)) == err::kStale);
  const Handle b = h.make_file(kRoot, "b");
  CHECK(b.ino == a.ino);  // lowest free number first
  CHECK(b.generation == a.generation + 1);
  CHECK(h.err_of(getattr(a)) == err::kStale);
  CHECK(h.err_of(read(a, 0, 3)) == err::kStale);
  CHECK(h.err_of(write(a, 0, std::string("x"))) == err::kStale);
  CHECK(h.ok(read(b, 0, 3)).data.empty());  // the new file does not see the old data
  CHECK(h.err_of(getattr(Handle::of(999, 1))) == err::kStale);
  CHECK(h.err_of(getattr(Handle::of(0, 0))) == err::kStale);
}

TEST_CASE("fs hard links count names and the inode lives until the last one goes", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d");
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, std::string("data")));
  CHECK(h.ok(link(f, d, "g")).attr.nlink == 2);
  CHECK(h.ok(lookup(d, "g")).attr.handle() == f);
  CHECK(h.err_of(link(f, d, "g")) == err::kExist);
  CHECK(h.err_of(link(d, kRoot, "d2")) == err::kPerm);
  h.ok(remove(kRoot, "f"));
  CHECK(h.attr(f).nlink == 1);
  CHECK(str(h.ok(read(f, 0, 10)).data) == "data");
  h.ok(remove(d, "g"));
  CHECK(h.err_of(getattr(f)) == err::kStale);
}

TEST_CASE("fs unlink of an open file removes it at the last name (open files are the client's concern)", "[fs]") {
  // The service has no notion of open files: a client keeps an open-unlinked file alive by renaming it to a
  // hidden name and removing that at the last close (as NFS clients do). This pins the server side of that.
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.ok(rename(kRoot, "f", kRoot, ".bftfs-hidden-1"));
  CHECK(h.ok(getattr(f)).attr.nlink == 1);
  h.ok(remove(kRoot, ".bftfs-hidden-1"));
  CHECK(h.err_of(getattr(f)) == err::kStale);
}

TEST_CASE("fs mkdir and rmdir keep directory link counts; rmdir and remove check types", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d");
  CHECK(h.attr(kRoot).nlink == 3);
  const Handle e = h.make_dir(d, "e");
  CHECK(h.attr(d).nlink == 3);
  CHECK(h.ok(lookup(e, "..")).attr.handle() == d);
  h.make_file(d, "f");
  CHECK(h.err_of(rmdir(kRoot, "d")) == err::kNotEmpty);
  CHECK(h.err_of(rmdir(d, "f")) == err::kNotDir);
  CHECK(h.err_of(remove(d, "e")) == err::kIsDir);
  CHECK(h.err_of(rmdir(d, ".")) == err::kInval);
  CHECK(h.err_of(rmdir(d, "..")) == err::kNotEmpty);
  CHECK(h.err_of(rmdir(d, "nope")) == err::kNoEnt);
  CHECK(h.err_of(lookup(h.ok(lookup(d, "f")).attr.handle(), "x")) == err::kNotDir);
  h.ok(rmdir(d, "e"));
  h.ok(remove(d, "f"));
  CHECK(h.attr(d).nlink == 2);
  h.ok(rmdir(kRoot, "d"));
  CHECK(h.attr(kRoot).nlink == 2);
  CHECK(h.err_of(getattr(d)) == err::kStale);
}

TEST_CASE("fs rename over an existing file replaces it and frees the old inode", "[fs]") {
  Harness h;
  const Handle a = h.make_file(kRoot, "a");
  const Handle b = h.make_file(kRoot, "b");
  h.ok(write(a, 0, std::string("A")));
  h.ok(rename(kRoot, "a", kRoot, "b"));
  const std::uint64_t renamed = h.time_ns;
  CHECK(h.err_of(lookup(kRoot, "a")) == err::kNoEnt);
  CHECK(h.ok(lookup(kRoot, "b")).attr.handle() == a);
  CHECK(h.err_of(getattr(b)) == err::kStale);
  CHECK(h.attr(a).ctime_ns == renamed);
}

TEST_CASE("fs rename of a directory over an empty directory works, over a non-empty one is ENOTEMPTY", "[fs]") {
  Harness h;
  const Handle x = h.make_dir(kRoot, "x");
  const Handle y = h.make_dir(kRoot, "y");
  h.make_file(kRoot, "f");
  CHECK(h.err_of(rename(kRoot, "x", kRoot, "f")) == err::kNotDir);
  CHECK(h.err_of(rename(kRoot, "f", kRoot, "x")) == err::kIsDir);
  h.make_file(y, "inside");
  CHECK(h.err_of(rename(kRoot, "x", kRoot, "y")) == err::kNotEmpty);
  h.ok(remove(y, "inside"));
  h.ok(rename(kRoot, "x", kRoot, "y"));
  CHECK(h.ok(lookup(kRoot, "y")).attr.handle() == x);
  CHECK(h.err_of(getattr(y)) == err::kStale);
  CHECK(h.attr(kRoot).nlink == 3);
}

TEST_CASE("fs rename of a directory into its own subtree is EINVAL", "[fs]") {
  Harness h;
  const Handle a = h.make_dir(kRoot, "a");
  const Handle b = h.make_dir(a, "b");
  const Handle c = h.make_dir(b, "c");
  CHECK(h.err_of(rename(kRoot, "a", c, "a")) == err::kInval);
  CHECK(h.err_of(rename(kRoot, "a", a, "self")) == err::kInval);
  CHECK(h.err_of(rename(kRoot, "a", kRoot, ".")) == err::kInval);
  CHECK(h.err_of(rename(kRoot, "..", kRoot, "z")) == err::kInval);
  h.ok(rename(a, "b", kRoot, "b"));  // moving up is fine
}

TEST_CASE("fs rename between two names of the same inode does nothing", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  h.ok(link(f, kRoot, "g"));
  const Attr before = h.attr(f);
  h.ok(rename(kRoot, "f", kRoot, "g"));
  h.ok(rename(kRoot, "f", kRoot, "f"));
  CHECK(h.ok(lookup(kRoot, "f")).attr == before);
  CHECK(h.ok(lookup(kRoot, "g")).attr == before);
}

TEST_CASE("fs rename across directories moves '..' and both parents' link counts", "[fs]") {
  Harness h;
  const Handle p = h.make_dir(kRoot, "p");
  const Handle q = h.make_dir(kRoot, "q");
  const Handle d = h.make_dir(p, "d");
  CHECK(h.attr(p).nlink == 3);
  h.ok(rename(p, "d", q, "d2"));
  const std::uint64_t renamed = h.time_ns;
  CHECK(h.attr(p).nlink == 2);
  CHECK(h.attr(q).nlink == 3);
  CHECK(h.ok(lookup(d, "..")).attr.handle() == q);
  CHECK(h.err_of(lookup(p, "d")) == err::kNoEnt);
  CHECK(h.attr(p).mtime_ns == renamed);
  CHECK(h.attr(q).mtime_ns == renamed);
}

TEST_CASE("fs permissions: owner, group and other bits, with root bypassing", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d", 0777);
  const Handle f = h.make_file(d, "f", 0640, user(1000, 100));
  CHECK(h.err_of(write(f, 0, std::string("x"), user(1000, 100))) == err::kOk);
  CHECK(h.err_of(read(f, 0, 1, user(1001, 100))) == err::kOk);          // group may read
  CHECK(h.err_of(write(f, 0, std::string("x"), user(1001, 100))) == err::kAccess);
  CHECK(h.err_of(read(f, 0, 1, user(1002, 200))) == err::kAccess);     // other may not
  CHECK(h.err_of(read(f, 0, 1, user(1002, 200, {100}))) == err::kOk);  // supplementary group
  CHECK(h.err_of(write(f, 0, std::string("x"))) == err::kOk);           // root
  const Handle priv = h.make_dir(kRoot, "priv", 0700);
  CHECK(h.err_of(create(priv, "x", 0644, true, user(1000, 100))) == err::kAccess);
  CHECK(h.err_of(lookup(priv, "x", user(1000, 100))) == err::kAccess);
  CHECK(h.err_of(readdir(priv, 0, 10, user(1000, 100))) == err::kAccess);
  const Handle ro = h.make_dir(kRoot, "ro", 0555);
  CHECK(h.err_of(mkdir(ro, "x", 0755, user(1000, 100))) == err::kAccess);
  CHECK(h.err_of(mkdir(ro, "x", 0755)) == err::kOk);                      // root
  CHECK(h.err_of(remove(ro, "nothing", user(1000, 100))) == err::kNoEnt);  // search is allowed
  CHECK(h.err_of(rmdir(ro, "x", user(1000, 100))) == err::kAccess);
}

TEST_CASE("fs sticky directories let only the owners remove or rename an entry", "[fs]") {
  Harness h;
  const Handle tmp = h.make_dir(kRoot, "tmp", 01777);
  h.make_file(tmp, "alice", 0644, user(1000, 100));
  CHECK(h.err_of(remove(tmp, "alice", user(1001, 100))) == err::kPerm);
  CHECK(h.err_of(rename(tmp, "alice", tmp, "mine", user(1001, 100))) == err::kPerm);
  h.make_file(tmp, "bob", 0644, user(1001, 100));
  CHECK(h.err_of(rename(tmp, "bob", tmp, "alice", user(1001, 100))) == err::kPerm);  // replacing alice's
  h.ok(remove(tmp, "alice", user(1000, 100)));
  h.ok(remove(tmp, "bob"));  // root
}

TEST_CASE("fs setattr: chmod by the owner, chown by root, chgrp to an own group", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0644);
  h.ok(chown(f, 1000, 100));
  CHECK(h.err_of(chmod(f, 0600, user(1001, 100))) == err::kPerm);
  CHECK(h.ok(chmod(f, 0600, user(1000, 100))).attr.mode == 0600);
  CHECK(h.err_of(chown(f, 1001, 100, user(1000, 100))) == err::kPerm);
  Op chgrp = setattr_op(f, user(1000, 100, {200}));
  chgrp.mask = setattr::kGid;
  chgrp.gid = 200;
  CHECK(h.ok(chgrp).attr.gid == 200);
  chgrp.gid = 300;
  CHECK(h.one(chgrp).err == err::kPerm);
  // A non-member of the file's group loses S_ISGID when it sets the mode.
  CHECK(h.ok(chmod(f, 02755, user(1000, 100))).attr.mode == 0755);
}

TEST_CASE("fs a writer who does not own a file may clear its set-id bits and nothing else", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0777);
  h.ok(chmod(f, 06777));
  // What the kernel sends before a non-owner's write: the mode without S_ISUID and S_ISGID.
  CHECK(h.ok(chmod(f, 0777, user(1000, 100))).attr.mode == 0777);
  h.ok(chmod(f, 04777));
  CHECK(h.err_of(chmod(f, 0776, user(1000, 100))) == err::kPerm);   // not only the set-id bits
  CHECK(h.err_of(chmod(f, 04777, user(1000, 100))) == err::kPerm);  // no set-id bit dropped
  h.ok(chmod(f, 04775));
  CHECK(h.err_of(chmod(f, 0775, user(1000, 100))) == err::kPerm);   // no write permission
  CHECK(h.attr(f).mode == 04775);
}

TEST_CASE("fs writes and chown by non-root clear set-user-id", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0777);
  h.ok(chmod(f, 06777));
  h.ok(write(f, 0, std::string("x")));  // root keeps the bits
  CHECK(h.attr(f).mode == 06777);
  h.ok(write(f, 0, std::string("x"), user(1000, 100)));
  CHECK(h.attr(f).mode == 0777);
  h.ok(chmod(f, 06755));
  h.ok(chown(f, 5, 5));
  CHECK(h.attr(f).mode == 0755);
}

TEST_CASE("fs a write keeps set-group-id without group-exec only for a writer in the file's group", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0777);
  h.ok(chown(f, 0, 100));
  h.ok(chmod(f, 06767));
  h.ok(write(f, 0, std::string("x"), user(1000, 100)));  // in the group: only S_ISUID goes
  CHECK(h.attr(f).mode == 02767);
  h.ok(write(f, 0, std::string("x"), user(1001, 200)));  // not in the group: S_ISGID goes too
  CHECK(h.attr(f).mode == 0767);
  h.ok(chmod(f, 02767));
  h.ok(truncate(f, 0, user(1001, 200)));                  // truncation follows the same rule
  CHECK(h.attr(f).mode == 0767);
}

TEST_CASE("fs mkdir ignores set-user-id and set-group-id in its mode but keeps the sticky bit", "[fs]") {
  Harness h;
  CHECK(h.ok(mkdir(kRoot, "d", 07777)).attr.mode == 01777);
  CHECK(h.ok(create(kRoot, "f", 07777)).attr.mode == 07777);  // root creating a file keeps them
}

TEST_CASE("fs set-group-id directories pass on their group", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d", 0777);
  h.ok(chown(d, 0, 500));
  h.ok(chmod(d, 02777));
  const Attr f = h.ok(create(d, "f", 0644, true, user(1000, 100))).attr;
  CHECK(f.gid == 500);
  const Attr sub = h.ok(mkdir(d, "sub", 0755, user(1000, 100))).attr;
  CHECK(sub.gid == 500);
  CHECK((sub.mode & 02000) != 0);
}

TEST_CASE("fs setattr times: explicit needs ownership, now needs write permission", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0666, user(1000, 100));
  Op explicit_times = setattr_op(f, user(1001, 100));
  explicit_times.mask = setattr::kAtime | setattr::kMtime;
  explicit_times.atime_ns = 5;
  explicit_times.mtime_ns = 6;
  CHECK(h.one(explicit_times).err == err::kPerm);
  explicit_times.cred = user(1000, 100);
  const Attr a = h.ok(explicit_times).attr;
  CHECK(a.atime_ns == 5);
  CHECK(a.mtime_ns == 6);
  CHECK(a.ctime_ns == h.time_ns);
  Op now = setattr_op(f, user(1001, 100));
  now.mask = setattr::kAtimeNow | setattr::kMtimeNow;
  const Attr touched = h.ok(now).attr;
  CHECK(touched.mtime_ns == h.time_ns);
  h.ok(chmod(f, 0644));
  CHECK(h.one(now).err == err::kAccess);
}

TEST_CASE("fs truncation permission: write bit or ownership; not on directories", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0444, user(1000, 100));
  CHECK(h.err_of(truncate(f, 0, user(1000, 100))) == err::kOk);  // owner override (ftruncate after creat)
  CHECK(h.err_of(truncate(f, 0, user(1001, 100))) == err::kAccess);
  CHECK(h.err_of(truncate(kRoot, 0)) == err::kIsDir);
}

TEST_CASE("fs times: writes set mtime and ctime from the agreed timestamp, reads leave atime", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  const std::uint64_t created = h.time_ns;
  h.ok(write(f, 0, std::string("abc")));
  const Attr a = h.attr(f);
  CHECK(a.mtime_ns == created + 1000);
  CHECK(a.ctime_ns == created + 1000);
  CHECK(a.atime_ns == created);
  h.ok(read(f, 0, 3));
  CHECK(h.attr(f).atime_ns == created);  // noatime: reads stay read-only
  CHECK(h.attr(kRoot).mtime_ns == created);
}

TEST_CASE("fs symlinks store their target; readlink elsewhere is EINVAL", "[fs]") {
  Harness h;
  const Attr s = h.ok(symlink(kRoot, "s", "some/where")).attr;
  CHECK(s.type == FileType::kSymlink);
  CHECK(s.size == 10);
  CHECK(s.mode == 0777);
  CHECK(h.ok(readlink(s.handle())).target == "some/where");
  CHECK(h.err_of(readlink(kRoot)) == err::kInval);
  CHECK(h.err_of(symlink(kRoot, "e", "")) == err::kNoEnt);
  CHECK(h.err_of(symlink(kRoot, "l", std::string(4096, 'x'))) == err::kNameTooLong);
  CHECK(h.err_of(symlink(kRoot, "s", "x")) == err::kExist);
  CHECK(h.err_of(read(s.handle(), 0, 1)) == err::kInval);
  h.ok(symlink(kRoot, "max", std::string(4095, 'x')));
}

TEST_CASE("fs readdir lists '.', '..' and entries in cookie order and resumes from any cookie", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d");
  for (int i = 0; i < 10; ++i) h.make_file(d, "f" + std::to_string(i));
  OpResult all = h.ok(readdir(d, 0, 100));
  REQUIRE(all.entries.size() == 12);
  CHECK(all.eof);
  CHECK(all.entries[0].name == ".");
  CHECK(all.entries[0].ino == d.ino);
  CHECK(all.entries[1].name == "..");
  CHECK(all.entries[1].ino == kRootIno);
  // Pages of 5 give the same sequence.
  std::vector<DirEntry> paged;
  std::uint64_t cookie = 0;
  for (;;) {
    const OpResult page = h.ok(readdir(d, cookie, 5));
    paged.insert(paged.end(), page.entries.begin(), page.entries.end());
    if (page.eof) break;
    REQUIRE_FALSE(page.entries.empty());
    cookie = page.entries.back().cookie;
  }
  CHECK(paged == all.entries);
  for (std::size_t i = 1; i < all.entries.size(); ++i) CHECK(all.entries[i - 1].cookie < all.entries[i].cookie);
  // Removing an entry already returned and adding one moves no other entry: resuming returns exactly the
  // entries past the cookie that were there before, and the new one if its position is past it.
  const std::uint64_t resume = all.entries[5].cookie;
  h.ok(remove(d, all.entries[4].name));
  h.make_file(d, "new");
  std::vector<DirEntry> expected(all.entries.begin() + 6, all.entries.end());
  for (const DirEntry& e : h.ok(readdir(d, 0, 100)).entries) {
    if (e.name == "new" && e.cookie > resume) expected.push_back(e);
  }
  std::sort(expected.begin(), expected.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.cookie < b.cookie; });
  CHECK(h.ok(readdir(d, resume, 100)).entries == expected);
  CHECK(h.err_of(readdir(h.ok(lookup(d, "f0")).attr.handle(), 0, 10)) == err::kNotDir);
}

TEST_CASE("fs statfs reports capacity and usage; fsync validates its handle", "[fs]") {
  FsOptions o = small_options();
  Harness h(o);
  const Handle f = h.make_file(kRoot, "f");
  h.ok(write(f, 0, std::string("x")));
  const StatFs s = h.ok(statfs(kRoot)).statfs;
  CHECK(s.bsize == kBlockBytes);
  CHECK(s.blocks == o.capacity_bytes / kBlockBytes);
  CHECK(s.bfree == s.blocks - 1);
  CHECK(s.files == o.inodes_max);
  CHECK(s.ffree == o.inodes_max - 2);
  CHECK(s.namemax == 255);
  CHECK(h.ok(fsync(f)).attr.size == 1);
  h.ok(remove(kRoot, "f"));
  CHECK(h.err_of(fsync(f)) == err::kStale);
}

TEST_CASE("fs moving a directory to another parent needs write permission on it ('..' changes)", "[fs]") {
  Harness h;
  const Handle p = h.make_dir(kRoot, "p", 0777);
  const Handle q = h.make_dir(kRoot, "q", 0777);
  h.make_dir(p, "ro", 0555, user(1000, 100));
  CHECK(h.err_of(rename(p, "ro", q, "ro", user(1000, 100))) == err::kAccess);
  h.ok(rename(p, "ro", p, "renamed-in-place", user(1000, 100)));  // same parent: '..' stays
  h.ok(chmod(h.ok(lookup(p, "renamed-in-place")).attr.handle(), 0755, user(1000, 100)));
  h.ok(rename(p, "renamed-in-place", q, "ro", user(1000, 100)));
}

TEST_CASE("fs operations on the wrong kind of object give the POSIX errno", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f");
  const Handle d = h.make_dir(kRoot, "d");
  CHECK(h.err_of(read(d, 0, 1)) == err::kIsDir);
  CHECK(h.err_of(write(d, 0, std::string("x"))) == err::kIsDir);
  CHECK(h.err_of(create(f, "x")) == err::kNotDir);
  CHECK(h.err_of(mkdir(f, "x")) == err::kNotDir);
  CHECK(h.err_of(remove(f, "x")) == err::kNotDir);
  CHECK(h.err_of(rename(f, "x", kRoot, "y")) == err::kNotDir);
  CHECK(h.err_of(link(f, f, "x")) == err::kNotDir);
  CHECK(h.err_of(readlink(f)) == err::kInval);
  CHECK(h.err_of(remove(kRoot, ".")) == err::kIsDir);
  CHECK(h.err_of(link(f, kRoot, "..")) == err::kExist);
}

TEST_CASE("fs link counts stop at the maximum with EMLINK", "[fs]") {
  Harness h;
  h.check_invariants = false;  // 65000 names: checked once at the end
  const Handle f = h.make_file(kRoot, "f");
  std::uint32_t made = 1;
  while (made < kLinkMax) {
    std::vector<Op> ops;
    for (; made < kLinkMax && ops.size() < kCompoundOpsMax; ++made) {
      ops.push_back(link(f, kRoot, "l" + std::to_string(made)));
    }
    REQUIRE(h.run(ops).outcome == Outcome::kDone);
  }
  CHECK(h.attr(f).nlink == kLinkMax);
  CHECK(h.err_of(link(f, kRoot, "one-too-many")) == err::kMLink);
  CHECK(h.svc.check_invariants() == "");
}

TEST_CASE("fs readdirplus returns each entry's attributes as lookup would", "[fs]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d");
  h.make_file(d, "f", 0600);
  h.ok(symlink(d, "s", "f"));
  h.make_dir(d, "sub");
  Op plus = readdir(d, 0, 100);
  plus.code = OpCode::kReaddirPlus;
  const OpResult r = h.ok(plus);
  REQUIRE(r.entries.size() == 5);
  CHECK(r.entries[0].attr == h.attr(d));
  CHECK(r.entries[1].attr == h.attr(kRoot));
  for (std::size_t i = 2; i < r.entries.size(); ++i) {
    CHECK(r.entries[i].attr == h.ok(lookup(d, r.entries[i].name)).attr);
    CHECK(r.entries[i].attr.ino == r.entries[i].ino);
  }
  Bytes fast;
  CHECK(h.svc.execute_read_only(7, encode_request(Request{{plus}}), fast));
  plus.cred = user(1000, 100);
  h.ok(chmod(d, 0700));
  CHECK(h.err_of(plus) == err::kAccess);
}

TEST_CASE("fs mknod makes FIFOs and sockets for anyone and device nodes for root only", "[fs]") {
  Harness h;
  const Attr fifo = h.ok(mknod(kRoot, "fifo", FileType::kFifo, 0620, 0, user(1000, 100))).attr;
  CHECK(fifo.type == FileType::kFifo);
  CHECK(fifo.mode == 0620);
  CHECK(fifo.uid == 1000);
  CHECK(fifo.rdev == 0);
  CHECK(h.ok(mknod(kRoot, "sock", FileType::kSocket, 0600, 0, user(1000, 100))).attr.type == FileType::kSocket);
  CHECK(h.err_of(mknod(kRoot, "tty", FileType::kCharDevice, 0600, 0x0401, user(1000, 100))) == err::kPerm);
  const Attr tty = h.ok(mknod(kRoot, "tty", FileType::kCharDevice, 0600, 0x0401)).attr;
  CHECK(tty.rdev == 0x0401);
  CHECK(h.ok(lookup(kRoot, "tty")).attr == tty);
  CHECK(h.err_of(mknod(kRoot, "fifo", FileType::kFifo)) == err::kExist);
  // The service stores them; their I/O happens in the client's kernel.
  CHECK(h.err_of(read(fifo.handle(), 0, 1)) == err::kInval);
  CHECK(h.err_of(write(fifo.handle(), 0, std::string("x"))) == err::kInval);
  CHECK(h.err_of(truncate(fifo.handle(), 0)) == err::kInval);
  h.ok(link(fifo.handle(), kRoot, "fifo2"));
  h.ok(rename(kRoot, "fifo2", kRoot, "sock"));  // over another special file
  const OpResult list = h.ok(readdir(kRoot, 0, 10));
  REQUIRE(list.entries.size() == 5);
  const auto sock = std::find_if(list.entries.begin(), list.entries.end(), [](const DirEntry& e) {
    return e.name == "sock";
  });
  REQUIRE(sock != list.entries.end());
  CHECK(sock->type == FileType::kFifo);
  h.ok(remove(kRoot, "tty"));
}

TEST_CASE("fs append writes land at the size agreed at execution, atomically", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "log");
  h.ok(write(f, 0, std::string("one\n")));
  // Two clients appending in one order of execution: neither overwrites the other.
  const Result r = h.run({append(f, "two\n"), append(f, "three\n")});
  REQUIRE(r.outcome == Outcome::kDone);
  CHECK(r.results[0].attr.size == 8);
  CHECK(r.results[1].attr.size == 14);
  CHECK(str(h.ok(read(f, 0, 100)).data) == "one\ntwo\nthree\n");
}

TEST_CASE("fs access reports which of r, w and x the caller has", "[fs]") {
  Harness h;
  const Handle f = h.make_file(kRoot, "f", 0640, user(1000, 100));
  CHECK(h.ok(access(f, 7, user(1000, 100))).granted == 6);
  CHECK(h.ok(access(f, 7, user(1001, 100))).granted == 4);
  CHECK(h.ok(access(f, 7, user(1002, 200))).granted == 0);
  CHECK(h.ok(access(f, 7)).granted == 6);  // root: no x on a file without any x bit
  CHECK(h.ok(access(kRoot, 1, user(1002, 200))).granted == 1);
  CHECK(h.ok(access(f, 2, user(1000, 100))).granted == 2);  // only what was asked
}

TEST_CASE("fs a malformed request reports its reason in a result clients can decode", "[fs]") {
  Harness h;
  Op bad = mknod(kRoot, "x", FileType::kFifo);
  Bytes b = encode_request(Request{{bad}});
  b[b.size() - 9] = 1;  // the node type byte: a regular file is not a MKNOD type
  const Result r = h.run_bytes(b);
  CHECK(r.outcome == Outcome::kMalformed);
  CHECK(r.stop == static_cast<std::uint8_t>(FsDecodeError::kBadNodeType));
}
