#include "criu-hooks/epoch_log.h"

#include <utility>

#include "common/assert.h"

namespace bftfs::criu {

const EpochRecord& EpochLog::oldest() const {
  BFT_ASSERT(!epochs_.empty());
  return epochs_.front();
}

const EpochRecord& EpochLog::newest() const {
  BFT_ASSERT(!epochs_.empty());
  return epochs_.back();
}

const EpochRecord* EpochLog::find(EpochId id) const {
  for (const EpochRecord& e : epochs_) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

std::vector<EpochId> EpochLog::ids() const {
  std::vector<EpochId> out;
  out.reserve(epochs_.size());
  for (const EpochRecord& e : epochs_) out.push_back(e.id);
  return out;
}

void EpochLog::begin(EpochRecord record) {
  BFT_ASSERT(record.id > last_id_);
  BFT_ASSERT(record.output.empty());
  BFT_ASSERT(record.output_bytes == 0);
  last_id_ = record.id;
  epochs_.push_back(std::move(record));
}

void EpochLog::append_output(Stream stream, std::string_view bytes) {
  BFT_ASSERT(!epochs_.empty());
  if (bytes.empty()) return;
  EpochRecord& e = epochs_.back();
  if (e.output.empty() || e.output.back().stream != stream) e.output.push_back(OutputChunk{stream, {}});
  e.output.back().bytes.append(bytes);
  e.output_bytes += bytes.size();
  held_bytes_ += bytes.size();
}

EpochRecord EpochLog::commit_oldest() {
  BFT_ASSERT(!epochs_.empty());
  EpochRecord e = std::move(epochs_.front());
  epochs_.pop_front();
  BFT_ASSERT(held_bytes_ >= e.output_bytes);
  held_bytes_ -= e.output_bytes;
  return e;
}

std::vector<EpochRecord> EpochLog::rollback_to(EpochId id, std::size_t& dropped_bytes) {
  BFT_ASSERT(find(id) != nullptr);
  dropped_bytes = 0;
  std::vector<EpochRecord> removed;
  while (epochs_.back().id != id) {
    dropped_bytes += epochs_.back().output_bytes;
    removed.push_back(std::move(epochs_.back()));
    epochs_.pop_back();
  }
  EpochRecord& target = epochs_.back();
  dropped_bytes += target.output_bytes;
  target.output.clear();
  target.output_bytes = 0;
  BFT_ASSERT(held_bytes_ >= dropped_bytes);
  held_bytes_ -= dropped_bytes;
  return removed;
}

}  // namespace bftfs::criu
