// Private to the files that implement FsService (services/fs/fs_service.cc and the fs_*.cc files named below):
// the definition of FsService::Impl. Nothing outside services/fs/ includes it.
//
// Impl's members live in one file per concern:
//   fs_service.cc     construction, the initial state, and FsService's public members (which forward here)
//   fs_execute.cc     the compound executor: decoding, running ops in order, predicates, all-or-nothing
//   fs_name_ops.cc    ops on directory entries: LOOKUP, CREATE, MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME,
//                     LINK, READDIR(PLUS)
//   fs_data_ops.cc    ops on one inode: GETATTR, SETATTR (and truncation), READ, WRITE, READLINK, ACCESS,
//                     STATFS (FSYNC is a GETATTR)
//   fs_objects.cc     the layer the ops stand on: loading and saving inodes and entries, resolving handles,
//                     allocating and freeing inodes, erasing data blocks
//   fs_undo.cc        changing objects with an undo record, and commit and rollback of tentative execution
//   fs_checkpoint.cc  checkpoints and the state-transfer install
//   fs_invariants.cc  the cheap checks after every request and the full walk for tests
//   fs_entries.cc     speculation (docs/SPECULATION.md §5): entries (execute_entry, TIME, creates from a
//                     stream's pool)
//   fs_fetch.cc       FETCH: objects by key, and the trace of what an entry reads
//   fs_streams.cc     stream objects: RESERVE, STAGE, STREAM_CLOSE, staged parts, idle streams
//   fs_epoch.cc       EPOCH: the chain, the staged parts, the entries all or nothing
// Value formats are in fs_state.h, the POSIX rules in fs_permissions.h.
//
// Every op first checks everything it can (handles, types, names, permissions, limits) and only then mutates,
// through put()/erase(), which record undo. Partition overflow is the one failure found while mutating; it is
// handled like any failure: the op's changes are undone.
//
// Over a partial store (the local model, `partial`) the state is a mixture of facts fetched at different times,
// so what the full state guarantees (link counts, usage counters, entry pairs) may not hold: the checks of such
// guarantees go through require_consistent(), which asserts on a replica and, in the model, ends the entry as
// inconsistent (an exception caught at the request boundary, like a corrupt read).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "services/fs/checkpointed_store.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "services/fs/fs_state.h"
#include "services/fs/object_store.h"

namespace bftfs::fs {

struct FsService::Impl {
  // The value `key` had before the first change to it in an op of batch `seq`.
  struct UndoRec {
    std::uint64_t seq = 0;
    ObjectKey key;
    Value old;          // null: the key was absent
    bool known = true;  // false: a partial store did not know it (undo forgets the key)
  };

  // What FETCH's trace mode gathers while the traced request runs (fs_fetch.cc): facts about the state before
  // it, in the order the request read them.
  struct Tracer {
    std::map<ObjectKey, Value> initial;  // keys the traced request changed: their values before it (null: absent)
    std::set<ObjectKey> read;            // keys whose value was reported
    std::set<ObjectKey> scanned;         // scan starts reported
    std::vector<Fact> facts;
    std::size_t bytes = 0;
    bool complete = true;
    // Appends `f` unless the facts would exceed kFetchFactBytesMax (then nothing more is appended).
    void add(Fact f);
  };

  // Sets a member for a scope and puts the old value back on any exit (exceptions included).
  template <typename T>
  struct Scoped {
    Scoped(T& ref, T value) : ref_(ref), saved_(std::move(ref)) { ref_ = std::move(value); }
    ~Scoped() { ref_ = std::move(saved_); }
    Scoped(const Scoped&) = delete;
    Scoped& operator=(const Scoped&) = delete;
    T& ref_;
    T saved_;
  };

  // Thrown by require_consistent over a partial store.
  struct InconsistentState {};

  // What RENAME found while checking its operands; apply_rename changes the state from it.
  struct RenamePlan {
    Inode from_dir;
    Inode to_dir;
    Inode moved;     // the inode the source name names
    Inode replaced;  // the inode the target name names, if `replaces`
    NameRec src;
    NameRec dst;
    bool replaces = false;   // the target name exists
    bool same_file = false;  // both names name one inode: POSIX says do nothing, and nothing else is checked
  };

