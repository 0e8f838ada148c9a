// The epochs of one stream and their batches (docs/SPECULATION.md §6.7, §6.8): the log of the open epoch, split
// into STAGE parts as it fills, sealed into an EPOCH request chained to the epoch before it, and the chain that
// tells a resubmitted batch that already applied from one that failed.
//
// Epoch numbers start at 1 and are never reused: the re-run after a failed epoch gets the next unused number,
// chained to the last committed epoch (an EPOCH's number is above its prev, so at most one batch per chain link
// can ever apply).
//
// Pure: no I/O, no clocks, no threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common/crypto.h"
#include "protocol/messages.h"
#include "services/fs/fs_codec.h"

namespace bftfs::spec {

// The bytes of entries one STAGE part (or the inline entries of one EPOCH) may take: a request's op room less
// 64 KiB for the shim's envelope and the op's own fields.
inline constexpr std::size_t kPartBytesMax = kOpBytesMax - 64u * 1024;

// A sealed epoch's final request.
struct SealedEpoch {
  std::uint64_t epoch = 0;
  std::uint64_t prev = 0;  // the epoch before it in the chain (0: none)
  fs::Request request;     // EPOCH: the entries not staged, inline; the digest of the parts staged
};

class EpochLog {
 public:
  // The epochs of `stream`; parts hold at most `part_bytes_max` bytes of entries (tests make it small).
  explicit EpochLog(std::uint64_t stream, std::size_t part_bytes_max = kPartBytesMax);

  // The open epoch, which entries are appended to.
  std::uint64_t open_epoch() const { return open_; }
  // Its entries and their bytes so far (the client keeps them under its bounds, §6.11).
  std::size_t open_entries() const { return open_entries_; }
  std::size_t open_bytes() const { return open_bytes_; }

  // Appends an entry to the open epoch. If the entries not yet staged and this one do not fit one part, those
  // become a part: returns its STAGE request, to send now (staging overlaps the tree's run). Precondition: one
  // entry fits a part, and the epoch holds fewer than kEntriesMax.
  std::optional<fs::Request> append(fs::Entry entry);
  // Seals the open epoch: its EPOCH request, chained to the tail of the chain; the next epoch opens, chained to
  // the sealed one.
  SealedEpoch seal();

  // Epoch `epoch` applied (its EPOCH's verdict, or a resubmission's CHAIN verdict whose last_before descends
  // from it).
  void committed(std::uint64_t epoch);
  // Epoch `epoch` will never apply; every epoch before it committed. It and every later epoch (sealed or open)
  // are discarded; the open epoch is renumbered and chained to the last committed epoch.
  void failed(std::uint64_t epoch);
  // Whether `later` is `epoch` or an epoch sealed after it in its chain (§6.8: a CHAIN verdict whose last_before
  // descends from e means an earlier execution of e's batch applied).
  bool descends_from(std::uint64_t later, std::uint64_t epoch) const;
  std::uint64_t last_committed() const { return last_committed_; }

 private:
  // Turns the pending entries into part `parts_` of the open epoch.
  fs::Request stage_pending();

  std::uint64_t stream_;
  std::size_t part_bytes_max_;
  std::uint64_t open_ = 1;         // the open epoch's number
  std::uint64_t next_ = 2;         // the next number never used
  std::uint64_t tail_ = 0;         // the open epoch's prev
  std::uint64_t last_committed_ = 0;
  std::map<std::uint64_t, std::uint64_t> prev_of_;  // sealed epochs not yet below the last committed -> prev
  std::vector<fs::Entry> pending_;                  // the open epoch's entries not yet staged
  std::size_t pending_bytes_ = 4;                   // their encoding (with its u32 count)
  std::uint32_t parts_ = 0;                         // parts staged for the open epoch
  DigestBuilder parts_digest_;                      // over their bytes, in part order
  std::size_t open_entries_ = 0;
  std::size_t open_bytes_ = 0;
};

}  // namespace bftfs::spec
