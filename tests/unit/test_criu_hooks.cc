// The pure bookkeeping of `bftfs run`'s supervisor (criu-hooks/): held output per epoch, the stdin log kept for
// replay, CRIU's statistics files; and the /tmp copy it takes at every checkpoint.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "criu-hooks/criu_stats.h"
#include "criu-hooks/epoch_log.h"
#include "criu-hooks/input_log.h"
#include "criu-hooks/tree_copy.h"
#include "os/unique_fd.h"

using namespace bftfs;
using namespace bftfs::criu;

namespace {

EpochRecord record(EpochId id, std::uint64_t consumed = 0) {
  EpochRecord r;
  r.id = id;
  r.stdin_consumed = consumed;
  return r;
}

std::string text_of(const std::vector<OutputChunk>& chunks, Stream stream) {
  std::string out;
  for (const OutputChunk& c : chunks) {
    if (c.stream == stream) out += c.bytes;
  }
  return out;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// A stats file as CRIU writes it: the two magics, the entry's length, stats_entry { <field> { varints } }.
std::string stats_file(std::uint64_t field, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& varints) {
  std::string sub;
  for (const auto& [f, v] : varints) {
    put_varint(sub, f << 3);
    put_varint(sub, v);
  }
  std::string entry;
  put_varint(entry, (field << 3) | 2);
  put_varint(entry, sub.size());
  entry += sub;
  std::string file;
  put_u32(file, kImgServiceMagic);
  put_u32(file, kStatsMagic);
  put_u32(file, static_cast<std::uint32_t>(entry.size()));
  return file + entry;
}

// A fresh directory under the system's temporary directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "bftfs-criu-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  UniqueFd open(const std::string& sub = "") const {
    return UniqueFd(::open((path / sub).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
};

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("epoch log: output is held in the newest epoch and released oldest first", "[criu_hooks]") {
  EpochLog log;
  REQUIRE(log.empty());
  log.begin(record(1));
  log.append_output(Stream::kStdout, "a1 ");
  log.append_output(Stream::kStdout, "a2 ");
  log.append_output(Stream::kStderr, "e1 ");
  log.begin(record(2));
  log.append_output(Stream::kStdout, "b1 ");
  REQUIRE(log.held_bytes() == 12);
  REQUIRE(log.ids() == std::vector<EpochId>{1, 2});

  EpochRecord first = log.commit_oldest();
  REQUIRE(first.id == 1);
  REQUIRE(first.output.size() == 2);  // consecutive bytes of one stream are merged, the order kept
  REQUIRE(text_of(first.output, Stream::kStdout) == "a1 a2 ");
  REQUIRE(text_of(first.output, Stream::kStderr) == "e1 ");
  REQUIRE(log.held_bytes() == 3);
  REQUIRE(log.oldest().id == 2);
  REQUIRE(text_of(log.commit_oldest().output, Stream::kStdout) == "b1 ");
  REQUIRE(log.empty());
  REQUIRE(log.held_bytes() == 0);
}

TEST_CASE("epoch log: a rollback drops the target's output and every later epoch", "[criu_hooks]") {
  EpochLog log;
  log.begin(record(3, 10));
  log.append_output(Stream::kStdout, "kept ");
  log.begin(record(4, 20));
  log.append_output(Stream::kStdout, "dropped4 ");
  log.begin(record(5, 30));
  log.append_output(Stream::kStderr, "dropped5");
  std::size_t dropped = 0;
  const std::vector<EpochRecord> removed = log.rollback_to(4, dropped);
  REQUIRE(removed.size() == 1);
  REQUIRE(removed[0].id == 5);
  REQUIRE(dropped == 17);
  REQUIRE(log.ids() == std::vector<EpochId>{3, 4});
  REQUIRE(log.newest().id == 4);
  REQUIRE(log.newest().stdin_consumed == 20);  // the checkpoint's record stays for the next rollback
  REQUIRE(log.newest().output.empty());
  REQUIRE(log.held_bytes() == 5);
  // The re-run epoch collects output again; a later checkpoint gets a fresh id.
  log.append_output(Stream::kStdout, "again ");
  log.begin(record(6));
  REQUIRE(text_of(log.find(4)->output, Stream::kStdout) == "again ");
  REQUIRE(log.find(5) == nullptr);
}

TEST_CASE("input log: a rollback rewinds to the consumed offset and the bytes are written again", "[criu_hooks]") {
  InputLog in;
  in.append("line1\nline2\n");
  REQUIRE(in.unwritten() == "line1\nline2\n");
  in.mark_written(6);
  REQUIRE(in.written() == 6);
  REQUIRE(in.unwritten() == "line2\n");
  in.mark_written(6);
  in.append("line3\n");
  in.set_eof();
  REQUIRE_FALSE(in.drained());
  in.mark_written(6);
  REQUIRE(in.drained());
  // The checkpoint saw 6 bytes consumed; the tree read the rest before it was rolled back.
  in.rewind(6);
  REQUIRE(in.unwritten() == "line2\nline3\n");
  REQUIRE_FALSE(in.drained());
  in.trim(6);  // the epoch before committed: nothing before offset 6 is needed
  REQUIRE(in.base() == 6);
  REQUIRE(in.unwritten() == "line2\nline3\n");
  in.trim(3);  // already trimmed: no-op
  REQUIRE(in.base() == 6);
  in.mark_written(12);
  in.trim(in.written());
  REQUIRE(in.base() == 18);
  REQUIRE(in.end() == 18);
  REQUIRE(in.drained());
}

TEST_CASE("criu stats: dump and restore timings decode; malformed files are rejected with a reason", "[criu_hooks]") {
  DumpStats d;
  const std::string dump = stats_file(1, {{1, 373}, {2, 33112}, {3, 40}, {4, 50}, {5, 300}, {6, 0}, {7, 290}});
  REQUIRE(decode_dump_stats(dump, d) == "");
  REQUIRE(d.freezing_us == 373);
  REQUIRE(d.frozen_us == 33112);
  REQUIRE(d.memdump_us == 40);
  REQUIRE(d.memwrite_us == 50);
  REQUIRE(d.pages_written == 290);
  RestoreStats r;
  REQUIRE(decode_restore_stats(stats_file(2, {{1, 5}, {2, 0}, {3, 1200}, {4, 25000}, {5, 370}}), r) == "");
  REQUIRE(r.forking_us == 1200);
  REQUIRE(r.restore_us == 25000);
  REQUIRE(r.pages_restored == 370);

  const std::string good = stats_file(1, {{2, 99}});
  REQUIRE(decode_dump_stats(good.substr(0, 10), d) == "shorter than the header");
  REQUIRE(decode_dump_stats("\x01" + good.substr(1), d) == "not a CRIU service image (first magic)");
  REQUIRE(decode_dump_stats(good.substr(0, good.size() - 1), d) == "entry length past the end");
  REQUIRE(decode_restore_stats(good, r) == "no restore statistics");
  std::string bad_varint = good.substr(0, 12);
  bad_varint += std::string("\x0a\x0b\x10", 3) + std::string(10, '\xff');
  bad_varint[8] = static_cast<char>(bad_varint.size() - 12);
  REQUIRE(decode_dump_stats(bad_varint, d) == "truncated varint");
  REQUIRE(decode_dump_stats("", d) == "shorter than the header");
}

TEST_CASE("tree copy: files, links, modes and times are copied; clearing keeps nothing", "[criu_hooks]") {
  TempDir src, dst;
  std::filesystem::create_directories(src.path / "d/e");
  write_file(src.path / "a.txt", "alpha");
  write_file(src.path / "d/e/b.bin", std::string(100000, 'b'));
  REQUIRE(::link((src.path / "a.txt").c_str(), (src.path / "d/hard").c_str()) == 0);
  std::filesystem::create_symlink("../a.txt", src.path / "d/sym");
  REQUIRE(::mkfifo((src.path / "fifo").c_str(), 0640) == 0);
  REQUIRE(::chmod((src.path / "d/e").c_str(), 0500) == 0);
  REQUIRE(::chmod((src.path / "a.txt").c_str(), 04751) == 0);
  const timespec times[2] = {{1000, 5}, {2000, 7}};
  REQUIRE(::utimensat(AT_FDCWD, (src.path / "d/e/b.bin").c_str(), times, 0) == 0);

  REQUIRE(copy_tree(src.open().get(), dst.open().get()) == "");
  REQUIRE(read_file(dst.path / "a.txt") == "alpha");
  REQUIRE(read_file(dst.path / "d/e/b.bin") == std::string(100000, 'b'));
  struct stat a{}, h{}, b{}, e{}, f{};
  REQUIRE(::stat((dst.path / "a.txt").c_str(), &a) == 0);
  REQUIRE(::stat((dst.path / "d/hard").c_str(), &h) == 0);
  REQUIRE(a.st_ino == h.st_ino);  // still one file
  REQUIRE((a.st_mode & 07777) == 04751);
  REQUIRE(::stat((dst.path / "d/e/b.bin").c_str(), &b) == 0);
  REQUIRE(b.st_mtim.tv_sec == 2000);
  REQUIRE(b.st_mtim.tv_nsec == 7);
  REQUIRE(::stat((dst.path / "d/e").c_str(), &e) == 0);
  REQUIRE((e.st_mode & 07777) == 0500);
  REQUIRE(std::filesystem::read_symlink(dst.path / "d/sym") == "../a.txt");
  REQUIRE(::lstat((dst.path / "fifo").c_str(), &f) == 0);
  REQUIRE(S_ISFIFO(f.st_mode));

  // Copying onto existing files is refused (a restore clears /tmp first).
  REQUIRE(copy_tree(src.open().get(), dst.open().get()).find("File exists") != std::string::npos);
  REQUIRE(clear_tree(dst.open().get()) == "");
  REQUIRE(std::filesystem::is_empty(dst.path));
  REQUIRE(copy_tree(src.open().get(), dst.open().get()) == "");
  REQUIRE(read_file(dst.path / "d/hard") == "alpha");
}