  // ---- fs_service.cc ----
  // Opens the state in `owned` (which must have opt.partitions partitions); a store without a checkpoint gets
  // the initial state as checkpoint 0.
  Impl(std::unique_ptr<CheckpointedStore> owned, FsOptions o);
  // Over a partial store: nothing is read or put.
  Impl(PartialState, std::unique_ptr<CheckpointedStore> owned, FsOptions o);
  // The superblock and the root directory, owned by opt.root_uid/root_gid with opt.root_mode.
  void put_initial_objects();

  // ---- fs_execute.cc ----
  // Service::execute and Service::execute_read_only (see fs_service.h).
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> bytes);
  bool execute_read_only(NodeId client, std::span<const std::uint8_t> bytes, Bytes& result);
  // Runs a decoded request all or nothing (docs/FILESERVICE.md §1, §4).
  Result run_request(const Request& req);
  // run_request without the corrupt-read handling; `request_mark` is the undo log's size before the request.
  Result run_ops(const Request& req, std::size_t request_mark);
  // One op: its errno, and its result fields in `out`. `earlier` holds the results of the ops before it.
  std::uint32_t run_op(const Op& op, const std::vector<OpResult>& earlier, OpResult& out);
  // encode_result, asserting the bound every caller relies on (kFsResultBytesMax).
  Bytes encode_checked(const Result& res) const;

