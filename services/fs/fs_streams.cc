// Speculation streams (see fs_service_impl.h and docs/SPECULATION.md §5.2, §5.5, §5.6): RESERVE, STAGE and
// STREAM_CLOSE, the stream objects, staged parts, and the erasure of idle streams.
#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_service_impl.h"

namespace bftfs::fs {

bool FsService::Impl::load_stream(const StreamId& sid, StreamRec& out) const {
  out = StreamRec{};
  const Value v = get(stream_key(sid));
  if (v == nullptr) return false;
  const bool decoded = decode_stream(*v, out);
  BFT_ASSERT(decoded);  // validated when it entered the store
  return true;
}

void FsService::Impl::save_stream(const StreamId& sid, const StreamRec& rec) {
  put(stream_key(sid), encode_stream(rec));
}

std::uint64_t FsService::Impl::load_pool_head(const StreamId& sid) const {
  const Value v = get(pool_head_key(sid));
  std::uint64_t head = 0;
  if (v == nullptr) return head;  // nothing taken yet
  const bool decoded = decode_u64(*v, head);
  BFT_ASSERT(decoded);
  return head;
}

std::uint32_t FsService::Impl::other_streams(const StreamId& keep, bool expire) {
  const ObjectKey first = first_stream_key(keep.client);
  std::uint32_t live = 0;
  // At most kStreamsPerClientMax streams exist per client: no stream is created beyond that.
  for (std::optional<ObjectKey> k = first_at_or_after(first); k.has_value() && has_prefix(*k, first);
       k = first_at_or_after(*key_successor(*k))) {
    const StreamId sid = stream_of(*k);
    if (sid == keep) continue;
    StreamRec rec;
    load_stream(sid, rec);
    if (expire && rec.last_seq + kStreamIdleSeqs < cur_seq) {
      erase_stream(sid, rec);
    } else {
      ++live;
    }
  }
  return live;
}

std::uint32_t FsService::Impl::check_stream_room(const StreamId& sid, bool exists, bool expire) {
  const std::uint32_t others = other_streams(sid, expire);
  if (!exists && others >= kStreamsPerClientMax) return err::kNoSpc;
  return err::kOk;
}

void FsService::Impl::erase_stream(const StreamId& sid, const StreamRec& rec) {
  Super s = load_super();
  for (std::uint64_t i = load_pool_head(sid); i < rec.pool_tail; ++i) {
    const ObjectKey k = pool_key(sid, i);
    const Value v = get(k);
    require_consistent(v != nullptr);  // the pool is [head, tail)
    ReservedInode ri;
    const bool decoded = decode_reserved(*v, ri);
    BFT_ASSERT(decoded);
    // Back to the free list as it was before RESERVE: the next allocation gives it the same generation.
    put(ObjectKey::free_ino(ri.ino), encode_u64(ri.generation - 1));
    erase(k);
    require_consistent(s.used_inodes > 0);
    --s.used_inodes;
  }
  StreamRec cleared = rec;
  erase_staged(sid, cleared);
  erase(pool_head_key(sid));
  erase(stream_key(sid));
  save_super(s);
}

std::uint32_t FsService::Impl::op_reserve(const Op& op, OpResult& out) {
  const StreamId sid{cur_client, op.stream};
  StreamRec rec;
  const bool exists = load_stream(sid, rec);
  std::uint32_t e = check_stream_room(sid, exists, true);
  if (e != err::kOk) return e;
  const std::uint64_t head = load_pool_head(sid);
  require_consistent(head <= rec.pool_tail);
  if (rec.pool_tail - head + op.reserve > kPoolInodesMax) return err::kNoSpc;
  Super s = load_super();
  if (s.used_inodes + op.reserve > opt.inodes_max) return err::kNoSpc;
  out.pool_first = rec.pool_tail;
  for (std::uint16_t i = 0; i < op.reserve; ++i) {
    ReservedInode ri;
    e = alloc_inode(s, ri.ino, ri.generation);
    BFT_ASSERT(e == err::kOk);  // room checked above
    put(pool_key(sid, rec.pool_tail), encode_reserved(ri));
    ++rec.pool_tail;
    out.reserved.push_back(ri);
  }
  rec.last_seq = cur_seq;
  save_stream(sid, rec);
  save_super(s);
  return err::kOk;
}

std::uint32_t FsService::Impl::op_stage(const Op& op, OpResult& out) {
  const StreamId sid{cur_client, op.stream};
  StreamRec rec;
  const bool exists = load_stream(sid, rec);
  if (op.epoch <= rec.last || op.epoch < rec.staging_epoch) return err::kStale;  // stale or resubmitted
  // No idle stream is erased here: STAGE changes stream objects only (docs/SPECULATION.md I2).
  const std::uint32_t e = check_stream_room(sid, exists, false);
  if (e != err::kOk) return e;
  if (op.epoch > rec.staging_epoch) {
    erase_staged(sid, rec);  // an earlier epoch's parts: it applied or failed, they are garbage
    rec.staging_epoch = op.epoch;
  }
  erase_part(sid, op.part, rec);  // a resubmission brings the same bytes again
  const Bytes bytes = encode_entries(op.entries);
  if (rec.staged_bytes + bytes.size() > kStagedBytesMax) return err::kNoSpc;
  write_part(sid, op.part, bytes, rec);
  rec.last_seq = cur_seq;
  save_stream(sid, rec);
  out.parts_present = rec.parts_present;
  out.staged_bytes = rec.staged_bytes;
  return err::kOk;
}

std::uint32_t FsService::Impl::op_stream_close(const Op& op) {
  const StreamId sid{cur_client, op.stream};
  StreamRec rec;
  if (load_stream(sid, rec)) erase_stream(sid, rec);  // closing a closed stream is not an error
  return err::kOk;
}

// ---- staged parts: chunks of kBlockBytes, so that no partition grows by more than a data block ----

void FsService::Impl::erase_staged(const StreamId& sid, StreamRec& rec) {
  const ObjectKey first = first_staged_key(sid);
  for (std::optional<ObjectKey> k = first_at_or_after(first); k.has_value() && has_prefix(*k, first);
       k = first_at_or_after(*key_successor(*k))) {
    erase(*k);
  }
  rec.parts_present = 0;
  rec.staged_bytes = 0;
}

void FsService::Impl::erase_part(const StreamId& sid, std::uint32_t part, StreamRec& rec) {
  const ObjectKey first = first_chunk_key(sid, part);
  bool present = false;
  for (std::optional<ObjectKey> k = first_at_or_after(first); k.has_value() && has_prefix(*k, first);
       k = first_at_or_after(*key_successor(*k))) {
    const Value v = get(*k);
    require_consistent(v != nullptr && rec.staged_bytes >= v->size());
    rec.staged_bytes -= v->size();
    erase(*k);
    present = true;
  }
  if (!present) return;
  require_consistent(rec.parts_present > 0);
  --rec.parts_present;
}

void FsService::Impl::write_part(const StreamId& sid, std::uint32_t part, const Bytes& bytes, StreamRec& rec) {
  BFT_ASSERT(!bytes.empty());  // a part holds at least one entry
  std::uint32_t chunk = 0;
  for (std::size_t at = 0; at < bytes.size(); at += kBlockBytes, ++chunk) {
    const std::size_t n = std::min<std::size_t>(kBlockBytes, bytes.size() - at);
    const auto from = bytes.begin() + static_cast<std::ptrdiff_t>(at);
    put(staged_key(sid, part, chunk), Bytes(from, from + static_cast<std::ptrdiff_t>(n)));
  }
  ++rec.parts_present;
  rec.staged_bytes += bytes.size();
}

Bytes FsService::Impl::read_part(const StreamId& sid, std::uint32_t part) const {
  const ObjectKey first = first_chunk_key(sid, part);
  Bytes out;
  std::uint32_t expected = 0;
  for (std::optional<ObjectKey> k = first_at_or_after(first); k.has_value() && has_prefix(*k, first);
       k = first_at_or_after(*key_successor(*k)), ++expected) {
    require_consistent(chunk_of(*k) == expected);  // written as chunks 0, 1, ...
    const Value v = get(*k);
    require_consistent(v != nullptr);
    out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

}  // namespace bftfs::fs
