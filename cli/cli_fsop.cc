// bftfs fsop: file operations by path through a relay's socket, without FUSE, for scripts and tests (a small
// blocking client of docs/RELAY.md).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "cli/cli_common.h"
#include "cli/cli_relay_connection.h"
#include "common/assert.h"
#include "os/clock.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"

namespace bftfs::cli {
namespace {

struct FsopArgs {
  std::string socket;
  std::string op;
  std::string path = "/";
  std::string data;
  std::uint64_t offset = 0;
  std::uint32_t count = 65536;
  std::string mode;  // octal; empty: 0644 for create, 0755 for mkdir
  bool exclusive = false;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::uint64_t parallel = 1;
  bool chain = false;
  bool first = false;
  std::uint64_t timeout_s = 30;
};

// What one request of the run asks for: the operation and its arguments as parsed.
struct OpSpec {
  std::string op;
  std::string data;
  std::uint32_t mode = 0;
  std::uint64_t offset = 0;
  std::uint32_t count = 0;
  std::uint64_t cookie = 0;  // readdir: where to continue
  fs::Cred cred;
  bool exclusive = false;
};

const char* type_name(fs::FileType t) {
  switch (t) {
    case fs::FileType::kRegular: return "file";
    case fs::FileType::kDirectory: return "dir";
    case fs::FileType::kSymlink: return "symlink";
    default: return "special";
  }
}

std::string attr_line(const fs::Attr& a) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "ino %llu gen %llu type %s mode %04o nlink %u uid %u gid %u size %llu",
                static_cast<unsigned long long>(a.ino), static_cast<unsigned long long>(a.generation),
                type_name(a.type), a.mode, a.nlink, a.uid, a.gid, static_cast<unsigned long long>(a.size));
  return buf;
}

