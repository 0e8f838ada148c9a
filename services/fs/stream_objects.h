// The speculation streams' objects (docs/SPECULATION.md §5.2): the keys of kinds kStream .. kStaged and the
// formats of their values. Public because a local model (spec/) knows the pool from RESERVE results: it puts the
// POOL objects a RESERVE appended into its store in the replicas' format.
//
// These bytes are state: hashed into checkpoint digests and validated by installs (fs_state.h's value_ok).
#pragma once

#include <cstdint>
#include <span>

#include "common/types.h"
#include "services/fs/fs_codec.h"
#include "services/fs/object_store.h"

namespace bftfs::fs {

// A stream: the client that owns it (ExecContext::client) and its number.
struct StreamId {
  NodeId client = 0;
  std::uint64_t stream = 0;
  friend bool operator==(const StreamId&, const StreamId&) = default;
};

// (0, kStream, client || stream): the stream's chain, staging and the tail of its pool. Entries never read or
// write it (the pool's front is its own object, kPoolHead), so RESERVE, STAGE and EPOCH, which change it, do
// not conflict with the entries a local model predicted.
struct StreamRec {
  std::uint64_t last = 0;           // the last applied epoch (0: none)
  std::uint64_t staging_epoch = 0;  // the epoch the staged parts belong to (0: none)
  std::uint32_t parts_present = 0;  // staged parts (distinct part numbers)
  std::uint64_t staged_bytes = 0;   // their bytes in all
  std::uint64_t pool_tail = 0;      // the pool index the next reserved inode number takes
  std::uint64_t last_seq = 0;       // the seq of the last RESERVE, STAGE or applied EPOCH
};

// Key names: big-endian fields, so names sort as the numbers in them (fs::Kind).
inline constexpr std::size_t kStreamNameBytes = 12;  // kStream, kPoolHead: client || stream
inline constexpr std::size_t kPoolNameBytes = 20;    // kPool: client || stream || index
inline constexpr std::size_t kStagedNameBytes = 20;  // kStaged: client || stream || part || chunk
ObjectKey stream_key(const StreamId& id);
ObjectKey pool_head_key(const StreamId& id);                        // value: u64 index (absent: 0)
ObjectKey pool_key(const StreamId& id, std::uint64_t index);        // value: ReservedInode
ObjectKey staged_key(const StreamId& id, std::uint32_t part, std::uint32_t chunk);  // value: <= kBlockBytes
// The least key of client's streams (a scan of them starts there), of a stream's staged chunks, of a part's.
ObjectKey first_stream_key(NodeId client);
ObjectKey first_staged_key(const StreamId& id);
ObjectKey first_chunk_key(const StreamId& id, std::uint32_t part);
// Whether `k` is a key of the kind `like` names whose name begins with like's name (a scan's bound).
bool has_prefix(const ObjectKey& k, const ObjectKey& like);
// The stream a kStream key names, the part and chunk of a kStaged key (keys validated by value_ok).
StreamId stream_of(const ObjectKey& k);
std::uint32_t part_of(const ObjectKey& k);
std::uint32_t chunk_of(const ObjectKey& k);
std::uint64_t pool_index_of(const ObjectKey& k);

Bytes encode_stream(const StreamRec& s);
bool decode_stream(std::span<const std::uint8_t> b, StreamRec& s);
Bytes encode_reserved(const ReservedInode& r);
bool decode_reserved(std::span<const std::uint8_t> b, ReservedInode& r);

}  // namespace bftfs::fs
