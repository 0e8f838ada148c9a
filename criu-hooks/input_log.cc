#include "criu-hooks/input_log.h"

#include "common/assert.h"

namespace bftfs::criu {

void InputLog::append(std::string_view bytes) {
  BFT_ASSERT(!eof_);
  bytes_.append(bytes);
}

void InputLog::set_eof() { eof_ = true; }

std::string_view InputLog::unwritten() const {
  BFT_ASSERT(written_ >= base_);
  BFT_ASSERT(written_ <= end());
  return std::string_view(bytes_).substr(static_cast<std::size_t>(written_ - base_));
}

void InputLog::mark_written(std::size_t n) {
  BFT_ASSERT(written_ + n <= end());
  written_ += n;
}

void InputLog::rewind(std::uint64_t offset) {
  BFT_ASSERT(offset >= base_);
  BFT_ASSERT(offset <= written_);
  written_ = offset;
}

void InputLog::trim(std::uint64_t offset) {
  BFT_ASSERT(offset <= written_);
  if (offset <= base_) return;
  bytes_.erase(0, static_cast<std::size_t>(offset - base_));
  base_ = offset;
}

}  // namespace bftfs::criu