// Splits "/a/b/c" into {"a","b","c"}; "" or "/" is the root (no components).
std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : path) {
    if (ch == '/') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

// Replaces the first "%d" in `s` with `i` (so --parallel can name K different files).
std::string instantiate(const std::string& s, std::uint64_t i) {
  const auto pos = s.find("%d");
  if (pos == std::string::npos) return s;
  return s.substr(0, pos) + std::to_string(i) + s.substr(pos + 2);
}

// True for the operations that name an entry of a directory (the request ends on the parent).
bool on_parent(const std::string& op) { return op == "create" || op == "mkdir" || op == "remove" || op == "rmdir"; }

// Fills in `op` (credentials and handle set) as the operation `s` on an object, or on the entry `last` of a
// directory; `op.code` says which.
void finish_op(const OpSpec& s, const std::string& last, fs::Op& op) {
  if (s.op == "getattr" || s.op == "lookup") {
    op.code = fs::OpCode::kGetattr;
  } else if (s.op == "read") {
    op.code = fs::OpCode::kRead;
    op.offset = s.offset;
    op.count = s.count;
  } else if (s.op == "readdir") {
    op.code = fs::OpCode::kReaddir;
    op.count = s.count == 0 ? fs::kReaddirEntriesMax : std::min(s.count, fs::kReaddirEntriesMax);
    op.cookie = s.cookie;
  } else if (s.op == "write") {
    op.code = fs::OpCode::kWrite;
    op.offset = s.offset;
    op.data.assign(s.data.begin(), s.data.end());
  } else if (s.op == "create" || s.op == "mkdir") {
    op.code = s.op == "create" ? fs::OpCode::kCreate : fs::OpCode::kMkdir;
    op.name = last;
    op.mode = s.mode;
    op.exclusive = s.op == "create" && s.exclusive;
  } else {
    BFT_ASSERT(s.op == "remove" || s.op == "rmdir");
    op.code = s.op == "remove" ? fs::OpCode::kRemove : fs::OpCode::kRmdir;
    op.name = last;
  }
}

// One compound request: LOOKUPs from the root down to the parent (or the object), then the operation on the
// last result (a lookup of a path other than the root is the LOOKUPs alone). Returns "" or why the path
// cannot be expressed.
std::string build_request(const OpSpec& s, const std::string& path, fs::Request& req, bool& read_only) {
  std::vector<std::string> comps = components(path);
  if (on_parent(s.op) && comps.empty()) return "the root has no parent";
  std::string last;
  if (on_parent(s.op)) {
    last = comps.back();
    comps.pop_back();
  }
  if (comps.size() + 1 > fs::kCompoundOpsMax) return "path too deep for one compound request";
  fs::Handle h = fs::Handle::of(fs::kRootIno, 1);
  for (const std::string& c : comps) {
    fs::Op op;
    op.code = fs::OpCode::kLookup;
    op.cred = s.cred;
    op.handle = h;
    op.name = c;
    req.ops.push_back(op);
    h = fs::Handle::result_of(static_cast<std::uint8_t>(req.ops.size() - 1));
  }
  if (s.op != "lookup" || req.ops.empty()) {
    fs::Op op;
    op.cred = s.cred;
    op.handle = h;
    finish_op(s, last, op);
    req.ops.push_back(op);
  }
  read_only = true;
  for (const auto& o : req.ops) read_only = read_only && fs::is_read_only(o.code);
  return "";
}

// Prints the outcome of one request; returns the exit code it stands for.
int report(const OpSpec& a, const std::string& path, const relay::Final& fin, bool quiet) {
  if (fin.status == relay::FinalStatus::kRefused) {
    std::fprintf(stderr, "%s: refused by the relay: %.*s\n", path.c_str(), static_cast<int>(fin.result.size()),
                 reinterpret_cast<const char*>(fin.result.data()));
    return kExitFailure;
  }
  fs::Result res;
  if (const auto e = fs::decode_result(fin.result, res); e != fs::FsDecodeError::kOk) {
    std::fprintf(stderr, "%s: undecodable result from the relay (%.*s)\n", path.c_str(),
                 static_cast<int>(to_string(e).size()), to_string(e).data());
    return kExitFailure;
  }
  if (res.outcome != fs::Outcome::kDone) {
    std::uint32_t err = 0;
    if (res.outcome == fs::Outcome::kOpFailed && res.stop < res.results.size()) err = res.results[res.stop].err;
    std::fprintf(stderr, "%s: error %u (%s)\n", path.c_str(), err, err != 0 ? std::strerror(static_cast<int>(err)) : "not done");
    std::printf("errno %u\n", err);
    return kExitFailure;
  }
  if (quiet) return kExitOk;
  BFT_ASSERT(!res.results.empty());
  const fs::OpResult& r = res.results.back();
  if (a.op == "read") {
    std::fwrite(r.data.data(), 1, r.data.size(), stdout);
  } else if (a.op == "readdir") {
    for (const auto& e : r.entries) std::printf("%s\n", e.name.c_str());
    std::fflush(stdout);
  } else if (a.op == "write") {
    std::printf("wrote %u\n", r.count);
  } else if (a.op == "remove" || a.op == "rmdir") {
    std::printf("ok\n");
  } else {
    std::printf("%s\n", attr_line(r.attr).c_str());
  }
  return kExitOk;
}

// One `bftfs fsop` run: --parallel K operations on one connection, all at once or (--chain) one after another,
// each as soon as the one before has a FIRST (speculating on it) or a FINAL. A step returns kExitOk to go on,
// or the exit code to stop with.
class FsopRun {
 public:
  FsopRun(const FsopArgs& a, const OpSpec& spec) : a_(a), spec_(spec) {}

  int run() {
    if (std::string err = conn_.connect(a_.socket, mono_ms() + a_.timeout_s * 1000); !err.empty()) {
      return fail(err);
    }
    if (a_.op == "status") return query_status();
    while (next_ < (a_.chain ? 1 : a_.parallel)) {
      if (int rc = submit_next(); rc != kExitOk) return rc;
    }
    while (!paths_.empty()) {
      relay::RelayMsg m;
      if (std::string err = conn_.receive(m); !err.empty()) {
        return fail(err + " (" + std::to_string(paths_.size()) + " operations unanswered)");
      }
      const int rc = std::holds_alternative<relay::First>(m) ? on_first(std::get<relay::First>(m)) : on_frame(m);
      if (rc != kExitOk) return rc;
    }
    if (a_.parallel > 1) print_summary();
    return failed_ == 0 ? kExitOk : kExitFailure;
  }

 private:
  static int fail(const std::string& why) {
    error("fsop", why);
    return kExitFailure;
  }

  int query_status() {
    relay::RelayMsg m;
    if (std::string err = conn_.send(relay::StatusQuery{}); !err.empty()) return fail(err);
    if (std::string err = conn_.receive(m); !err.empty()) return fail(err);
    if (!std::holds_alternative<relay::StatusReply>(m)) return fail("expected STATUS_REPLY");
    std::fputs(std::get<relay::StatusReply>(m).text.c_str(), stdout);
    return kExitOk;
  }

  // Sends `req` (the request for `path`) under `tag`.
  int send(std::uint64_t tag, std::uint8_t flags, std::vector<std::uint64_t> deps, const std::string& path,
           const fs::Request& req) {
    if (std::string err = conn_.send(relay::Submit{tag, flags, std::move(deps), fs::encode_request(req)});
        !err.empty()) {
      return fail(err);
    }
    paths_[tag] = path;
    return kExitOk;
  }

  // Sends `path`'s request again (resubmitted, or continued with the next readdir cookie) under `tag`.
  int resend(std::uint64_t tag, std::uint8_t flags, const std::string& path) {
    fs::Request req;
    bool read_only = false;
    const std::string err = build_request(spec_, path, req, read_only);
    BFT_ASSERT(err.empty());  // its first submission built it
    return send(tag, flags, {}, path, req);
  }

  // Submits operation `next_` (tag next_ + 1); in a chain it depends on the one before, which may be in flight.
  int submit_next() {
    const std::string path = instantiate(a_.path, next_);
    fs::Request req;
    bool read_only = false;
    if (std::string err = build_request(spec_, path, req, read_only); !err.empty()) {
      error("fsop", err);
      return kExitUsage;
    }
    if (a_.chain && read_only) {
      error("fsop", "--chain needs an operation that writes (a read-only request cannot depend on another)");
      return kExitUsage;
    }
    const std::uint8_t flags = static_cast<std::uint8_t>((read_only ? relay::kFlagReadOnly : 0) |
                                                         (a_.first || a_.chain ? relay::kFlagReportFirst : 0));
    std::vector<std::uint64_t> deps;
    if (a_.chain && chain_tip_ != 0) {
      deps.push_back(chain_tip_);
      if (paths_.count(chain_tip_) != 0) ++with_dependency_;
    }
    const std::uint64_t tag = next_ + 1;
    if (int rc = send(tag, flags, std::move(deps), path, req); rc != kExitOk) return rc;
    chain_tip_ = tag;
    ++next_;
    return kExitOk;
  }

  int on_first(const relay::First& first) {
    if (paths_.count(first.tag) == 0 || !firsts_.insert(first.tag).second) {
      return fail("the relay sent an unexpected FIRST for tag " + std::to_string(first.tag));
    }
    if (a_.parallel == 1) std::printf("first from replica %u\n", first.replica);
    if (a_.chain && first.tag == chain_tip_ && next_ < a_.parallel) return submit_next();
    return kExitOk;
  }

  int on_frame(const relay::RelayMsg& m) {
    const auto* fin = std::get_if<relay::Final>(&m);
    if (fin == nullptr || paths_.count(fin->tag) == 0) return fail("the relay sent an unexpected frame");
    // Not executed: the first reply it depended on was wrong. Resubmit it (its dependency is final now).
    if (fin->status == relay::FinalStatus::kRolledBack && fin->result.empty()) return resubmit(fin->tag);
    if (report(spec_, paths_[fin->tag], *fin, a_.parallel > 1) != kExitOk) ++failed_;
    if (spec_.op == "readdir" && a_.parallel == 1) {
      if (int rc = continue_readdir(*fin); rc != kExitOk) return rc;
    }
    paths_.erase(fin->tag);
    if (a_.chain && fin->tag == chain_tip_ && next_ < a_.parallel) return submit_next();
    return kExitOk;
  }

  int resubmit(std::uint64_t tag) {
    ++resubmitted_;
    const std::uint64_t new_tag = tag + 0x100000000ull * resubmitted_;
    if (int rc = resend(new_tag, 0, paths_[tag]); rc != kExitOk) return rc;
    paths_.erase(tag);
    if (chain_tip_ == tag) chain_tip_ = new_tag;  // the chain continues from the resubmitted one
    return kExitOk;
  }

  // READDIR returns at most kReaddirEntriesMax entries: continue from the last cookie until eof.
  int continue_readdir(const relay::Final& fin) {
    if (fin.status == relay::FinalStatus::kRefused) return kExitOk;
    fs::Result res;
    if (fs::decode_result(fin.result, res) != fs::FsDecodeError::kOk || res.outcome != fs::Outcome::kDone ||
        res.results.back().eof || res.results.back().entries.empty()) {
      return kExitOk;
    }
    spec_.cookie = res.results.back().entries.back().cookie;
    return resend(fin.tag + 1, relay::kFlagReadOnly, paths_[fin.tag]);
  }

  void print_summary() const {
    std::printf("%llu of %llu operations succeeded (%zu first replies",
                static_cast<unsigned long long>(a_.parallel - failed_), static_cast<unsigned long long>(a_.parallel),
                firsts_.size());
    if (a_.chain) std::printf(", %llu submitted depending on one in flight", static_cast<unsigned long long>(with_dependency_));
    if (resubmitted_ > 0) std::printf(", %llu resubmitted", static_cast<unsigned long long>(resubmitted_));
    std::printf(")\n");
  }

  const FsopArgs& a_;
  OpSpec spec_;
  RelayConnection conn_;
  std::map<std::uint64_t, std::string> paths_;  // tag -> path, for the requests in flight
  std::uint64_t next_ = 0;                      // the next operation to submit (0..parallel-1; tag = index + 1)
  std::uint64_t with_dependency_ = 0;           // chain: submitted while the one it depends on was in flight
  std::uint64_t chain_tip_ = 0;                 // chain: the tag of the latest operation (0: none yet)
  std::uint64_t failed_ = 0;
  std::set<std::uint64_t> firsts_;
  std::uint64_t resubmitted_ = 0;
};

int run_fsop(const FsopArgs& a) {
  OpSpec s;
  s.op = a.op;
  s.data = a.data;
  s.mode = octal_value(!a.mode.empty() ? a.mode : a.op == "mkdir" ? "0755" : "0644");
  s.offset = a.offset;
  s.count = a.count;
  s.cred.uid = a.uid;
  s.cred.gid = a.gid;
  s.exclusive = a.exclusive;
  FsopRun run(a, s);
  return run.run();
}

}  // namespace

