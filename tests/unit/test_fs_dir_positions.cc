// Directory positions (readdir cookies, docs/FILESERVICE.md §7): derived from names, stable for a name across
// rename, removal and re-creation, probed past collisions without ever moving an entry, the same on every
// replica and across checkpoints, state transfer and restarts; and a listing that renames each entry it returns
// away and back ends and returns every entry once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/codec.h"
#include "services/fs/object_store.h"
#include "test_fs_util.h"

using namespace fstest;

namespace {

// Every entry of `dir` but '.' and '..', name -> position, read in pages of `page` (checking the positions
// increase and the listing ends).
std::map<std::string, std::uint64_t> positions(Harness& h, Handle dir, std::uint32_t page = 7) {
  std::map<std::string, std::uint64_t> out;
  std::uint64_t cookie = 0;
  for (;;) {
    const OpResult r = h.ok(readdir(dir, cookie, page));
    for (const DirEntry& e : r.entries) {
      REQUIRE(e.cookie > cookie);
      cookie = e.cookie;
      if (e.name != "." && e.name != "..") REQUIRE(out.emplace(e.name, e.cookie).second);
    }
    if (r.eof) return out;
    REQUIRE_FALSE(r.entries.empty());
  }
}

std::uint64_t position_of(Harness& h, Handle dir, const std::string& name) {
  const auto all = positions(h, dir);
  const auto it = all.find(name);
  REQUIRE(it != all.end());
  return it->second;
}

// The program of the issue, in process: list `dir` in pages of `page` entries, resuming from the last cookie
// returned, and rename every entry returned to a temporary name and back before reading on. Returns the names
// in the order returned (at most `limit`).
std::vector<std::string> list_renaming_each(Harness& h, Handle dir, std::uint32_t page, OpCode code,
                                            std::size_t limit) {
  std::vector<std::string> seen;
  std::uint64_t cookie = 2;  // past '.' and '..'
  for (;;) {
    Op op = readdir(dir, cookie, page);
    op.code = code;
    const OpResult r = h.ok(op);
    for (const DirEntry& e : r.entries) {
      seen.push_back(e.name);
      cookie = e.cookie;
      h.ok(rename(dir, e.name, dir, e.name + ".moving"));
      h.ok(rename(dir, e.name + ".moving", dir, e.name));
    }
    if (r.eof || seen.size() >= limit) return seen;
  }
}

std::vector<std::string> file_names(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back("file-" + std::to_string(i));
  return names;
}

// Options whose directories have only `n` positions: collisions are the rule, not a 2^-63 accident.
FsOptions tiny(std::uint64_t n) {
  FsOptions o = small_options();
  o.dir_positions = n;
  return o;
}

// The position each of `candidates` takes in `dir` when it is alone there, i.e. its home (positions depend on
// the directory, so this is learnt in the directory itself). `dir` must be empty; it is empty again after.
std::map<std::string, std::uint64_t> homes(Harness& h, Handle dir, const std::vector<std::string>& candidates) {
  std::map<std::string, std::uint64_t> out;
  for (const std::string& n : candidates) {
    h.make_file(dir, n);
    out[n] = position_of(h, dir, n);
    h.ok(remove(dir, n));
  }
  return out;
}

// Names among `candidates` whose home is `home`.
std::vector<std::string> with_home(const std::map<std::string, std::uint64_t>& homes, std::uint64_t home) {
  std::vector<std::string> out;
  for (const auto& [n, p] : homes) {
    if (p == home) out.push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("fs an entry renamed away and back, or removed and made again, returns to its position", "[fs][readdir]") {
  Harness h;
  const Handle d = h.make_dir(kRoot, "d");
  const Handle other = h.make_dir(kRoot, "other");
  const std::vector<std::string> names = file_names(60);
  for (const std::string& n : names) h.make_file(d, n);
  const auto before = positions(h, d);
  REQUIRE(before.size() == names.size());
  for (const auto& [n, p] : before) {
    CHECK(p >= 3);
    CHECK(p <= (1ull << 63) - 1);  // a kernel directory offset (loff_t) can name it
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (i % 3 == 0) {
      h.ok(rename(d, n, d, n + ".tmp"));
      h.ok(rename(d, n + ".tmp", d, n));
    } else if (i % 3 == 1) {
      h.ok(remove(d, n));
      h.make_file(d, n);
    } else {
      h.ok(rename(d, n, other, n));  // to another directory and back
      h.ok(rename(other, n, d, n));
    }
  }
  CHECK(positions(h, d) == before);
  // A directory made again under the same name is a new directory (a new generation of its number or another
  // number): its entries need not keep the old positions, but its listing is as complete.
  for (const std::string& n : names) h.ok(remove(d, n));
  h.ok(rmdir(kRoot, "d"));
  const Handle again = h.make_dir(kRoot, "d");
  for (const std::string& n : names) h.make_file(again, n);
  CHECK(positions(h, again).size() == names.size());
}

TEST_CASE("fs positions depend on the names, not on the order they were made in", "[fs][readdir]") {
  Harness a;
  Harness b;
  const Handle da = a.make_dir(kRoot, "d");
  const Handle db = b.make_dir(kRoot, "d");
  REQUIRE(da == db);
  const std::vector<std::string> names = file_names(40);
  for (const std::string& n : names) a.make_file(da, n);
  for (auto it = names.rbegin(); it != names.rend(); ++it) b.make_file(db, *it);
  CHECK(positions(a, da) == positions(b, db));
}

TEST_CASE("fs a listing that renames each entry it returns away and back ends and returns each once",
          "[fs][readdir]") {
  // The default space (collisions practically never happen) and one barely larger than the directory (most
  // names collide and probe): in both, a round trip puts an entry back where it was.
  const std::uint64_t spaces[] = {FsOptions{}.dir_positions, 320};
  for (const std::uint64_t space : spaces) {
    for (const OpCode code : {OpCode::kReaddir, OpCode::kReaddirPlus}) {
      INFO("dir_positions " << space << ", op " << static_cast<int>(code));
      FsOptions o = tiny(space);
      Harness h(o);
      h.check_invariants = false;  // the full walk after each of ~1,000 requests; checked once at the end
      const Handle d = h.make_dir(kRoot, "d");
      const std::vector<std::string> names = file_names(300);
      for (const std::string& n : names) h.make_file(d, n);
      const auto before = positions(h, d);
      for (const std::uint32_t page : {1u, 16u, 128u}) {
        std::vector<std::string> seen = list_renaming_each(h, d, page, code, 4 * names.size());
        CHECK(seen.size() == names.size());
        std::sort(seen.begin(), seen.end());
        std::vector<std::string> sorted = names;
        std::sort(sorted.begin(), sorted.end());
        CHECK(seen == sorted);
      }
      CHECK(positions(h, d) == before);
      CHECK(h.svc.check_invariants() == "");
    }
  }
}

TEST_CASE("fs colliding names probe to the next free position and removal moves no other entry", "[fs][readdir]") {
  Harness h(tiny(8));
  const Handle d = h.make_dir(kRoot, "d");
  std::vector<std::string> candidates;
  for (int i = 0; i < 64; ++i) candidates.push_back("n" + std::to_string(i));
  const auto home = homes(h, d, candidates);
  for (const auto& [n, p] : home) {
    CHECK(p >= 3);
    CHECK(p < 3 + 8);
  }
  const std::uint64_t first = 3;
  const std::uint64_t last = 3 + 8 - 1;

  SECTION("a chain, a hole in it, and a name found wherever its probe put it") {
    const std::uint64_t hp = home.at("n0");
    const auto next = [&](std::uint64_t p) { return p == last ? first : p + 1; };
    const std::vector<std::string> same = with_home(home, hp);
    REQUIRE(same.size() >= 3);
    const std::string& a = same[0];
    const std::string& b = same[1];
    const std::string& c = same[2];
    h.make_file(d, a);
    h.make_file(d, b);
    h.make_file(d, c);
    CHECK(positions(h, d) == std::map<std::string, std::uint64_t>{{a, hp}, {b, next(hp)}, {c, next(next(hp))}});
    h.ok(remove(d, b));  // a hole in the middle of the chain
    CHECK(positions(h, d) == std::map<std::string, std::uint64_t>{{a, hp}, {c, next(next(hp))}});
    CHECK(h.err_of(lookup(d, c)) == err::kOk);  // not hidden by the hole: lookups go by name
    h.make_file(d, b);  // the first free position from its home is the hole
    CHECK(position_of(h, d, b) == next(hp));
    h.ok(remove(d, a));
    CHECK(position_of(h, d, c) == next(next(hp)));  // nothing moves back into the hole
    // c renamed away and back probes from its home again, which is free now: it moves, earlier (an entry a
    // listing has passed is then skipped, never repeated, which POSIX allows for an entry renamed during it).
    h.ok(rename(d, c, d, "elsewhere"));
    h.ok(rename(d, "elsewhere", d, c));
    CHECK(position_of(h, d, c) == hp);
  }

  SECTION("probing wraps from the last position to the first") {
    const std::vector<std::string> at_last = with_home(home, last);
    REQUIRE(at_last.size() >= 2);
    h.make_file(d, at_last[0]);
    h.make_file(d, at_last[1]);
    CHECK(position_of(h, d, at_last[0]) == last);
    CHECK(position_of(h, d, at_last[1]) == first);
  }

  SECTION("a directory with every position taken refuses one more entry until one goes") {
    const Handle other = h.make_dir(kRoot, "other");
    const Handle f = h.make_file(other, "f");
    for (int i = 0; i < 8; ++i) h.make_file(d, candidates[static_cast<std::size_t>(i)]);
    CHECK(positions(h, d).size() == 8);
    CHECK(h.err_of(create(d, "more")) == err::kNoSpc);
    CHECK(h.err_of(mkdir(d, "more")) == err::kNoSpc);
    CHECK(h.err_of(symlink(d, "more", "t")) == err::kNoSpc);
    CHECK(h.err_of(link(f, d, "more")) == err::kNoSpc);
    CHECK(h.err_of(rename(other, "f", d, "more")) == err::kNoSpc);
    h.ok(rename(other, "f", d, candidates[0]));  // replaces an entry: its position is free first
    h.ok(rename(d, candidates[1], d, "renamed"));  // within the directory: the old name's position is free first
    CHECK(h.err_of(create(d, candidates[1])) == err::kNoSpc);
    h.ok(remove(d, "renamed"));
    h.make_file(d, "more");
    CHECK(positions(h, d).size() == 8);
  }
}

namespace {

// State transfer as the engine does it: every partition whose digest differs goes from `from` to `to`.
CheckpointId transfer(FsService& from, std::uint64_t seq, FsService& to) {
  to.begin_install(seq);
  const PartitionTree& tree = from.checkpoint_tree(seq);
  const PartitionTree& mine = to.checkpoint_tree(to.recovered_checkpoint().seq);
  for (std::uint64_t p = 0; p < from.partition_count(); ++p) {
    if (tree.leaf(p) != mine.leaf(p)) to.install_partition(p, from.read_partition(seq, p));
  }
  return to.finish_install(seq);
}

// Creates, renames and removals in `dir` drawn from a seeded PRNG, over a few names, as one request each.
std::vector<Bytes> churn(std::uint64_t seed, Handle dir, int n) {
  Prng prng(seed);
  std::vector<Bytes> out;
  const auto name = [&] { return "e" + std::to_string(prng.below(48)); };
  for (int i = 0; i < n; ++i) {
    Op op;
    switch (prng.below(3)) {
      case 0: op = create(dir, name()); break;
      case 1: op = rename(dir, name(), dir, name()); break;
      default: op = remove(dir, name()); break;
    }
    out.push_back(encode_request(Request{{op}}));
  }
  return out;
}

}  // namespace

TEST_CASE("fs positions are the same on every replica and survive checkpoints, state transfer and restarts",
          "[fs][readdir]") {
  const FsOptions o = tiny(64);  // 48 names in 64 positions: many collisions and probe chains
  MemSnapshots snaps;
  Harness a(o, &snaps);
  Harness b(o);
  const Handle d = a.make_dir(kRoot, "d");
  b.make_dir(kRoot, "d");
  for (const Bytes& req : churn(5, d, 300)) {
    a.run_bytes(req);
    b.run_bytes(req);
    REQUIRE(a.last_bytes == b.last_bytes);
  }
  const auto listed = positions(a, d);
  CHECK(positions(b, d) == listed);
  CHECK(listed.size() > 10);
  const CheckpointId cp = a.svc.checkpoint(a.seq);
  CHECK(b.digest_at_checkpoint() == cp.digest);

  // A fresh replica that catches up by state transfer lists the same positions and keeps placing names as the
  // others do.
  Harness c(o);
  REQUIRE(transfer(a.svc, cp.seq, c.svc).digest == cp.digest);
  c.seq = a.seq;
  c.time_ns = a.time_ns;
  CHECK(positions(c, d) == listed);
  CHECK(positions(a, d) == listed);  // the same requests on both, so both agree on the next seq and time
  for (const Bytes& req : churn(6, d, 100)) {
    a.run_bytes(req);
    c.run_bytes(req);
    REQUIRE(a.last_bytes == c.last_bytes);
  }
  CHECK(positions(c, d) == positions(a, d));
  CHECK(a.digest_at_checkpoint() == c.digest_at_checkpoint());

  // A restart from the durable checkpoint lists what that checkpoint listed.
  const auto at_checkpoint = positions(a, d);
  Harness restarted(o, &snaps);
  restarted.seq = a.seq;
  CHECK(positions(restarted, d) == at_checkpoint);
}

TEST_CASE("fs an install whose superblock is of another state format is rejected", "[fs][readdir]") {
  Harness a;
  a.make_file(kRoot, "f");
  const CheckpointId cp = a.svc.checkpoint(a.seq);
  const std::uint64_t p = partition_of(ObjectKey::super(), a.svc.partition_count());
  std::vector<std::pair<ObjectKey, Value>> objects;
  const auto any = [](const ObjectKey&, const Bytes&) { return true; };
  REQUIRE(decode_partition(a.svc.read_partition(cp.seq, p), p, a.svc.partition_count(), any, objects).empty());
  // Format 1's superblock: next_ino, used_inodes, used_blocks, and no format field.
  Bytes old;
  bftfs::ByteWriter w(old);
  w.u64(3);
  w.u64(2);
  w.u64(0);
  bool replaced = false;
  for (auto& [k, v] : objects) {
    if (k == ObjectKey::super()) {
      v = make_value(old);
      replaced = true;
    }
  }
  REQUIRE(replaced);
  Harness b;
  const Digest before = b.digest_at_checkpoint();
  b.svc.begin_install(cp.seq);
  b.svc.install_partition(p, encode_objects(objects));
  CHECK(b.svc.finish_install(cp.seq).digest.is_zero());
  CHECK(b.digest_at_checkpoint() == before);
}
