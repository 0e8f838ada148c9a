// A seeded generator of file-service requests for one simulated client: what the simulator's file-operation
// clients submit (services/fs/fs_codec.h requests; the simulator wraps them in shim envelopes, shim/envelope.h,
// possibly with dependencies on the client's earlier requests).
//
// Pure: every random choice comes from the Prng the caller passes to next(), so one seed reproduces a client's
// requests exactly, given the same results fed to on_result() in the same order. No clocks, no I/O.
//
// What a client knows is only what its accepted results told it, as a real NFS client: the root handle, the
// entries (directory, name) -> (handle, type, size) it created or looked up or listed, and the last result it
// saw for a few READs. Several clients draw names from the same small pool under the same directories, so
// their operations conflict: one removes or renames what another still names, creates collide (EEXIST), handles
// go stale (ESTALE), directories are non-empty (ENOTEMPTY). Knowledge is never trusted to be current; a request
// built on stale knowledge fails with an errno, which is a valid outcome the oracle checks like any other.
//
// Forms drawn (FsShape): single ops of every OpCode; compound requests whose later ops name earlier ops'
// results (CREATE then WRITE, MKDIR then CREATE inside, LOOKUP then READ); fs-level predicates (fs::Expect):
// "LOOKUP expecting ENOENT then CREATE" and "READ expecting the digest of the last result seen, then WRITE"
// (compare and write); renames of files and of directories, within and across directories, onto names the
// client knows exist, and of a directory into its own subtree (EINVAL); moves by LINK then REMOVE. Requests
// made only of read-only ops (fs::is_read_only) are marked for the read-only path (Service::execute_read_only,
// TOCS §5.1.3) with a configurable probability.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "common/prng.h"
#include "common/types.h"
#include "services/fs/fs_codec.h"

namespace bftfs::sim {

struct FsWorkloadOptions {
  // Names are drawn from "n0" .. "n<names-1>", shared by every client (fewer names: more conflicts). 1..26.
  std::uint32_t names = 6;
  // The largest WRITE length and READ count drawn. 1..fs::kIoBytesMax.
  std::uint32_t io_bytes_max = 8192;
  // Entries a client remembers; when full, the oldest is forgotten. >= 1.
  std::uint32_t known_max = 48;
  // Of the requests made only of read-only ops, the percentage marked for the read-only path. 0..100.
  std::uint32_t read_only_percent = 60;
  // Some ops run as uid 1000 or 1001 (gid 100) instead of root: permission errors (EACCES, EPERM). With a root
  // directory of mode 0755 those users cannot create under it; FsOptions::root_mode 0777 lets them.
  bool other_users = true;
};

// The form of a request (what next() chose), counted in FsWorkloadStats::shapes.
enum class FsShape : std::uint8_t {
  kSingle = 0,     // one op of any OpCode
  kCreateWrite,    // CREATE, WRITE of result 0, sometimes GETATTR of result 0
  kCreateIfAbsent, // LOOKUP expecting ENOENT, CREATE of the same name, WRITE of result 1
  kMkdirCreate,    // MKDIR, CREATE inside result 0
  kLookupRead,     // LOOKUP, then READ or GETATTR or READDIR of result 0 (read-only)
  kCompareWrite,   // READ expecting the digest of the last result seen for it, WRITE the same file
  kRenameLookup,   // RENAME, LOOKUP of the new name
  kMoveByLink,     // LINK of a known file under a new name, REMOVE of its old name
  kListing,        // READDIRPLUS, GETATTR and STATFS of a directory (read-only)
  kMixed,          // 2..4 ops of any OpCode, some naming earlier ops' results
};
inline constexpr std::size_t kFsShapes = 10;
std::string_view to_string(FsShape shape);

// Counts of what a client drew and learned (plain data, so a simulator can sum and send them). add() sums.
struct FsWorkloadStats {
  // ---- drawn by next() ----
  std::uint64_t requests = 0;
  std::uint64_t read_only_requests = 0;         // marked for the read-only path
  std::uint64_t ops[fs::kOpCodeMax + 1] = {};   // by OpCode value
  std::uint64_t shapes[kFsShapes] = {};         // by FsShape
  std::uint64_t compounds = 0;                  // requests of two or more ops
  std::uint64_t result_refs = 0;                // handles naming an earlier op's result
  std::uint64_t expect_errno = 0;               // ops with an errno predicate
  std::uint64_t expect_digest = 0;              // ops with a digest predicate
  std::uint64_t appends = 0;                    // WRITEs with append
  std::uint64_t truncates = 0;                  // SETATTRs of the size
  std::uint64_t renames_of_dirs = 0;            // RENAMEs whose source the client knows as a directory
  std::uint64_t renames_across_dirs = 0;        // source and target directories differ
  std::uint64_t renames_onto_known = 0;         // onto a name the client knows exists
  std::uint64_t renames_into_subtree = 0;       // a directory into itself or a directory it knows is below it
  // ---- learned by on_result() ----
  std::uint64_t results = 0;
  std::uint64_t outcomes[4] = {};               // by fs::Outcome
  std::uint64_t digest_predicates_held = 0;     // ops with a digest predicate in requests that were done
  // The errno of the op that stopped a kOpFailed request.
  std::uint64_t failed_noent = 0, failed_exist = 0, failed_stale = 0, failed_notempty = 0;
  std::uint64_t failed_inval = 0, failed_access = 0, failed_other = 0;

