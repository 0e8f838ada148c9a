// The bytes a user sends to the supervised tree's stdin, kept so that a rollback can replay them.
//
// Offsets count bytes from the start of the run. The log holds [base, end): `written` is how far the supervisor
// has written into the tree's stdin pipe. A checkpoint records how much the tree had consumed (written minus
// what still sat in the pipe); a rollback to it rewinds `written` to that offset, so the restored tree reads
// exactly the bytes it had not consumed at the checkpoint, followed by the rest. Bytes before the oldest offset a
// rollback may still need are trimmed. Pure: no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace bftfs::criu {

class InputLog {
 public:
  // Appends bytes the user sent. Precondition: !eof().
  void append(std::string_view bytes);
  // The user's stdin ended: once everything is written, the tree's stdin is closed.
  void set_eof();
  bool eof() const { return eof_; }

  std::uint64_t base() const { return base_; }
  std::uint64_t written() const { return written_; }
  std::uint64_t end() const { return base_ + bytes_.size(); }
  // The bytes not yet written to the tree, [written, end).
  std::string_view unwritten() const;
  // `n` more bytes were written to the tree. Precondition: n <= unwritten().size().
  void mark_written(std::size_t n);
  // True when the user's stdin ended and every byte has been written: the tree's stdin can be closed.
  bool drained() const { return eof_ && written_ == end(); }

  // A rollback: the restored tree had consumed exactly `offset` bytes. Precondition: base <= offset <= written.
  void rewind(std::uint64_t offset);
  // No rollback will need the bytes before `offset`. Precondition: offset <= written. Offsets below base are
  // ignored (already trimmed).
  void trim(std::uint64_t offset);

 private:
  std::string bytes_;  // [base_, base_ + size)
  std::uint64_t base_ = 0;
  std::uint64_t written_ = 0;
  bool eof_ = false;
};

}  // namespace bftfs::criu
