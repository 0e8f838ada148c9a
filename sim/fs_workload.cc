// FsWorkload: see fs_workload.h. Drawing first (shapes, then single ops), then learning from results.
#include "sim/fs_workload.h"

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_service.h"

namespace bftfs::sim {

using fs::Cred;
using fs::Expect;
using fs::ExpectKind;
using fs::FileType;
using fs::Handle;
using fs::Op;
using fs::OpCode;
using fs::OpResult;

namespace {

constexpr std::size_t kSeenReadsMax = 8;
constexpr std::uint32_t kReaddirCountMax = 16;  // keeps a READDIRPLUS result small
const Handle kRoot = Handle::of(fs::kRootIno, 1);

// Weights of the shapes (in FsShape order) and of the single ops (in OpCode order, index = code - 1). Name and
// data changes dominate; every form and every op keeps a share.
constexpr std::array<std::uint32_t, kFsShapes> kShapeWeights = {40, 8, 6, 5, 8, 5, 6, 4, 5, 13};
constexpr std::array<std::uint32_t, fs::kFileOpCodeMax> kOpWeights = {
    8,   // LOOKUP
    6,   // GETATTR
    6,   // SETATTR
    8,   // READ
    10,  // WRITE
    10,  // CREATE
    6,   // REMOVE
    6,   // MKDIR
    4,   // RMDIR
    10,  // RENAME
    4,   // LINK
    4,   // SYMLINK
    2,   // READLINK
    4,   // READDIR
    1,   // STATFS
    1,   // FSYNC
    4,   // READDIRPLUS
    2,   // MKNOD
    2,   // ACCESS
};

template <std::size_t N>
std::size_t draw_weighted(Prng& prng, const std::array<std::uint32_t, N>& weights) {
  std::uint64_t total = 0;
  for (std::uint32_t w : weights) total += w;
  std::uint64_t x = prng.below(total);
  for (std::size_t i = 0; i < N; ++i) {
    if (x < weights[i]) return i;
    x -= weights[i];
  }
  BFT_ASSERT(false);
  return 0;
}

Op make(OpCode code, const Cred& cred) {
  Op op;
  op.code = code;
  op.cred = cred;
  return op;
}

// A handle the client never learned: usually no live object (ESTALE), sometimes a reused small inode number.
Handle made_up_handle(Prng& prng) { return Handle::of(prng.range(2, 40), prng.range(1, 3)); }

// Data that differs from draw to draw, so that a lost or misplaced write changes what later reads return.
Bytes fill(Prng& prng, std::size_t n) {
  Bytes b(n);
  const std::uint64_t x = prng.next();
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>((x >> ((i % 8) * 8)) + i / 8);
  return b;
}

bool same_object(const Handle& a, const Handle& b) {
  return !a.is_ref && !b.is_ref && a.ino == b.ino && a.generation == b.generation;
}

Op with_errno_predicate(Op op, std::uint32_t err) {
  op.expect = Expect{ExpectKind::kErrno, err, Digest{}};
  return op;
}

}  // namespace

std::string_view to_string(FsShape shape) {
  switch (shape) {
    case FsShape::kSingle: return "single";
    case FsShape::kCreateWrite: return "create+write";
    case FsShape::kCreateIfAbsent: return "lookup-enoent+create";
    case FsShape::kMkdirCreate: return "mkdir+create";
    case FsShape::kLookupRead: return "lookup+read";
    case FsShape::kCompareWrite: return "compare+write";
    case FsShape::kRenameLookup: return "rename+lookup";
    case FsShape::kMoveByLink: return "link+remove";
    case FsShape::kListing: return "listing";
    case FsShape::kMixed: return "mixed";
  }
  return "?";
}

void FsWorkloadStats::add(const FsWorkloadStats& o) {
  requests += o.requests;
  read_only_requests += o.read_only_requests;
  for (std::size_t i = 0; i <= fs::kOpCodeMax; ++i) ops[i] += o.ops[i];
  for (std::size_t i = 0; i < kFsShapes; ++i) shapes[i] += o.shapes[i];
  compounds += o.compounds;
  result_refs += o.result_refs;
  expect_errno += o.expect_errno;
  expect_digest += o.expect_digest;
  appends += o.appends;
  truncates += o.truncates;
  renames_of_dirs += o.renames_of_dirs;
  renames_across_dirs += o.renames_across_dirs;
  renames_onto_known += o.renames_onto_known;
  renames_into_subtree += o.renames_into_subtree;
  results += o.results;
  for (std::size_t i = 0; i < 4; ++i) outcomes[i] += o.outcomes[i];
  digest_predicates_held += o.digest_predicates_held;
  failed_noent += o.failed_noent;
  failed_exist += o.failed_exist;
  failed_stale += o.failed_stale;
  failed_notempty += o.failed_notempty;
  failed_inval += o.failed_inval;
  failed_access += o.failed_access;
  failed_other += o.failed_other;
}

FsWorkload::FsWorkload(FsWorkloadOptions options) : options_(options) {
  BFT_ASSERT(options_.names >= 1);
  BFT_ASSERT(options_.names <= 26);
  BFT_ASSERT(options_.io_bytes_max >= 1);
  BFT_ASSERT(options_.io_bytes_max <= fs::kIoBytesMax);
  BFT_ASSERT(options_.known_max >= 1);
  BFT_ASSERT(options_.read_only_percent <= 100);
}

// ---------------------------------------------------------------------------------------------------------------
// Drawing
// ---------------------------------------------------------------------------------------------------------------

FsWorkRequest FsWorkload::next(Prng& prng) {
  FsWorkRequest r;
  r.shape = static_cast<FsShape>(draw_weighted(prng, kShapeWeights));
  r.request.ops = draw_shape(prng, r.shape);
  BFT_ASSERT(!r.request.ops.empty());
  BFT_ASSERT(r.request.ops.size() <= fs::kCompoundOpsMax);
  const bool read_only_ops = std::all_of(r.request.ops.begin(), r.request.ops.end(),
                                         [](const Op& op) { return fs::is_read_only(op.code); });
  r.read_only = read_only_ops && prng.chance(options_.read_only_percent, 100);
  count(r);
  return r;
}

std::vector<Op> FsWorkload::draw_shape(Prng& prng, FsShape shape) {
  switch (shape) {
    case FsShape::kSingle: {
      const auto code = static_cast<OpCode>(draw_weighted(prng, kOpWeights) + 1);
      return {draw_op(prng, code)};
    }
    case FsShape::kCompareWrite: return draw_compare_write(prng);
    case FsShape::kMoveByLink: return draw_move_by_link(prng);
    case FsShape::kMixed: return draw_mixed(prng);
    default: return draw_compound(prng, shape);
  }
}

// The compound shapes whose ops are fixed (see FsShape).
std::vector<Op> FsWorkload::draw_compound(Prng& prng, FsShape shape) {
  const Cred cred = draw_cred(prng);
  const Handle dir = draw_dir(prng);
  const std::string name = draw_name(prng);
  Op first = make(OpCode::kLookup, cred);
  first.handle = dir;
  first.name = name;
  switch (shape) {
    case FsShape::kCreateWrite:
    case FsShape::kCreateIfAbsent: {
      Op create = make(OpCode::kCreate, cred);
      create.handle = dir;
      create.name = name;
      create.mode = 0644;
      create.exclusive = prng.chance(1, 2);
      std::vector<Op> ops;
      if (shape == FsShape::kCreateIfAbsent) ops.push_back(with_errno_predicate(first, fs::err::kNoEnt));
      const auto created = static_cast<std::uint8_t>(ops.size());
      ops.push_back(create);
      ops.push_back(draw_write(prng, Handle::result_of(created), 0));
      if (prng.chance(1, 2)) {
        ops.push_back(make(OpCode::kGetattr, cred));
        ops.back().handle = Handle::result_of(created);
      }
      return ops;
    }
    case FsShape::kMkdirCreate: {
      first.code = OpCode::kMkdir;
      first.mode = prng.chance(1, 2) ? 0777 : 0755;
      Op create = make(OpCode::kCreate, cred);
      create.handle = Handle::result_of(0);
      create.name = draw_name(prng);
      create.mode = 0644;
      return {first, create};
    }
    case FsShape::kLookupRead: {
      const Entry* e = draw_entry(prng, Want::kAny);
      if (e != nullptr) {
        first.handle = e->dir;
        first.name = e->name;
      }
      const FileType type = e != nullptr ? e->type : FileType::kRegular;
      Op second = draw_op(prng, type == FileType::kDirectory ? OpCode::kReaddir
                                : type == FileType::kRegular ? OpCode::kRead
                                                             : OpCode::kGetattr);
      second.handle = Handle::result_of(0);
      return {first, second};
    }
    case FsShape::kRenameLookup: {
      const Op rename = draw_rename(prng);
      first.handle = rename.handle2;
      first.name = rename.name2;
      return {rename, first};
    }
    default: {  // kListing
      std::vector<Op> ops = {make(OpCode::kReaddirPlus, cred), make(OpCode::kGetattr, cred),
                             make(OpCode::kStatfs, cred)};
      for (Op& op : ops) op.handle = dir;
      ops[0].count = static_cast<std::uint32_t>(prng.range(1, kReaddirCountMax));
      return ops;
    }
  }
}

// 2..4 ops of any kind; a later op sometimes names an earlier op's result, or carries an errno predicate.
std::vector<Op> FsWorkload::draw_mixed(Prng& prng) {
  std::vector<Op> ops;
  const std::uint64_t n = prng.range(2, 4);
  for (std::uint64_t i = 0; i < n; ++i) {
    Op op = draw_op(prng, static_cast<OpCode>(draw_weighted(prng, kOpWeights) + 1));
    std::vector<std::uint8_t> attr_ops;
    for (std::size_t j = 0; j < ops.size(); ++j) {
      if (fs::returns_attr(ops[j].code)) attr_ops.push_back(static_cast<std::uint8_t>(j));
    }
    if (!attr_ops.empty() && prng.chance(1, 3)) op.handle = Handle::result_of(attr_ops[prng.below(attr_ops.size())]);
    if (prng.chance(1, 8)) {
      static constexpr std::uint32_t kErrnos[] = {fs::err::kOk, fs::err::kNoEnt, fs::err::kExist};
      op = with_errno_predicate(std::move(op), kErrnos[prng.below(3)]);
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

Op FsWorkload::draw_op(Prng& prng, OpCode code) {
  switch (code) {
    case OpCode::kLookup:
    case OpCode::kCreate:
    case OpCode::kRemove:
    case OpCode::kMkdir:
    case OpCode::kRmdir:
    case OpCode::kSymlink:
    case OpCode::kMknod:
      return draw_name_op(prng, code);
    case OpCode::kRename:
      return draw_rename(prng);
    case OpCode::kLink: {
      Op op = make(code, draw_cred(prng));
      std::uint64_t size = 0;
      op.handle = prng.chance(1, 10) ? draw_dir(prng) : draw_file(prng, size);  // a directory: EPERM
      op.handle2 = draw_dir(prng);
      op.name = draw_name(prng);
      return op;
    }
    default:
      return draw_data_op(prng, code);
  }
}

// Ops on a (directory, name): mostly a name the client knows in that directory (so that removals and lookups
// meet real entries, and creations collide), else a pool name under a known directory.
Op FsWorkload::draw_name_op(Prng& prng, OpCode code) {
  Op op = make(code, draw_cred(prng));
  const Want want = code == OpCode::kRmdir    ? Want::kDirectory
                    : code == OpCode::kRemove ? Want::kNotDirectory
                                              : Want::kAny;
  const Entry* e = prng.chance(1, 2) ? draw_entry(prng, want) : nullptr;
  op.handle = e != nullptr ? e->dir : draw_dir(prng);
  op.name = e != nullptr ? e->name : draw_name(prng);
  switch (code) {
    case OpCode::kCreate:
      op.mode = prng.chance(3, 4) ? 0644 : 0600;
      op.exclusive = prng.chance(1, 2);
      break;
    case OpCode::kMkdir:
      op.mode = prng.chance(1, 2) ? 0777 : 0755;
      break;
    case OpCode::kSymlink:
      op.target = "t/" + draw_name(prng);
      break;
    case OpCode::kMknod:
      op.node_type = static_cast<FileType>(prng.range(4, 7));
      op.mode = 0644;
      op.rdev = op.node_type == FileType::kCharDevice || op.node_type == FileType::kBlockDevice ? prng.range(1, 999)
                                                                                               : 0;
      break;
    default:
      break;
  }
  return op;
}

// Ops on one object: data (READ, WRITE, SETATTR) on files, listings on directories, the rest on anything known.
Op FsWorkload::draw_data_op(Prng& prng, OpCode code) {
  std::uint64_t size = 0;
  if (code == OpCode::kWrite) {
    const Handle file = draw_file(prng, size);
    return draw_write(prng, file, size);
  }
  Op op = make(code, draw_cred(prng));
  const Entry* any = draw_entry(prng, code == OpCode::kReadlink ? Want::kSymlink : Want::kAny);
  op.handle = any != nullptr && prng.chance(3, 4) ? any->handle : draw_dir(prng);
  switch (code) {
    case OpCode::kRead:
      op.handle = draw_file(prng, size);
      op.offset = prng.chance(1, 2) ? 0 : prng.below(size + options_.io_bytes_max);
      op.count = static_cast<std::uint32_t>(prng.range(1, options_.io_bytes_max));
      break;
    case OpCode::kSetattr:
      if (prng.chance(1, 2)) {
        op.handle = draw_file(prng, size);
        op.mask = fs::setattr::kSize;
        op.size = prng.chance(1, 3) ? 0 : prng.below(size + 2 * options_.io_bytes_max);
      } else if (prng.chance(1, 2)) {
        op.mask = fs::setattr::kMode;
        op.mode = prng.chance(1, 2) ? 0777 : 0640;
      } else {
        op.mask = prng.chance(1, 2) ? fs::setattr::kMtimeNow : fs::setattr::kAtime | fs::setattr::kMtime;
        op.atime_ns = prng.below(1'000'000'000);
        op.mtime_ns = prng.below(1'000'000'000);
        if ((op.mask & fs::setattr::kAtime) == 0) op.atime_ns = op.mtime_ns = 0;  // unused fields stay default
      }
      break;
    case OpCode::kReaddir:
    case OpCode::kReaddirPlus:
      op.handle = draw_dir(prng);
      op.cookie = prng.chance(3, 4) ? 0 : prng.range(1, 8);
      op.count = static_cast<std::uint32_t>(prng.range(1, kReaddirCountMax));
      break;
    case OpCode::kAccess:
      op.access = static_cast<std::uint8_t>(prng.below(8));
      break;
    default:  // GETATTR, READLINK, STATFS, FSYNC
      break;
  }
  return op;
}

// A WRITE of `file` (size last seen `size_hint`): at the start, at the end, anywhere near the data, across a
// block boundary, or appending.
Op FsWorkload::draw_write(Prng& prng, Handle file, std::uint64_t size_hint) {
  Op op = make(OpCode::kWrite, draw_cred(prng));
  op.handle = file;
  const std::uint64_t length = prng.range(1, options_.io_bytes_max);
  switch (prng.below(5)) {
    case 0: op.offset = 0; break;
    case 1: op.offset = size_hint; break;
    case 2: op.offset = prng.below(size_hint + options_.io_bytes_max); break;
    case 3: op.offset = fs::kBlockBytes - std::min<std::uint64_t>(length - 1, prng.below(length + 1)); break;
    default: op.append = true; break;
  }
  op.data = fill(prng, length);
  return op;
}

// RENAME of a known entry (sometimes an unknown name): within its directory or across, onto a name known to
// exist, or a directory into its own subtree.
Op FsWorkload::draw_rename(Prng& prng) {
  Op op = make(OpCode::kRename, draw_cred(prng));
  const Entry* src = prng.chance(4, 5) ? draw_entry(prng, Want::kAny) : nullptr;
  op.handle = src != nullptr ? src->dir : draw_dir(prng);
  op.name = src != nullptr ? src->name : draw_name(prng);
  const bool src_dir = src != nullptr && src->type == FileType::kDirectory;
  const Entry* dst = prng.chance(2, 5) ? draw_entry(prng, Want::kAny) : nullptr;
  if (src_dir && prng.chance(1, 4)) {
    op.handle2 = descendant_of(prng, src->handle);
    op.name2 = draw_name(prng);
    stats_.renames_into_subtree++;
  } else if (dst != nullptr) {
    op.handle2 = dst->dir;
    op.name2 = dst->name;
    stats_.renames_onto_known++;
  } else {
    op.handle2 = prng.chance(1, 2) ? op.handle : draw_dir(prng);
    op.name2 = draw_name(prng);
  }
  if (src_dir) stats_.renames_of_dirs++;
  if (!same_object(op.handle, op.handle2)) stats_.renames_across_dirs++;
  return op;
}

// READ of a file predicting the result last seen for it (or, knowing none, an empty file), then a WRITE at the
// same offset or an append: a compare-and-write that fails with kPredicateFailed if anyone changed the bytes.
std::vector<Op> FsWorkload::draw_compare_write(Prng& prng) {
  Op read = make(OpCode::kRead, draw_cred(prng));
  read.expect.kind = ExpectKind::kDigest;
  if (!reads_.empty()) {
    const SeenRead& s = reads_[prng.below(reads_.size())];
    read.handle = s.file;
    read.offset = s.offset;
    read.count = s.count;
    read.expect.digest = s.digest;
  } else {
    std::uint64_t size = 0;
    read.handle = draw_file(prng, size);
    read.count = static_cast<std::uint32_t>(prng.range(1, options_.io_bytes_max));
    OpResult empty;
    empty.code = OpCode::kRead;
    empty.eof = true;
    read.expect.digest = fs::op_result_digest(empty);
  }
  Op write = draw_write(prng, read.handle, read.offset);
  if (!write.append) write.offset = read.offset;
  return {read, write};
}

// LINK of a known file under another name, then REMOVE of the name it was known by: a move by hand.
std::vector<Op> FsWorkload::draw_move_by_link(Prng& prng) {
  const Cred cred = draw_cred(prng);
  Op link = make(OpCode::kLink, cred);
  Op remove = make(OpCode::kRemove, cred);
  const Entry* e = draw_entry(prng, Want::kRegular);
  std::uint64_t size = 0;
  link.handle = e != nullptr ? e->handle : draw_file(prng, size);
  remove.handle = e != nullptr ? e->dir : draw_dir(prng);
  remove.name = e != nullptr ? e->name : draw_name(prng);
  link.handle2 = draw_dir(prng);
  link.name = draw_name(prng);
  return {link, remove};
}

Cred FsWorkload::draw_cred(Prng& prng) const {
  if (!options_.other_users || prng.chance(3, 4)) return Cred{0, 0, {}};
  return Cred{1000 + static_cast<std::uint32_t>(prng.below(2)), 100, {}};
}

std::string FsWorkload::draw_name(Prng& prng) const {
  return std::string("n") + static_cast<char>('a' + prng.below(options_.names));
}

Handle FsWorkload::draw_dir(Prng& prng) const {
  if (prng.chance(1, 30)) return made_up_handle(prng);
  if (prng.chance(1, 3)) return kRoot;
  const Entry* e = draw_entry(prng, Want::kDirectory);
  return e != nullptr ? e->handle : kRoot;
}

// A uniformly drawn known entry of the wanted type, or null if the client knows none.
const FsWorkload::Entry* FsWorkload::draw_entry(Prng& prng, Want want) const {
  const auto wanted = [want](FileType type) {
    switch (want) {
      case Want::kDirectory: return type == FileType::kDirectory;
      case Want::kRegular: return type == FileType::kRegular;
      case Want::kNotDirectory: return type != FileType::kDirectory;
      case Want::kSymlink: return type == FileType::kSymlink;
      case Want::kAny: return true;
    }
    return true;
  };
  std::vector<const Entry*> pool;
  for (const Entry& e : known_) {
    if (wanted(e.type)) pool.push_back(&e);
  }
  return pool.empty() ? nullptr : pool[prng.below(pool.size())];
}

// A known regular file (its size last seen in `size`); sometimes a directory (EISDIR) or a made-up handle.
Handle FsWorkload::draw_file(Prng& prng, std::uint64_t& size) const {
  size = 0;
  if (prng.chance(1, 25)) return made_up_handle(prng);
  const Entry* e = draw_entry(prng, prng.chance(1, 25) ? Want::kDirectory : Want::kRegular);
  if (e == nullptr) return made_up_handle(prng);
  size = e->size;
  return e->handle;
}

// `dir` itself or a directory the client knows lies below it (through entries it remembers).
Handle FsWorkload::descendant_of(Prng& prng, const Handle& dir) const {
  std::vector<Handle> below = {dir};
  for (std::size_t i = 0; i < below.size(); ++i) {
    for (const Entry& e : known_) {
      if (e.type != FileType::kDirectory || !same_object(e.dir, below[i])) continue;
      const auto same = [&](const Handle& h) { return same_object(h, e.handle); };
      if (std::none_of(below.begin(), below.end(), same)) below.push_back(e.handle);
    }
  }
  return below[prng.below(below.size())];
}

void FsWorkload::count(const FsWorkRequest& r) {
  stats_.requests++;
  if (r.read_only) stats_.read_only_requests++;
  stats_.shapes[static_cast<std::size_t>(r.shape)]++;
  if (r.request.ops.size() >= 2) stats_.compounds++;
  for (const Op& op : r.request.ops) {
    stats_.ops[static_cast<std::size_t>(op.code)]++;
    if (op.handle.is_ref || op.handle2.is_ref) stats_.result_refs++;
    if (op.expect.kind == ExpectKind::kErrno) stats_.expect_errno++;
    if (op.expect.kind == ExpectKind::kDigest) stats_.expect_digest++;
    if (op.code == OpCode::kWrite && op.append) stats_.appends++;
    if (op.code == OpCode::kSetattr && (op.mask & fs::setattr::kSize) != 0) stats_.truncates++;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Learning
// ---------------------------------------------------------------------------------------------------------------

void FsWorkload::on_result(const fs::Request& request, const fs::Result& result) {
  BFT_ASSERT(result.results.size() <= request.ops.size());
  const auto outcome = static_cast<std::size_t>(result.outcome);
  BFT_ASSERT(outcome < 4);
  stats_.results++;
  stats_.outcomes[outcome]++;
  if (result.outcome == fs::Outcome::kDone) {
    learn_done(request, result);
  } else if (result.outcome != fs::Outcome::kMalformed) {
    learn_failure(request, result);
  }
}

void FsWorkload::learn_done(const fs::Request& request, const fs::Result& result) {
  const auto& res = result.results;
  // The object a handle names: a result reference resolves to the Attr of the op it names.
  const auto resolve = [&](const Handle& h) {
    return h.is_ref && h.ref < res.size() && res[h.ref].err == fs::err::kOk ? res[h.ref].attr.handle() : h;
  };
  for (std::size_t i = 0; i < res.size(); ++i) {
    const Op& op = request.ops[i];
    const OpResult& r = res[i];
    if (op.expect.kind == ExpectKind::kDigest) stats_.digest_predicates_held++;
    if (r.err != fs::err::kOk) {  // it passed by its errno predicate
      if (op.code == OpCode::kLookup && r.err == fs::err::kNoEnt) forget_name(resolve(op.handle), op.name);
      continue;
    }
    switch (op.code) {
      case OpCode::kLookup:
      case OpCode::kCreate:
      case OpCode::kMkdir:
      case OpCode::kSymlink:
      case OpCode::kMknod: remember(resolve(op.handle), op.name, r.attr); break;
      case OpCode::kLink: remember(resolve(op.handle2), op.name, r.attr); break;
      case OpCode::kRemove:
      case OpCode::kRmdir: forget_name(resolve(op.handle), op.name); break;
      case OpCode::kRead: remember_read(resolve(op.handle), op, r); break;
      case OpCode::kReaddirPlus:
        for (const fs::DirEntry& e : r.entries) {
          if (e.name != "." && e.name != "..") remember(resolve(op.handle), e.name, e.attr);
        }
        break;
      case OpCode::kRename: {
        const Handle from = resolve(op.handle);
        const Handle to = resolve(op.handle2);
        const auto it = std::find_if(known_.begin(), known_.end(), [&](const Entry& e) {
          return same_object(e.dir, from) && e.name == op.name;
        });
        std::optional<Entry> moved;
        if (it != known_.end()) moved = *it;
        forget_name(from, op.name);
        forget_name(to, op.name2);
        if (moved.has_value()) {
          fs::Attr attr;
          attr.ino = moved->handle.ino;
          attr.generation = moved->handle.generation;
          attr.type = moved->type;
          attr.size = moved->size;
          remember(to, op.name2, attr);
        }
        break;
      }
      default:
        if (fs::returns_attr(op.code)) {  // GETATTR, SETATTR, WRITE, ACCESS, FSYNC: the size now
          for (Entry& e : known_) {
            if (same_object(e.handle, r.attr.handle())) e.size = r.attr.size;
          }
        }
        break;
    }
  }
}

// A request that stopped changed nothing; what its stopping op found still tells something about the state.
void FsWorkload::learn_failure(const fs::Request& request, const fs::Result& result) {
  if (result.stop >= request.ops.size() || result.stop >= result.results.size()) return;
  const Op& op = request.ops[result.stop];
  const OpResult& r = result.results[result.stop];
  if (result.outcome == fs::Outcome::kOpFailed) {
    switch (r.err) {
      case fs::err::kNoEnt: stats_.failed_noent++; break;
      case fs::err::kExist: stats_.failed_exist++; break;
      case fs::err::kStale: stats_.failed_stale++; break;
      case fs::err::kNotEmpty: stats_.failed_notempty++; break;
      case fs::err::kInval: stats_.failed_inval++; break;
      case fs::err::kAccess:
      case fs::err::kPerm: stats_.failed_access++; break;
      default: stats_.failed_other++; break;
    }
  }
  // Only a first op saw the state before the request: a later one saw changes that were undone.
  if (result.stop != 0 || op.handle.is_ref) return;
  if (r.err == fs::err::kStale) forget_handle(op.handle);
  const bool named = op.code == OpCode::kLookup || op.code == OpCode::kRemove || op.code == OpCode::kRmdir ||
                     op.code == OpCode::kRename;
  if (r.err == fs::err::kNoEnt && named) forget_name(op.handle, op.name);
  // A compare-and-write that lost: its READ's result is what the file holds now, the next prediction.
  if (result.outcome == fs::Outcome::kPredicateFailed && op.code == OpCode::kRead && r.err == fs::err::kOk) {
    remember_read(op.handle, op, r);
  }
}

void FsWorkload::remember(const Handle& dir, const std::string& name, const fs::Attr& attr) {
  if (dir.is_ref) return;  // names an op that failed: nothing to remember it by
  forget_name(dir, name);
  known_.push_back(Entry{dir, name, attr.handle(), attr.type, attr.size});
  if (known_.size() > options_.known_max) known_.pop_front();
}

void FsWorkload::forget_name(const Handle& dir, const std::string& name) {
  std::erase_if(known_, [&](const Entry& e) { return same_object(e.dir, dir) && e.name == name; });
}

void FsWorkload::forget_handle(const Handle& handle) {
  std::erase_if(known_, [&](const Entry& e) { return same_object(e.handle, handle) || same_object(e.dir, handle); });
  std::erase_if(reads_, [&](const SeenRead& s) { return same_object(s.file, handle); });
}

void FsWorkload::remember_read(const Handle& file, const Op& op, const OpResult& r) {
  if (file.is_ref) return;
  std::erase_if(reads_, [&](const SeenRead& s) { return same_object(s.file, file); });
  reads_.push_back(SeenRead{file, op.offset, op.count, fs::op_result_digest(r)});
  if (reads_.size() > kSeenReadsMax) reads_.pop_front();
}

}  // namespace bftfs::sim