  void add(const FsWorkloadStats& other);
};

// What next() returns.
struct FsWorkRequest {
  fs::Request request;     // valid: fs::decode_request(fs::encode_request(request)) accepts it
  bool read_only = false;  // submit through the read-only path; implies every op is fs::is_read_only
  FsShape shape = FsShape::kSingle;
};

class FsWorkload {
 public:
  // Precondition (asserted): options within the ranges documented on FsWorkloadOptions.
  explicit FsWorkload(FsWorkloadOptions options = {});

  // Draws the next request from what the client knows now; changes only the statistics (and `prng`).
  FsWorkRequest next(Prng& prng);

  // The client accepted `result` as the result of `request` (one next() returned; the file-service result,
  // i.e. the inner result of an executed shim envelope, ordered or read-only). Learns the entries and handles
  // it names: from a done request, every op's result (created, looked up, listed, linked, renamed, removed
  // names; sizes; READ digests for compare-and-write); from a stopped one, only what its first op found, when
  // that op stopped it (everything else the request did was undone): a name absent (ENOENT), a handle stale
  // (ESTALE), or the bytes a losing compare-and-write read. Results of requests that were never executed
  // (shim retries) are simply not given. Deterministic (no randomness).
  // Precondition (asserted): result.results.size() <= request.ops.size().
  void on_result(const fs::Request& request, const fs::Result& result);

  const FsWorkloadStats& stats() const { return stats_; }
  // Entries remembered now (tests).
  std::size_t known_entries() const { return known_.size(); }

 private:
  struct Entry {
    fs::Handle dir;       // where the name was seen
    std::string name;
    fs::Handle handle;    // what it named
    fs::FileType type = fs::FileType::kRegular;
    std::uint64_t size = 0;  // the size last seen
  };
  enum class Want : std::uint8_t { kAny, kDirectory, kRegular, kNotDirectory, kSymlink };
  struct SeenRead {  // the last READ result seen for a file: a compare-and-write predicts it
    fs::Handle file;
    std::uint64_t offset = 0;
    std::uint32_t count = 0;
    Digest digest;  // fs::op_result_digest of the result
  };

  // ---- drawing (fs_workload.cc) ----
  std::vector<fs::Op> draw_shape(Prng& prng, FsShape shape);
  std::vector<fs::Op> draw_compound(Prng& prng, FsShape shape);
  std::vector<fs::Op> draw_mixed(Prng& prng);
  fs::Op draw_op(Prng& prng, fs::OpCode code);
  fs::Op draw_name_op(Prng& prng, fs::OpCode code);
  fs::Op draw_data_op(Prng& prng, fs::OpCode code);
  fs::Op draw_rename(Prng& prng);
  fs::Op draw_write(Prng& prng, fs::Handle file, std::uint64_t size_hint);
  std::vector<fs::Op> draw_compare_write(Prng& prng);
  std::vector<fs::Op> draw_move_by_link(Prng& prng);
  fs::Cred draw_cred(Prng& prng) const;
  std::string draw_name(Prng& prng) const;
  fs::Handle draw_dir(Prng& prng) const;
  const Entry* draw_entry(Prng& prng, Want want) const;  // null when the client knows none
  fs::Handle draw_file(Prng& prng, std::uint64_t& size) const;
  fs::Handle descendant_of(Prng& prng, const fs::Handle& dir) const;
  void count(const FsWorkRequest& r);

  // ---- learning (fs_workload.cc) ----
  void learn_done(const fs::Request& request, const fs::Result& result);
  void learn_failure(const fs::Request& request, const fs::Result& result);
  void remember(const fs::Handle& dir, const std::string& name, const fs::Attr& attr);
  void forget_name(const fs::Handle& dir, const std::string& name);
  void forget_handle(const fs::Handle& handle);
  void remember_read(const fs::Handle& file, const fs::Op& op, const fs::OpResult& r);

  FsWorkloadOptions options_;
  std::deque<Entry> known_;       // oldest first, at most options_.known_max
  std::deque<SeenRead> reads_;    // oldest first, at most kSeenReadsMax
  FsWorkloadStats stats_;
};

}  // namespace bftfs::sim
