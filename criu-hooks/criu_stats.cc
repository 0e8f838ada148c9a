#include "criu-hooks/criu_stats.h"

#include <functional>

namespace bftfs::criu {
namespace {

// A cursor over protobuf bytes: varints and length-delimited fields, every read bounds-checked.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return pos_ == bytes_.size(); }

  bool u32le(std::uint32_t& out) {
    if (bytes_.size() - pos_ < 4) return false;
    out = 0;
    for (std::size_t i = 4; i-- > 0;) out = (out << 8) | static_cast<std::uint8_t>(bytes_[pos_ + i]);
    pos_ += 4;
    return true;
  }

  bool varint(std::uint64_t& out) {
    out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == bytes_.size()) return false;
      const auto b = static_cast<std::uint8_t>(bytes_[pos_++]);
      out |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than ten bytes
  }

  bool bytes(std::size_t n, std::string_view& out) {
    if (bytes_.size() - pos_ < n) return false;
    out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

// Calls `on_varint(field, value)` for every varint field of a message and skips the other wire types. Returns
// "" or what is malformed.
std::string for_each_varint(std::string_view message,
                            const std::function<void(std::uint64_t, std::uint64_t)>& on_varint) {
  Reader r(message);
  while (!r.done()) {
    std::uint64_t key = 0;
    if (!r.varint(key)) return "truncated field key";
    const std::uint64_t field = key >> 3;
    const std::uint64_t wire_type = key & 7;
    std::uint64_t value = 0;
    std::string_view skipped;
    switch (wire_type) {
      case 0:
        if (!r.varint(value)) return "truncated varint";
        on_varint(field, value);
        break;
      case 1:
        if (!r.bytes(8, skipped)) return "truncated fixed64";
        break;
      case 2:
        if (!r.varint(value)) return "truncated length";
        if (value > message.size() || !r.bytes(static_cast<std::size_t>(value), skipped)) return "length past the end";
        break;
      case 5:
        if (!r.bytes(4, skipped)) return "truncated fixed32";
        break;
      default:
        return "unsupported wire type " + std::to_string(wire_type);
    }
  }
  return "";
}

// The embedded message `field` (dump = 1, restore = 2) of the one stats_entry in a stats file.
std::string stats_submessage(std::string_view file, std::uint64_t want_field, std::string_view& out) {
  Reader r(file);
  std::uint32_t magic1 = 0, magic2 = 0, length = 0;
  if (!r.u32le(magic1) || !r.u32le(magic2) || !r.u32le(length)) return "shorter than the header";
  if (magic1 != kImgServiceMagic) return "not a CRIU service image (first magic)";
  if (magic2 != kStatsMagic) return "not a CRIU stats image (second magic)";
  std::string_view entry;
  if (!r.bytes(length, entry)) return "entry length past the end";
  Reader e(entry);
  bool found = false;
  while (!e.done()) {
    std::uint64_t key = 0, len = 0;
    if (!e.varint(key)) return "truncated field key";
    if ((key & 7) != 2) return "stats_entry field is not a message";
    std::string_view sub;
    if (!e.varint(len) || len > entry.size() || !e.bytes(static_cast<std::size_t>(len), sub))
      return "truncated message";
    if ((key >> 3) == want_field) {
      out = sub;
      found = true;
    }
  }
  return found ? "" : "no " + std::string(want_field == 1 ? "dump" : "restore") + " statistics";
}

std::uint32_t clamp32(std::uint64_t v) { return v > 0xffffffffu ? 0xffffffffu : static_cast<std::uint32_t>(v); }

}  // namespace

std::string decode_dump_stats(std::string_view file, DumpStats& out) {
  std::string_view sub;
  if (std::string err = stats_submessage(file, 1, sub); !err.empty()) return err;
  DumpStats s;
  std::string err = for_each_varint(sub, [&s](std::uint64_t field, std::uint64_t v) {
    switch (field) {
      case 1: s.freezing_us = clamp32(v); break;
      case 2: s.frozen_us = clamp32(v); break;
      case 3: s.memdump_us = clamp32(v); break;
      case 4: s.memwrite_us = clamp32(v); break;
      case 7: s.pages_written = v; break;
      default: break;
    }
  });
  if (!err.empty()) return err;
  out = s;
  return "";
}

std::string decode_restore_stats(std::string_view file, RestoreStats& out) {
  std::string_view sub;
  if (std::string err = stats_submessage(file, 2, sub); !err.empty()) return err;
  RestoreStats s;
  std::string err = for_each_varint(sub, [&s](std::uint64_t field, std::uint64_t v) {
    switch (field) {
      case 3: s.forking_us = clamp32(v); break;
      case 4: s.restore_us = clamp32(v); break;
      case 5: s.pages_restored = v; break;
      default: break;
    }
  });
  if (!err.empty()) return err;
  out = s;
  return "";
}

}  // namespace bftfs::criu