  // ---- fs_name_ops.cc ----
  std::uint32_t op_lookup(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  // CREATE, MKDIR, SYMLINK and MKNOD: a new inode of `type` under a new name.
  std::uint32_t make_node(const Op& op, const std::vector<OpResult>& earlier, FileType type, std::uint32_t mode,
                          OpResult& out);
  // REMOVE (`rmdir` false) and RMDIR.
  std::uint32_t op_remove(const Op& op, const std::vector<OpResult>& earlier, bool rmdir);
  std::uint32_t op_rename(const Op& op, const std::vector<OpResult>& earlier);
  // Every check of RENAME, with no change; fills `plan`.
  std::uint32_t plan_rename(const Op& op, const std::vector<OpResult>& earlier, RenamePlan& plan) const;
  // err::kOk if the directory `moved` may become a child of directory `to_dir`: not into its own subtree.
  std::uint32_t check_not_within(std::uint64_t to_dir, std::uint64_t moved) const;
  // The checks on the inode a RENAME replaces (plan.replaced, loaded here).
  std::uint32_t check_replaced(const Op& op, RenamePlan& plan) const;
  void apply_rename(const Op& op, RenamePlan& plan);
  std::uint32_t op_link(const Op& op, const std::vector<OpResult>& earlier, OpResult& out);
  // READDIR and READDIRPLUS.
  std::uint32_t op_readdir(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;

  // ---- fs_data_ops.cc ----
  std::uint32_t op_getattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  std::uint32_t op_setattr(const Op& op, const std::vector<OpResult>& earlier, OpResult& out);
  std::uint32_t op_read(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  std::uint32_t op_write(const Op& op, const std::vector<OpResult>& earlier, OpResult& out);
  std::uint32_t op_readlink(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  std::uint32_t op_access(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  std::uint32_t op_statfs(const Op& op, const std::vector<OpResult>& earlier, OpResult& out) const;
  // Sets the size of regular file `n` (the caller saves it and `s`). Data beyond `size` never stays stored, so
  // a later extension reads zeros.
  void truncate(Inode& n, Super& s, std::uint64_t size);

  // ---- fs_objects.cc: reads (verified by the store) ----
  // A read of the state: the store's answer, reported to FETCH's tracer when one is active. Throws CorruptRead,
  // and over a partial store UnknownKey.
  std::optional<ObjectKey> first_at_or_after(const ObjectKey& from) const;
  // Asserts `ok` over the whole state; over a partial store throws InconsistentState when it fails.
  void require_consistent(bool ok) const;
  // Thrown by get() when the store's bytes failed their checksum: the request stops at once (its changes are
  // undone) and nothing computed from the bad bytes is used; the engine learns of the damage through
  // damaged_partitions() and never sends this replica's result. An exception because a corrupt read can happen
  // under any of the dozens of reads of an op, and every one of them would otherwise need an error path that
  // correct execution never takes.
  struct CorruptRead {};
  // The value of `k` (null if absent); throws CorruptRead.
  Value get(const ObjectKey& k) const;
  Super load_super() const;
  void save_super(const Super& s);
  // ESTALE when there is no such inode; EIO if its value does not decode (cannot happen: installs validate).
  std::uint32_t load_inode(std::uint64_t ino, Inode& n) const;
  // An inode that an entry or a parent pointer names: its absence is an inconsistency (EIO), not a stale handle.
  std::uint32_t load_linked(std::uint64_t ino, Inode& n) const;
  void save_inode(const Inode& n);
  // The inode `h` names (a handle whose generation matches, or an earlier op's Attr), or ESTALE.
  std::uint32_t resolve(const Handle& h, const std::vector<OpResult>& earlier, Inode& n) const;
  // kOk and the record, kNoEnt, or kIo.
  std::uint32_t find_entry(std::uint64_t dir, const std::string& name, NameRec& out) const;
  // ENOSPC if `dir`, after `leaving` of its entries go, has no free position for one more (only when a test
  // shrinks FsOptions::dir_positions); else kOk. Checked before an op changes anything.
  std::uint32_t check_room(const Inode& dir, std::uint64_t leaving) const;
  // The first free position from `name`'s home in `dir`, probing forward (docs/FILESERVICE.md §7).
  // Precondition: dir has room (check_room).
  std::uint64_t free_position(const Inode& dir, const std::string& name) const;
  // Adds or removes both records of an entry and updates `dir` (the caller saves it). An entry keeps the
  // position add_entry gave it until it is removed; no other entry's removal moves it.
  void add_entry(Inode& dir, const std::string& name, std::uint64_t ino, FileType type);
  void remove_entry(Inode& dir, const std::string& name, std::uint64_t cookie);
  std::uint64_t capacity_blocks() const { return opt.capacity_bytes / kBlockBytes; }
  // A free inode number (the lowest freed one, with its next generation, else a new one) or ENOSPC.
  std::uint32_t alloc_inode(Super& s, std::uint64_t& ino, std::uint64_t& gen);
  // The inode number of a new inode: inside an entry the front of the stream's pool (fs_entries.cc), else
  // alloc_inode (saving the superblock). ENOSPC when there is none.
  std::uint32_t take_inode(std::uint64_t& ino, std::uint64_t& gen);
  // A new inode made by `c` in `dir`, with Linux's rules for its group and set-id bits.
  Inode new_inode(std::uint64_t ino, std::uint64_t gen, FileType type, std::uint32_t mode, const Cred& c,
                  const Inode& dir) const;
  // Erases the data blocks of `n` with index >= `first` and counts them off.
  void erase_blocks_from(Inode& n, Super& s, std::uint64_t first);
  // Erases `n` and its data and frees its number (remembering its generation).
  void free_inode(Inode& n, Super& s);
  // One name of a non-directory is gone.
  void unlink_inode(Inode& n, Super& s);

  // ---- fs_undo.cc ----
  // Records the value of `k` before the op's first change to it.
  void record(const ObjectKey& k);
  void put(const ObjectKey& k, Value v);
  void put(const ObjectKey& k, Bytes v);
  void erase(const ObjectKey& k);
  // Undoes every change recorded after the undo log had `mark` records, newest first.
  void restore_to(std::size_t mark);
  // Partial: one undo record of `k` is gone.
  void drop_undo_key(const ObjectKey& k);
  // Service::commit_through and Service::rollback_to.
  void commit_through(std::uint64_t seq);
  void rollback_to(std::uint64_t seq);

  // ---- fs_entries.cc ----
  EntryRun execute_entry(const ExecContext& ctx, std::uint64_t stream, const Request& req);
  // run_ops as an entry of `sid`: creates take the front of its pool.
  Result run_as_entry(const Request& req, const StreamId& sid);
  // The front of `sid`'s pool, taken (ENOSPC when the pool is empty).
  std::uint32_t take_from_pool(const StreamId& sid, std::uint64_t& ino, std::uint64_t& gen);
  // Undoes a request that ended by an exception (back to `mark`) and clears what an op leaves set.
  void abandon(std::size_t mark);

  // ---- fs_fetch.cc ----
  std::uint32_t op_fetch(const Op& op, OpResult& out);
  void fetch_keys(const Op& op, OpResult& out) const;
  void fetch_trace(const Op& op, OpResult& out);
  // Report a read to the tracer: get(k) gave `v`; first_at_or_after(from) gave `found`.
  void trace_get(const ObjectKey& k, const Value& v) const;
  void trace_scan(const ObjectKey& from, const std::optional<ObjectKey>& found) const;
  // The least key >= `from` of the state before the traced request.
  std::optional<ObjectKey> initial_first_at_or_after(const ObjectKey& from) const;
  // Next facts from `from` on, over the state before the traced request, while the keys stay names or entries of
  // `from`'s directory, within kListingFactsMax facts (fs_fetch.cc says why).
  void trace_listing(const ObjectKey& from) const;
  // The least key >= `from` before the traced request, reported once as the next fact from `from`.
  std::optional<ObjectKey> trace_next(const ObjectKey& from) const;

  // ---- fs_streams.cc ----
  std::uint32_t op_reserve(const Op& op, OpResult& out);
  std::uint32_t op_stage(const Op& op, OpResult& out);
  std::uint32_t op_stream_close(const Op& op);
  // The stream's record; false (and a fresh record) if it does not exist.
  bool load_stream(const StreamId& sid, StreamRec& out) const;
  void save_stream(const StreamId& sid, const StreamRec& rec);
  std::uint64_t load_pool_head(const StreamId& sid) const;
  // The client's streams other than `keep`; with `expire`, those idle kStreamIdleSeqs are erased first and not
  // counted.
  std::uint32_t other_streams(const StreamId& keep, bool expire);
  // ENOSPC if a stream `sid` that does not exist yet would be the client's (kStreamsPerClientMax + 1)th; with
  // `expire`, idle streams are erased first.
  std::uint32_t check_stream_room(const StreamId& sid, bool exists, bool expire);
  // Returns the pool's inode numbers to the free list as they were and erases every object of the stream.
  void erase_stream(const StreamId& sid, const StreamRec& rec);
  // Erases every staged part of the stream (its record's counters are reset by the caller's copy).
  void erase_staged(const StreamId& sid, StreamRec& rec);
  // A staged part's bytes (empty if the part is not present).
  Bytes read_part(const StreamId& sid, std::uint32_t part) const;
  void write_part(const StreamId& sid, std::uint32_t part, const Bytes& bytes, StreamRec& rec);
  void erase_part(const StreamId& sid, std::uint32_t part, StreamRec& rec);

  // ---- fs_epoch.cc ----
  std::uint32_t op_epoch(const Op& op, OpResult& out);
  // The staged entries an EPOCH names, in part order; false if they are not the ones it names (kStaging).
  bool collect_staged(const Op& op, const StreamId& sid, bool exists, const StreamRec& rec,
                      std::vector<Entry>& out) const;
  // Runs the entries in order; at the first that does not match, undoes all of them and reports it in `out`.
  bool run_epoch_entries(const std::vector<const Entry*>& entries, const StreamId& sid, OpResult& out);

  // ---- fs_checkpoint.cc ----
  CheckpointId checkpoint(std::uint64_t seq, std::span<const std::uint8_t> engine_state);
  void begin_install();
  // Decodes and validates one fetched partition (the digest only proves a peer had these bytes, not that they
  // are file-service state) and stages it. The first error is the one finish_install reports.
  void install_partition(std::uint64_t p, std::span<const std::uint8_t> data);
  CheckpointId finish_install(std::uint64_t target_seq, std::span<const std::uint8_t> engine_state);

  // ---- fs_invariants.cc ----
  // O(1) checks after every request (asserted).
  void check_cheap_invariants() const;
  // FsService::check_invariants: the full walk (tests).
  std::string check_invariants() const;

  FsOptions opt;
  bool partial = false;  // over a partial store (the local model)
  std::unique_ptr<CheckpointedStore> owned_store;
  CheckpointedStore& store;
  CheckpointId recovered;
  Bytes recovered_engine_state;  // the store's, stored with `recovered`
  std::vector<UndoRec> undo;       // changes after `committed`, in execution order
  std::set<ObjectKey> touched;     // keys with an undo record in the current op
  bool installing = false;
  std::string install_error;
  // Whether a staged partition holding the superblock (root inode) holds it; nullopt if not staged.
  std::optional<bool> staged_super;
  std::optional<bool> staged_root;
  bool mutating = false;
  bool overflow = false;
  std::uint64_t cur_seq = 0;
  NodeId cur_client = 0;   // ExecContext::client of the request executing
  std::uint64_t now = 0;   // the time of the op executing (the batch's, or the last TIME before it)
  std::optional<StreamId> pool;  // inside an entry: the stream whose pool creates take from
  Tracer* tracer = nullptr;      // during FETCH's trace: where reads are reported
  std::map<ObjectKey, std::uint32_t> undo_keys;  // partial: undo records per key (the overlay)
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;
};

}  // namespace bftfs::fs
