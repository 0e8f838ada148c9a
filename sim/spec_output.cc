// The epoch client's program output and checker property 14: see spec_output.h.
#include "sim/spec_output.h"

#include <map>

#include "common/assert.h"
#include "common/crypto.h"
#include "sim/mix.h"
#include "sim/strfmt.h"
#include "spec/entry_builder.h"

namespace bftfs::sim {

namespace {

const char* op_name(fs::OpCode code) {
  static constexpr const char* kNames[] = {"?",       "LOOKUP",  "GETATTR", "SETATTR", "READ",     "WRITE",
                                           "CREATE",  "REMOVE",  "MKDIR",   "RMDIR",   "RENAME",   "LINK",
                                           "SYMLINK", "READLINK", "READDIR", "STATFS", "FSYNC",    "READDIRPLUS",
                                           "MKNOD",   "ACCESS",  "TIME"};
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::string render_attr(const fs::Attr& a) {
  return fmt("ino=%llu.%llu type=%u mode=%o nlink=%u uid=%u gid=%u size=%llu blocks=%llu rdev=%llu t=%llu/%llu/%llu",
             ull(a.ino), ull(a.generation), static_cast<unsigned>(a.type), a.mode, a.nlink, a.uid, a.gid,
             ull(a.size), ull(a.blocks), ull(a.rdev), ull(a.atime_ns), ull(a.mtime_ns), ull(a.ctime_ns));
}

std::string render_listing(const fs::OpResult& r, bool plus) {
  std::string s = fmt("eof=%u [", r.eof ? 1u : 0u);
  for (const fs::DirEntry& d : r.entries) {
    s += fmt(" %s:%llu:%u@%llu", d.name.c_str(), ull(d.ino), static_cast<unsigned>(d.type), ull(d.cookie));
    if (plus) s += " (" + render_attr(d.attr) + ")";
  }
  return s + " ]";
}

// What a program sees of one op's result in a request where every op passed.
std::string render_op_result(const fs::Op& op, const fs::OpResult& r) {
  if (r.err != fs::err::kOk) return fmt("E%u", r.err);  // an op whose errno predicate held
  switch (op.code) {
    case fs::OpCode::kWrite: return fmt("wrote %u", r.count);
    case fs::OpCode::kRemove:
    case fs::OpCode::kRmdir:
    case fs::OpCode::kRename:
    case fs::OpCode::kFsync: return "ok";
    case fs::OpCode::kRead:
      return fmt("read %zu eof=%u %s", r.data.size(), r.eof ? 1u : 0u, digest_of(r.data).short_hex().c_str());
    case fs::OpCode::kReadlink: return "-> " + r.target;
    case fs::OpCode::kReaddir: return render_listing(r, false);
    case fs::OpCode::kReaddirPlus: return render_listing(r, true);
    case fs::OpCode::kAccess: return fmt("granted=%u", r.granted);
    case fs::OpCode::kStatfs:
      return fmt("bsize=%u blocks=%llu bfree=%llu bavail=%llu files=%llu ffree=%llu namemax=%u", r.statfs.bsize,
                 ull(r.statfs.blocks), ull(r.statfs.bfree), ull(r.statfs.bavail), ull(r.statfs.files),
                 ull(r.statfs.ffree), r.statfs.namemax);
    default: return fs::returns_attr(op.code) ? render_attr(r.attr) : "ok";
  }
}

std::string render_op(const fs::Op& op) {
  std::string s = op_name(op.code);
  if (!op.name.empty()) s += " " + op.name;
  if (!op.name2.empty()) s += " -> " + op.name2;
  if (op.code == fs::OpCode::kRead || op.code == fs::OpCode::kWrite) {
    s += fmt(" @%llu+%zu", ull(op.offset), op.code == fs::OpCode::kRead ? std::size_t{op.count} : op.data.size());
  }
  return s;
}

std::string describe_handle(const fs::Handle& h) {
  return h.is_ref ? fmt("#%u", h.ref) : fmt("%llu.%llu", ull(h.ino), ull(h.generation));
}

// An op's fields, for a report of two requests that differ.
std::string describe_op(const fs::Op& op) {
  return fmt("%s h=%s h2=%s '%s' '%s' off=%llu count=%u data=%zu/%s mode=%o uid=%u expect=%u/%u", op_name(op.code),
             describe_handle(op.handle).c_str(), describe_handle(op.handle2).c_str(), op.name.c_str(),
             op.name2.c_str(), ull(op.offset), op.count, op.data.size(), digest_of(op.data).short_hex().c_str(),
             op.mode, op.cred.uid, static_cast<unsigned>(op.expect.kind), op.expect.err);
}

// The first op where two requests differ, both described.
std::string first_difference(const fs::Request& a, const fs::Request& b) {
  for (std::size_t i = 0; i < std::max(a.ops.size(), b.ops.size()); ++i) {
    if (i < a.ops.size() && i < b.ops.size() && a.ops[i] == b.ops[i]) continue;
    return fmt("op %zu: %s, not %s", i, i < a.ops.size() ? describe_op(a.ops[i]).c_str() : "none",
               i < b.ops.size() ? describe_op(b.ops[i]).c_str() : "none");
  }
  return "the same ops (the expectations differ)";
}

// Where two program views of one request's result differ (the speculative one first).
std::string view_difference(const fs::Request& request, const fs::Result& got, const fs::Result& serial) {
  if (got.outcome != serial.outcome || got.stop != serial.stop || got.results.size() != serial.results.size()) {
    return fmt("outcome %u stop %u, not outcome %u stop %u", static_cast<unsigned>(got.outcome), got.stop,
               static_cast<unsigned>(serial.outcome), serial.stop);
  }
  for (std::size_t k = 0; k < got.results.size() && k < request.ops.size(); ++k) {
    if (got.results[k] == serial.results[k]) continue;
    return fmt("op %zu %s: \"%s\", not \"%s\"", k, op_name(request.ops[k].code),
               render_op_result(request.ops[k], got.results[k]).c_str(),
               render_op_result(request.ops[k], serial.results[k]).c_str());
  }
  return "the same results";
}

std::string hex(std::span<const std::uint8_t> bytes) {
  std::string s;
  for (const std::uint8_t b : bytes) s += fmt("%02x", b);
  return s;
}

}  // namespace

std::uint8_t program_input_byte(std::uint64_t seed, std::uint64_t pos) {
  return static_cast<std::uint8_t>(mix(seed, pos) >> 24);
}

Bytes read_input(std::uint64_t seed, std::uint64_t pos) {
  Bytes in{program_input_byte(seed, pos)};
  const std::uint64_t more = in[0] % 4;
  for (std::uint64_t i = 1; i <= more; ++i) in.push_back(program_input_byte(seed, pos + i));
  return in;
}

std::string render_result(const fs::Request& request, const fs::Result& result) {
  BFT_ASSERT(!request.ops.empty() && request.ops[0].code == fs::OpCode::kTime);
  BFT_ASSERT(result.results.size() <= request.ops.size());
  if (result.outcome != fs::Outcome::kDone) {
    // The tree was told which op stopped the request and its errno; nothing else.
    const std::size_t stop = result.stop;
    const bool failed = result.outcome == fs::Outcome::kOpFailed;
    std::string s = fmt("%s at op %zu: %s", failed ? "FAILED" : "PREDICATE", stop,
                        stop < request.ops.size() ? render_op(request.ops[stop]).c_str() : "?");
    if (stop < result.results.size()) s += fmt(" E%u", result.results[stop].err);
    return s;
  }
  std::string s = "done:";
  for (std::size_t i = 1; i < result.results.size(); ++i) {  // op 0 is TIME, which the tree never sees
    s += " " + render_op(request.ops[i]) + " = " + render_op_result(request.ops[i], result.results[i]) + ";";
  }
  return s;
}

fs::Result program_view(const fs::Result& result) {
  fs::Result view = result;
  for (std::size_t i = 0; i < view.results.size(); ++i) {
    fs::OpResult& r = view.results[i];
    const bool unseen = r.code == fs::OpCode::kWrite || r.code == fs::OpCode::kRemove ||
                        r.code == fs::OpCode::kRmdir || r.code == fs::OpCode::kRename;
    if (result.outcome == fs::Outcome::kDone && !unseen) continue;
    fs::OpResult blank;
    blank.code = r.code;
    blank.err = r.err;
    blank.count = result.outcome == fs::Outcome::kDone ? r.count : 0;
    r = std::move(blank);
  }
  return view;
}

std::string output_line(const std::string& rendered, std::span<const std::uint8_t> input) {
  return rendered + " <" + hex(input) + ">";
}

namespace {

// The first part of property 14: the committed epochs are the applied ones, one for one, in order.
std::string check_epochs(const ProgramOutput& out, std::span<const AppliedEpoch> applied, const RequestFacts& facts) {
  const std::string who = fmt("serial equivalence (property 14): epoch client %u", out.client);
  for (std::size_t i = 0; i < std::max(applied.size(), out.committed.size()); ++i) {
    if (i >= out.committed.size()) {
      return fmt("%s: epoch %llu applied at seq %llu (request r%llu), but the client never committed it (rolled "
                 "back: its effects would be redone by the re-run)",
                 who.c_str(), ull(applied[i].epoch), ull(applied[i].seq), ull(applied[i].request_id));
    }
    const CommittedEpoch& c = out.committed[i];
    if (i >= applied.size() || applied[i].epoch != c.epoch) {
      return fmt("%s: committed epoch %llu (request r%llu) as its %zu-th, but the agreed history's %zu-th applied "
                 "epoch is %s",
                 who.c_str(), ull(c.epoch), ull(c.request), i + 1, i + 1,
                 i < applied.size() ? fmt("epoch %llu", ull(applied[i].epoch)).c_str() : "none");
    }
    const std::optional<std::uint64_t> seq = facts.agreed_seq(c.request);
    if (!c.by_chain && (applied[i].request_id != c.request || !seq || *seq != applied[i].seq)) {
      return fmt("%s: epoch %llu committed on request r%llu (agreed at seq %llu), but it applied at seq %llu by "
                 "request r%llu",
                 who.c_str(), ull(c.epoch), ull(c.request), ull(seq.value_or(0)), ull(applied[i].seq),
                 ull(applied[i].request_id));
    }
  }
  return "";
}

}  // namespace

std::string check_serial_output(const ProgramOutput& out, std::span<const AppliedEpoch> applied,
                                const RequestFacts& facts) {
  if (std::string why = check_epochs(out, applied, facts); !why.empty()) return why;
  const std::string who = fmt("serial equivalence (property 14): epoch client %u", out.client);
  std::map<std::uint64_t, std::uint64_t> request_of;  // committed epoch -> its EPOCH request
  for (const CommittedEpoch& c : out.committed) request_of[c.epoch] = c.request;
  std::size_t line = 0;
  std::uint64_t pos = 0;
  for (const AppliedEpoch& a : applied) {
    for (std::size_t i = 0; i < a.entries.size(); ++i, ++line) {
      const Bytes input = read_input(out.input_seed, pos);
      const std::string want = output_line(render_result(a.entries[i].request, a.results[i]), input);
      if (line >= out.lines.size()) {
        return fmt("%s: line %zu (epoch %llu, entry %zu) was never externalized; the serial replay prints \"%s\"",
                   who.c_str(), line, ull(a.epoch), i, want.c_str());
      }
      const OutputLine& got = out.lines[line];
      if (request_of.count(got.epoch) == 0) {
        return fmt("%s: line %zu \"%s\" of epoch %llu was externalized, but that epoch never committed", who.c_str(),
                   line, got.text.c_str(), ull(got.epoch));
      }
      if (got.epoch != a.epoch || got.text != want || got.input_pos != pos || got.input != input) {
        return fmt("%s: line %zu was \"%s\" (epoch %llu, input at %llu), but the serial replay of epoch %llu "
                   "entry %zu prints \"%s\" (input at %llu)",
                   who.c_str(), line, got.text.c_str(), ull(got.epoch), ull(got.input_pos), ull(a.epoch), i,
                   want.c_str(), ull(pos));
      }
      const std::optional<std::uint64_t> committed_at = facts.completed_step(request_of.at(a.epoch));
      if (!committed_at || got.step < *committed_at) {
        return fmt("%s: line %zu of epoch %llu was externalized at step %llu, before the client received its "
                   "EPOCH's verdict (step %llu)",
                   who.c_str(), line, ull(a.epoch), ull(got.step), ull(committed_at.value_or(0)));
      }
      pos += input.size();
    }
  }
  if (line < out.lines.size()) {
    const OutputLine& extra = out.lines[line];
    return fmt("%s: line %zu \"%s\" of epoch %llu was externalized, but the agreed history has no such line "
               "(%s)",
               who.c_str(), line, extra.text.c_str(), ull(extra.epoch),
               request_of.count(extra.epoch) != 0 ? "its epoch has fewer entries" : "its epoch failed");
  }
  return "";
}

std::string check_serial_program(const ProgramOutput& out, std::span<const AppliedEpoch> applied) {
  FsWorkload work(out.work);
  Prng prng(out.program_seed);
  std::size_t n = 0;
  for (const AppliedEpoch& a : applied) {
    for (std::size_t i = 0; i < a.entries.size(); ++i, ++n) {
      const fs::Entry& entry = a.entries[i];
      const FsWorkRequest w = work.next(prng);
      BFT_ASSERT(!entry.request.ops.empty() && entry.request.ops[0].code == fs::OpCode::kTime);
      const fs::Request request = spec::with_time(w.request, entry.request.ops[0].time_ns);
      const fs::Entry serial = spec::build_entry(request, a.results[i]);
      if (!(serial == entry)) {
        return fmt("serial equivalence (property 14): epoch client %u: the serial run of its program issues another "
                   "request %zu than epoch %llu entry %zu (a checkpoint that did not restore the program, or a result "
                   "it learned from that no predicate covered): %s",
                   out.client, n, ull(a.epoch), i, first_difference(serial.request, entry.request).c_str());
      }
      const fs::Result view = program_view(spec::without_time(a.results[i]));
      if (n < out.lines.size() && !(out.lines[n].seen == view)) {
        return fmt("serial equivalence (property 14): epoch client %u: its program was given for request %zu (epoch "
                   "%llu entry %zu) a result it sees otherwise in the serial run, and learned from it: %s",
                   out.client, n, ull(a.epoch), i, view_difference(w.request, out.lines[n].seen, view).c_str());
      }
      work.on_result(w.request, view);
    }
  }
  return "";
}

}  // namespace bftfs::sim
