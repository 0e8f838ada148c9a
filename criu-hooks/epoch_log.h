// The uncommitted epochs of a supervised tree, oldest first, with the output each one produced.
//
// An epoch begins with a checkpoint of the tree and ends where the next one begins (or where the tree exits).
// Everything the tree prints during an epoch is held in that epoch until the epoch commits, and is dropped if the
// tree rolls back to that epoch or an earlier one; so no byte printed after a checkpoint is ever both released
// and printed again by the restored tree. Epochs commit in order, oldest first. When no epoch is uncommitted the
// tree runs without speculation and its output is released as it comes (the caller's job: see empty()).
// Pure bookkeeping: no I/O.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace bftfs::criu {

using EpochId = std::uint64_t;

enum class Stream : std::uint8_t { kStdout = 1, kStderr = 2 };

struct OutputChunk {
  Stream stream = Stream::kStdout;
  std::string bytes;
};

// What a rollback to an epoch needs besides its image: how much of stdin the tree had consumed at the checkpoint,
// and the CRIU keys of the tree's stdin, stdout and stderr as they were then (they change when a restore gives
// the tree fresh pipes).
struct EpochRecord {
  EpochId id = 0;
  std::uint64_t stdin_consumed = 0;
  std::string stdin_key;   // e.g. "pipe:[1234]"
  std::string stdout_key;  // "pipe:[1235]", or "tty[8803:19]" for a pty
  std::string stderr_key;  // equal to stdout_key for a pty
  std::vector<OutputChunk> output;  // in the order it was read; consecutive bytes of one stream are merged
  std::size_t output_bytes = 0;
};

class EpochLog {
 public:
  bool empty() const { return epochs_.empty(); }
  std::size_t size() const { return epochs_.size(); }
  const EpochRecord& oldest() const;
  const EpochRecord& newest() const;
  // The uncommitted epoch with this id, or nullptr.
  const EpochRecord* find(EpochId id) const;
  std::vector<EpochId> ids() const;
  // Bytes of output held in all epochs.
  std::size_t held_bytes() const { return held_bytes_; }

  // A checkpoint was taken: `record` becomes the newest epoch (its output starts empty). Precondition: its id is
  // greater than every id seen before.
  void begin(EpochRecord record);
  // Output the tree produced, held in the newest epoch. Precondition: !empty().
  void append_output(Stream stream, std::string_view bytes);
  // Removes the oldest epoch and returns it with its output, which may now be released.
  EpochRecord commit_oldest();
  // Rolls back to epoch `id`: drops the output of `id` and of every newer epoch, removes the newer epochs and
  // returns them (their images can be deleted); `id` becomes the newest epoch again. `dropped_bytes` receives
  // the number of output bytes dropped. Precondition: find(id) != nullptr.
  std::vector<EpochRecord> rollback_to(EpochId id, std::size_t& dropped_bytes);

 private:
  std::deque<EpochRecord> epochs_;
  std::size_t held_bytes_ = 0;
  EpochId last_id_ = 0;
};

}  // namespace bftfs::criu
