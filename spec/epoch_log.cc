// The epochs of one stream and their batches: see epoch_log.h.
#include "spec/epoch_log.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "spec/entry_builder.h"

namespace bftfs::spec {

namespace {

// What put_entry writes for `entry` (services/fs/fs_codec_speculation.cc): expectation, length, request.
std::size_t entry_bytes(const fs::Entry& entry) { return 1 + 1 + 4 + 4 + fs::encode_request(entry.request).size(); }

}  // namespace

EpochLog::EpochLog(std::uint64_t stream, std::size_t part_bytes_max)
    : stream_(stream), part_bytes_max_(part_bytes_max) {
  BFT_ASSERT(part_bytes_max <= kPartBytesMax);
}

std::optional<fs::Request> EpochLog::append(fs::Entry entry) {
  const std::size_t bytes = entry_bytes(entry);
  BFT_ASSERT(4 + bytes <= part_bytes_max_);  // every entry fits a part on its own
  BFT_ASSERT(open_entries_ < fs::kEntriesMax);
  std::optional<fs::Request> stage;
  if (pending_bytes_ + bytes > part_bytes_max_) stage = stage_pending();
  pending_.push_back(std::move(entry));
  pending_bytes_ += bytes;
  ++open_entries_;
  open_bytes_ += bytes;
  return stage;
}

fs::Request EpochLog::stage_pending() {
  BFT_ASSERT(!pending_.empty());
  BFT_ASSERT(parts_ < fs::kStagePartsMax);
  const Bytes part = fs::encode_entries(pending_);
  BFT_ASSERT(part.size() == pending_bytes_);
  parts_digest_.add(part);
  fs::Op op = stream_op(fs::OpCode::kStage, stream_, open_);
  op.part = parts_++;
  op.entries = std::move(pending_);
  pending_.clear();
  pending_bytes_ = 4;
  return fs::Request{{std::move(op)}};
}

SealedEpoch EpochLog::seal() {
  SealedEpoch sealed;
  sealed.epoch = open_;
  sealed.prev = tail_;
  fs::Op op = stream_op(fs::OpCode::kEpoch, stream_, open_);
  op.prev = tail_;
  op.parts = parts_;
  op.parts_digest = parts_ > 0 ? parts_digest_.finish() : Digest{};
  op.entries = std::move(pending_);
  sealed.request = fs::Request{{std::move(op)}};
  prev_of_[open_] = tail_;
  tail_ = open_;
  open_ = next_++;
  pending_.clear();
  pending_bytes_ = 4;
  parts_ = 0;
  parts_digest_ = DigestBuilder();
  open_entries_ = 0;
  open_bytes_ = 0;
  return sealed;
}

void EpochLog::committed(std::uint64_t epoch) {
  BFT_ASSERT(prev_of_.count(epoch) != 0);  // sealed, and not discarded
  last_committed_ = std::max(last_committed_, epoch);
  // Links below the last committed epoch are never walked again (descends_from asks about later epochs).
  prev_of_.erase(prev_of_.begin(), prev_of_.lower_bound(last_committed_));
}

void EpochLog::failed(std::uint64_t epoch) {
  BFT_ASSERT(prev_of_.count(epoch) != 0);
  for (auto it = prev_of_.begin(); it != prev_of_.end() && it->first < epoch; ++it) {
    BFT_ASSERT(it->first <= last_committed_);  // every epoch before it committed
  }
  prev_of_.erase(prev_of_.find(epoch), prev_of_.end());
  tail_ = last_committed_;
  open_ = next_++;  // the open epoch ran after the failed one: it is discarded with it
  pending_.clear();
  pending_bytes_ = 4;
  parts_ = 0;
  parts_digest_ = DigestBuilder();
  open_entries_ = 0;
  open_bytes_ = 0;
}

bool EpochLog::descends_from(std::uint64_t later, std::uint64_t epoch) const {
  while (later > epoch) {  // a prev is always below its epoch: each step goes down
    const auto it = prev_of_.find(later);
    if (it == prev_of_.end()) return false;
    later = it->second;
  }
  return later == epoch;
}

}  // namespace bftfs::spec
