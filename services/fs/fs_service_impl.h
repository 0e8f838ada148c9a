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
// Value formats are in fs_state.h, the POSIX rules in fs_permissions.h.
//
// Every op first checks everything it can (handles, types, names, permissions, limits) and only then mutates,
// through put()/erase(), which record undo. Partition overflow is the one failure found while mutating; it is
// handled like any failure: the op's changes are undone.
#pragma once

#include <cstdint>
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
    Value old;  // null: the key was absent
  };

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
  // The superblock and the root directory, owned by opt.root_uid/root_gid with opt.root_mode.
  void put_initial_objects();

  // ---- fs_execute.cc ----
  // Service::execute and Service::execute_read_only (see fs_service.h).
  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> bytes);
  bool execute_read_only(std::span<const std::uint8_t> bytes, Bytes& result);
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
  // Service::commit_through and Service::rollback_to.
  void commit_through(std::uint64_t seq);
  void rollback_to(std::uint64_t seq);

  // ---- fs_checkpoint.cc ----
  CheckpointId checkpoint(std::uint64_t seq);
  void begin_install();
  // Decodes and validates one fetched partition (the digest only proves a peer had these bytes, not that they
  // are file-service state) and stages it. The first error is the one finish_install reports.
  void install_partition(std::uint64_t p, std::span<const std::uint8_t> data);
  CheckpointId finish_install(std::uint64_t target_seq);

  // ---- fs_invariants.cc ----
  // O(1) checks after every request (asserted).
  void check_cheap_invariants() const;
  // FsService::check_invariants: the full walk (tests).
  std::string check_invariants() const;

  FsOptions opt;
  std::unique_ptr<CheckpointedStore> owned_store;
  CheckpointedStore& store;
  CheckpointId recovered;
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
  std::uint64_t now = 0;
  std::uint64_t committed = 0;
  std::uint64_t last_executed = 0;
};

}  // namespace bftfs::fs