void add_fsop(CLI::App& root, Commands& out) {
  auto a = std::make_shared<FsopArgs>();
  CLI::App* app = root.add_subcommand("fsop",
      "one file operation by path through a relay, without FUSE (scripts, tests)\n\n"
      "Runs one file operation by path through the relay at SOCKET, without FUSE (for scripts and tests).\n"
      "The path is walked with LOOKUPs from the root in the same compound request as the operation.\n"
      "OP: lookup|getattr (prints the attributes), read (prints the bytes), readdir (prints one name a\n"
      "line), write, create, mkdir, remove, rmdir, status (prints the relay's STATUS_REPLY).\n"
      "With --parallel K the operation is submitted K times at once on one connection, with %d in --path\n"
      "replaced by 0..K-1 (with --chain: one after another, each speculating on the one before).\n"
      "Exit 0 when every operation succeeded; on a file-system error prints `errno N`.");
  app->add_option("--socket", a->socket, "the relay's Unix socket")->type_name("PATH")->required();
  app->add_option("--op", a->op, "the operation")->type_name("OP")->required()->check(one_of(
      {"lookup", "getattr", "read", "readdir", "write", "create", "mkdir", "remove", "rmdir", "status"}));
  app->add_option("--path", a->path, "the object (absolute path in the file system)")->type_name("PATH");
  app->add_option("--data", a->data, "write: the bytes to write")->type_name("TEXT");
  app->add_option("--offset", a->offset, "read/write: byte offset")->type_name("N")->transform(decimal(0, UINT64_MAX));
  app->add_option("--count", a->count, "read: bytes; readdir: entries per request (0: the most)")
      ->type_name("N")->transform(decimal(0, fs::kIoBytesMax));
  app->add_option("--mode", a->mode, "create/mkdir: permissions (octal; default 0644 for create, 0755 for mkdir)")
      ->type_name("MODE")->check(octal(07777));
  app->add_flag("--exclusive", a->exclusive, "create: fail with EEXIST if the file exists");
  app->add_option("--uid", a->uid, "caller's uid")->type_name("U")->transform(decimal(0, 0xFFFFFFFFu));
  app->add_option("--gid", a->gid, "caller's gid")->type_name("G")->transform(decimal(0, 0xFFFFFFFFu));
  app->add_option("--parallel", a->parallel, "submit K operations at once")->type_name("K")->transform(decimal(1, 100000));
  app->add_flag("--chain", a->chain,
                "with --parallel K: submit the K operations one after another, each depending on the one before "
                "and sent as soon as that one's first reply arrives (PBFT-CS)");
  app->add_flag("--first", a->first, "ask for the first (speculative) reply too, and print which replica sent it");
  app->add_option("--timeout-s", a->timeout_s, "give up after S seconds")->type_name("S")->transform(decimal(1, 86400));
  out.push_back({app, [a] { return run_fsop(*a); }});
}

}  // namespace bftfs::cli
