// Helpers shared by the write-ahead log's tests (tests/unit/test_wal_*.cc): temporary log directories, the
// files of a log as bytes, sample records and how to compare them, opening a log that must open (or must
// not), and segments framed by hand as the log frames them (storage/wal.h), for damage and older formats.
#pragma once

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "storage/crc32c.h"
#include "storage/wal.h"

namespace bftfs::wal_testing {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/bftfs-wal-XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string wal() const { return path + "/wal"; }
};

inline std::vector<std::string> list(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string only_segment(const std::string& dir) {
  auto files = list(dir);
  REQUIRE(files.size() == 1);
  return dir + "/" + files[0];
}

inline Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
inline void write_all(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
inline std::uint64_t file_size(const std::string& path) {
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<std::uint64_t>(st.st_size);
}
inline bool all_zero(const Bytes& b, std::size_t from, std::size_t to) {
  return std::all_of(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(to),
                     [](std::uint8_t x) { return x == 0; });
}
inline void zero(Bytes& b, std::size_t from, std::size_t to) {
  std::fill(b.begin() + static_cast<std::ptrdiff_t>(from), b.begin() + static_cast<std::ptrdiff_t>(to), 0);
}

inline Digest dig(std::uint8_t v) {
  Digest d;
  d.bytes.fill(v);
  return d;
}

inline PrePrepareRecord pre_prepare(std::uint64_t view, std::uint64_t seq, std::size_t op_bytes = 16) {
  PrePrepareRecord r;
  r.view = view;
  r.seq = seq;
  r.batch.timestamp_ns = 1000 + seq;
  Request q;
  q.client = 4;
  q.request_id = seq;
  q.op = Bytes(op_bytes, static_cast<std::uint8_t>(seq));
  q.authenticator.resize(4);
  r.batch.requests.push_back(q);
  return r;
}

inline std::vector<PersistRecord> sample_records() {
  std::vector<PersistRecord> rs;
  rs.reserve(16);
  rs.emplace_back(std::in_place_type<ViewRecord>, ViewRecord{0, false});
  for (std::uint64_t s = 1; s <= 3; ++s) {
    rs.push_back(pre_prepare(0, s));
    rs.push_back(PreparedRecord{0, s, dig(static_cast<std::uint8_t>(s))});
    rs.push_back(CommittedRecord{s, dig(static_cast<std::uint8_t>(s))});
  }
  rs.push_back(CheckpointRecord{3, dig(9), Bytes{1, 2, 3}});
  rs.push_back(ViewRecord{1, true});
  return rs;
}

// Records compare by their encoding (PersistRecord has no operator==).
inline std::vector<Bytes> encoded(const std::vector<PersistRecord>& rs) {
  std::vector<Bytes> out;
  for (const auto& r : rs) out.push_back(encode_record(r));
  return out;
}

inline std::unique_ptr<Wal> open_ok(const std::string& dir, std::vector<PersistRecord>& recs, WalOptions o = {}) {
  std::unique_ptr<Wal> w;
  const std::string err = Wal::open(dir, o, w, recs);
  INFO(err);
  REQUIRE(err.empty());
  REQUIRE(w != nullptr);
  return w;
}

inline std::string open_error(const std::string& dir, WalOptions o = {}) {
  std::unique_ptr<Wal> w;
  std::vector<PersistRecord> recs;
  std::string err = Wal::open(dir, o, w, recs);
  CHECK(w == nullptr);
  return err;
}

// Runs the log's housekeeping until it has none left (the runtime spreads it over its loop passes).
inline void settle(Wal& w) {
  int steps = 0;
  while (w.maintain()) REQUIRE(++steps < 100000);
}

inline WalOptions segments_of(std::uint64_t bytes) {
  WalOptions o;
  o.segment_bytes_max = bytes;
  o.compact_bytes_min = 1ull << 40;  // no compaction unless a test asks for it
  o.prealloc_chunk_bytes = 4096;
  return o;
}

inline std::uint64_t seq_of(const PersistRecord& r) {
  return std::visit(
      [](const auto& x) -> std::uint64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, ViewRecord>) {
          return x.view;
        } else {
          return x.seq;
        }
      },
      r);
}

// What compaction must keep of `all` (wal.h): the latest view and stable records, checkpoints at or above the
// stable seq, ordering records above it, in order.
inline std::vector<PersistRecord> needed(const std::vector<PersistRecord>& all) {
  std::uint64_t stable = 0;
  std::size_t last_view = all.size();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (const auto* s = std::get_if<StableRecord>(&all[i])) stable = s->seq;
    if (std::holds_alternative<ViewRecord>(all[i])) last_view = i;
  }
  std::vector<PersistRecord> out;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const PersistRecord& r = all[i];
    const std::uint64_t s = seq_of(r);
    if (std::holds_alternative<ViewRecord>(r)) {
      if (i == last_view) out.push_back(r);
    } else if (std::holds_alternative<StableRecord>(r)) {
      if (s == stable) out.push_back(r);
    } else if (std::holds_alternative<CheckpointRecord>(r)) {
      if (s >= stable) out.push_back(r);
    } else if (s > stable) {
      out.push_back(r);
    }
  }
  return out;
}

inline bool is_subsequence(const std::vector<Bytes>& small, const std::vector<Bytes>& big) {
  std::size_t j = 0;
  for (const Bytes& b : big) {
    if (j < small.size() && small[j] == b) ++j;
  }
  return j == small.size();
}

// A record framed as the log frames it (wal.h), for hand-made segments.
inline Bytes frame(std::uint64_t salt, std::uint32_t flags, const Bytes& payload) {
  std::uint8_t head[12];
  for (int i = 0; i < 8; ++i) head[i] = static_cast<std::uint8_t>(salt >> (8 * i));
  const std::uint32_t lf = flags | static_cast<std::uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<std::uint8_t>(lf >> (8 * i));
  const std::uint32_t crc = crc32c(crc32c(0, head), payload);
  Bytes out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(lf >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}
inline constexpr std::uint32_t kGroupStartFlag = 0x80000000u;

// The header of a format-1 segment (an older bftfs: no preallocation, no seals).
inline Bytes v1_header(std::uint64_t salt) {
  Bytes h = {'B', 'F', 'T', 'W', 'A', 'L', '0', '1'};
  for (int i = 0; i < 8; ++i) h.push_back(static_cast<std::uint8_t>(salt >> (8 * i)));
  const std::uint32_t crc = crc32c(0, h);
  for (int i = 0; i < 4; ++i) h.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  for (int i = 0; i < 4; ++i) h.push_back(0);
  return h;
}

// Offset of the seal in a segment's bytes (a group of its own whose payload is its offset), or 0.
inline std::size_t find_seal(const Bytes& b) {
  for (std::size_t at = kWalSegmentHeaderBytes; at + kWalSealBytes <= b.size(); ++at) {
    if (b[at] == 8 && b[at + 1] == 0 && b[at + 2] == 0 && b[at + 3] == 0xC0) {
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[at + 8 + static_cast<std::size_t>(i)]) << (8 * i);
      if (v == at) return at;
    }
  }
  return 0;
}

}  // namespace bftfs::wal_testing
