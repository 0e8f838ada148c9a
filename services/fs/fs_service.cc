// The file service: see fs_service.h for the contract and docs/FILESERVICE.md for the design.
//
// This file builds the service (a fresh store gets the initial state) and holds FsService's public members, which
// forward to FsService::Impl; fs_service_impl.h says which file holds which of Impl's concerns. Start reading at
// fs_execute.cc (how a request runs), then the ops (fs_name_ops.cc, fs_data_ops.cc).
#include "services/fs/fs_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/assert.h"
#include "services/checkpoint_keeper_internal.h"
#include "services/fs/checkpointed_store.h"
#include "services/fs/fs_service_impl.h"
#include "services/fs/fs_state.h"

namespace bftfs::fs {

FsService::Impl::Impl(std::unique_ptr<CheckpointedStore> owned, FsOptions o)
    : opt(o), owned_store(std::move(owned)), store(*owned_store) {
  BFT_ASSERT(opt.partitions > 0);
  BFT_ASSERT(opt.inodes_max >= 1);
  BFT_ASSERT(opt.file_bytes_max <= (1ull << 62));  // offsets plus lengths never overflow
  BFT_ASSERT(opt.dir_positions >= 1);
  BFT_ASSERT(opt.dir_positions <= kDirPositionsMax);
  BFT_ASSERT(store.partition_count() == opt.partitions);
  if (!store.has_checkpoint()) {
    // A fresh store: the initial state (same on every replica) is checkpoint 0.
    BFT_ASSERT(store.object_count() == 0);
    put_initial_objects();
    const std::optional<CheckpointId> id = store.checkpoint(0);
    BFT_ASSERT(id.has_value());  // values written a moment ago by this process
  }
  recovered = store.latest();
  // Every state has these two objects. Bytes that fail their checksum are not a reason to stop: the service
  // starts damaged (damaged_partitions()) and the engine repairs it; an object that is simply absent is a bug.
  const std::uint64_t corrupt_before = store.corrupt_reads();
  const Value super = store.get(ObjectKey::super());
  const bool has_root = store.get(ObjectKey::inode(kRootIno)) != nullptr;
  const bool corrupt = store.corrupt_reads() != corrupt_before;
  BFT_ASSERT((super != nullptr && has_root) || corrupt);
  Super decoded;
  if (super != nullptr && !decode_super(*super, decoded)) {
    // Stored by a build that keeps other formats (fs_state.h, kStateFormat): its values cannot be read.
    services_internal::fatal_snapshot("fs", "the superblock is not of state format " +
                                                std::to_string(kStateFormat) + ", the one this build keeps");
  }
  committed = recovered.seq;
  last_executed = committed;
}

void FsService::Impl::put_initial_objects() {
  Super sup;
  sup.next_ino = kRootIno + 1;
  sup.used_inodes = 1;
  store.put(ObjectKey::super(), make_value(encode_super(sup)));
  Inode root;
  root.ino = kRootIno;
  root.generation = 1;
  root.type = FileType::kDirectory;
  root.mode = opt.root_mode & kModeBits;
  root.nlink = 2;
  root.uid = opt.root_uid;
  root.gid = opt.root_gid;
  root.parent = kRootIno;
  store.put(ObjectKey::inode(kRootIno), make_value(encode_inode(root)));
}

FsService::FsService(SnapshotStore* store, FsOptions options)
    : FsService(std::make_unique<MemoryCheckpointedStore>(store, options.partitions), options) {}
FsService::FsService(std::unique_ptr<CheckpointedStore> store, FsOptions options)
    : impl_(std::make_unique<Impl>(std::move(store), options)) {}
FsService::~FsService() = default;

Bytes FsService::execute(const ExecContext& ctx, std::span<const std::uint8_t> op) { return impl_->execute(ctx, op); }
bool FsService::execute_read_only(NodeId client, std::span<const std::uint8_t> op, Bytes& result) {
  (void)client;  // credentials travel in each op
  return impl_->execute_read_only(op, result);
}
void FsService::commit_through(std::uint64_t seq) { impl_->commit_through(seq); }
void FsService::rollback_to(std::uint64_t seq) { impl_->rollback_to(seq); }
CheckpointId FsService::checkpoint(std::uint64_t seq) { return impl_->checkpoint(seq); }
void FsService::discard_checkpoints_below(std::uint64_t seq) { impl_->store.discard_below(seq); }
CheckpointId FsService::recovered_checkpoint() const { return impl_->recovered; }
std::uint64_t FsService::partition_count() const { return impl_->opt.partitions; }
const PartitionTree& FsService::checkpoint_tree(std::uint64_t seq) const { return impl_->store.tree(seq); }
Bytes FsService::read_partition(std::uint64_t seq, std::uint64_t index) const {
  BFT_ASSERT(index < impl_->opt.partitions);
  return impl_->store.read_partition(seq, index);
}
void FsService::begin_install(std::uint64_t target_seq) {
  (void)target_seq;  // the base is the store's newest checkpoint
  impl_->begin_install();
}
void FsService::install_partition(std::uint64_t index, std::span<const std::uint8_t> data) {
  impl_->install_partition(index, data);
}
CheckpointId FsService::finish_install(std::uint64_t target_seq) { return impl_->finish_install(target_seq); }
std::vector<std::uint64_t> FsService::damaged_partitions() const {
  const auto& c = impl_->store.corrupt_partitions();
  return {c.begin(), c.end()};
}

std::string FsService::check_invariants() const { return impl_->check_invariants(); }
std::uint64_t FsService::undo_records() const { return impl_->undo.size(); }
std::uint64_t FsService::object_count() const { return impl_->store.object_count(); }
const FsOptions& FsService::options() const { return impl_->opt; }

}  // namespace bftfs::fs
