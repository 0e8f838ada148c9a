// bftfs relay: the relay daemon (relay/relay_daemon.h). bftfs fsop: file operations by path through a relay's
// socket, without FUSE, for scripts and tests (a small blocking client of docs/RELAY.md).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "common/assert.h"
#include "common/log.h"
#include "relay/relay_daemon.h"
#include "relay/relay_wire.h"
#include "cli/cli_common.h"
#include "os/clock.h"
#include "runtime/transport.h"
#include "os/unique_fd.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"

namespace bftfs::cli {

int cmd_relay(int argc, char** argv) {
  ArgParser p("relay",
              "Runs the relay: a daemon that FUSE mounts (bftfs mount) talk to over the Unix socket SOCKET. It is\n"
              "client ID of the cluster in CONFIG and turns each file operation into a PBFT-CS request to replicas\n"
              "that run `--service fs --shim` (with --norep: a request to the NO-REP server). Reads use the\n"
              "read-only optimization; many requests are in flight; unreachable replicas are retried forever.\n"
              "The protocol is docs/RELAY.md. Stops cleanly on SIGTERM or SIGINT (removing the socket).");
  p.option("config", "FILE", "cluster.conf written by keygen").required("config");
  p.option("id", "I", "the relay's client id (one of the configuration's clients)").required("id");
  p.option("socket", "PATH", "Unix socket to listen on").required("socket");
  p.option("socket-mode", "MODE", "permissions of the socket (octal)", "0660");
  p.flag("norep", "talk to the NO-REP server (bftfs norep --service fs) instead of PBFT replicas");
  p.option("norep-server", "HOST:PORT", "the NO-REP server's address (default: replica 0's address)");
  p.flag("no-speculate", "never deliver first replies (mounts asking for FIRST get only FINAL)");
  p.option("window", "N", "requests on the wire at once (<= the replicas' client window)", "64");
  p.option("mount-output-max-bytes", "N", "a mount with more than N bytes of replies unread is disconnected",
           "67108864");
  p.option("mount-in-flight-max", "N", "a mount with N requests in flight is not read until some complete", "1024");
  p.option("status", "FILE", "rewrite FILE with the relay's status every 500 ms (for bftfs status)");
  p.option("log-level", "LEVEL", "debug|info|warn|error", "info");
  add_wan_options(p);
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  bool ok = true;
  RelayOptions o;
  o.config_path = p.get("config");
  o.id = static_cast<NodeId>(p.get_u64("id", ok, 0, 0xFFFFFFFEu));
  o.socket_path = p.get("socket");
  o.window = static_cast<std::uint32_t>(p.get_u64("window", ok, 1, 1024));
  o.conn_output_bytes_max = p.get_u64("mount-output-max-bytes", ok, 1u << 16, 1ull << 34);
  o.conn_in_flight_max = p.get_u64("mount-in-flight-max", ok, 1, 1u << 20);
  o.norep = p.has("norep");
  o.speculate = !p.has("no-speculate");
  if (p.has("status")) o.status_path = p.get("status");
  o.handle_signals = true;
  char* end = nullptr;
  const std::string mode = p.get("socket-mode");
  const unsigned long m = std::strtoul(mode.c_str(), &end, 8);
  if (mode.empty() || *end != '\0' || m > 0777) {
    error("relay", "--socket-mode: expected octal permissions such as 0660, got '" + mode + "'");
    ok = false;
  }
  o.socket_mode = static_cast<mode_t>(m);
  if (p.has("norep-server")) {
    if (!o.norep) {
      error("relay", "--norep-server needs --norep");
      ok = false;
    } else if (std::string err = parse_host_port(p.get("norep-server"), o.norep_server); !err.empty()) {
      error("relay", "--norep-server: " + err);
      ok = false;
    }
  }
  if (!set_log_level("relay", p.get("log-level"))) ok = false;
  if (!ok || !get_wan_options(p, o.wan)) return kExitUsage;
  std::unique_ptr<RelayDaemon> relay;
  if (std::string err = RelayDaemon::create(o, relay); !err.empty()) {
    error("relay", err);
    return kExitFailure;
  }
  relay->run();
  return kExitOk;
}

namespace {

// A blocking connection to a relay: HELLO at connect, frames in and out, every wait bounded by a deadline.
class RelayConnection {
 public:
  [[nodiscard]] std::string connect(const std::string& path, std::uint64_t deadline_ms) {
    deadline_ms_ = deadline_ms;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return "socket path too long";
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_.valid()) return std::string("socket: ") + std::strerror(errno);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return "connect " + path + ": " + std::strerror(errno);
    }
    if (std::string err = send(relay::Hello{}); !err.empty()) return err;
    relay::RelayMsg m;
    if (std::string err = receive(m); !err.empty()) return err;
    if (!std::holds_alternative<relay::HelloOk>(m)) return "the relay did not answer HELLO with HELLO_OK";
    hello_ = std::get<relay::HelloOk>(m);
    return "";
  }

  [[nodiscard]] std::string send(const relay::MountMsg& m) {
    const Bytes frame = relay::encode_relay_frame(m);
    std::size_t off = 0;
    while (off < frame.size()) {
      const ssize_t w = ::send(fd_.get(), frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return std::string("send: ") + std::strerror(errno);
      off += static_cast<std::size_t>(w);
    }
    return "";
  }

  [[nodiscard]] std::string receive(relay::RelayMsg& out) {
    for (;;) {
      Bytes body;
      relay::RelayWireError why = relay::RelayWireError::kOk;
      const auto next = splitter_.next(body, why);
      if (next == relay::FrameSplitter::Next::kBroken) return "relay sent a bad frame length: " + std::string(to_string(why));
      if (next == relay::FrameSplitter::Next::kFrame) {
        if (const auto e = relay::decode_relay_body(body, out); e != relay::RelayWireError::kOk) {
          return "relay sent a malformed frame: " + std::string(to_string(e));
        }
        return "";
      }
      const std::uint64_t now = mono_ms();
      if (now >= deadline_ms_) return "timed out waiting for the relay";
      pollfd pfd{fd_.get(), POLLIN, 0};
      const int r = ::poll(&pfd, 1, static_cast<int>(std::min<std::uint64_t>(deadline_ms_ - now, 1000)));
      if (r < 0 && errno != EINTR) return std::string("poll: ") + std::strerror(errno);
      if (r <= 0) continue;
      std::uint8_t buf[65536];
      const ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::string("recv: ") + std::strerror(errno);
      if (n == 0) return "the relay closed the connection";
      splitter_.append(std::span<const std::uint8_t>(buf, static_cast<std::size_t>(n)));
    }
  }

  const relay::HelloOk& hello() const { return hello_; }

 private:
  UniqueFd fd_;
  relay::FrameSplitter splitter_;
  relay::HelloOk hello_;
  std::uint64_t deadline_ms_ = 0;
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

struct FsopArgs {
  std::string op;
  std::string path;
  std::string path2;
  std::string data;
  std::uint32_t mode = 0;
  std::uint64_t offset = 0;
  std::uint32_t count = 0;
  std::uint64_t cookie = 0;  // readdir: where to continue
  fs::Cred cred;
  bool exclusive = false;
};

// One compound request: LOOKUPs from the root down to the parent (or the object), then the operation on the
// last result. Returns "" or why the path cannot be expressed.
std::string build_request(const FsopArgs& a, const std::string& path, fs::Request& req, bool& read_only) {
  const fs::Handle root = fs::Handle::of(fs::kRootIno, 1);
  std::vector<std::string> comps = components(path);
  const bool on_parent = a.op == "create" || a.op == "mkdir" || a.op == "remove" || a.op == "rmdir";
  if (on_parent && comps.empty()) return "the root has no parent";
  std::string last;
  if (on_parent) {
    last = comps.back();
    comps.pop_back();
  }
  if (comps.size() + 1 > fs::kCompoundOpsMax) return "path too deep for one compound request";
  fs::Handle h = root;
  for (const std::string& c : comps) {
    fs::Op op;
    op.code = fs::OpCode::kLookup;
    op.cred = a.cred;
    op.handle = h;
    op.name = c;
    req.ops.push_back(op);
    h = fs::Handle::result_of(static_cast<std::uint8_t>(req.ops.size() - 1));
  }
  fs::Op op;
  op.cred = a.cred;
  op.handle = h;
  if (a.op == "lookup" || a.op == "getattr") {
    if (req.ops.empty() || a.op == "getattr") {
      op.code = fs::OpCode::kGetattr;
      req.ops.push_back(op);
    }
  } else if (a.op == "read") {
    op.code = fs::OpCode::kRead;
    op.offset = a.offset;
    op.count = a.count;
    req.ops.push_back(op);
  } else if (a.op == "readdir") {
    op.code = fs::OpCode::kReaddir;
    op.count = a.count == 0 ? fs::kReaddirEntriesMax : std::min(a.count, fs::kReaddirEntriesMax);
    op.cookie = a.cookie;
    req.ops.push_back(op);
  } else if (a.op == "write") {
    op.code = fs::OpCode::kWrite;
    op.offset = a.offset;
    op.data.assign(a.data.begin(), a.data.end());
    req.ops.push_back(op);
  } else if (a.op == "create") {
    op.code = fs::OpCode::kCreate;
    op.name = last;
    op.mode = a.mode;
    op.exclusive = a.exclusive;
    req.ops.push_back(op);
  } else if (a.op == "mkdir") {
    op.code = fs::OpCode::kMkdir;
    op.name = last;
    op.mode = a.mode;
    req.ops.push_back(op);
  } else if (a.op == "remove" || a.op == "rmdir") {
    op.code = a.op == "remove" ? fs::OpCode::kRemove : fs::OpCode::kRmdir;
    op.name = last;
    req.ops.push_back(op);
  } else {
    return "unknown --op '" + a.op + "'";
  }
  read_only = true;
  for (const auto& o : req.ops) read_only = read_only && fs::is_read_only(o.code);
  return "";
}

// Prints the outcome of one request; returns the exit code it stands for.
int report(const FsopArgs& a, const std::string& path, const relay::Final& fin, bool quiet) {
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

}  // namespace

int cmd_fsop(int argc, char** argv) {
  ArgParser p("fsop",
              "Runs one file operation by path through the relay at SOCKET, without FUSE (for scripts and tests).\n"
              "The path is walked with LOOKUPs from the root in the same compound request as the operation.\n"
              "OP: lookup|getattr (prints the attributes), read (prints the bytes), readdir (prints one name a\n"
              "line), write, create, mkdir, remove, rmdir, status (prints the relay's STATUS_REPLY).\n"
              "With --parallel K the operation is submitted K times at once on one connection, with %d in --path\n"
              "replaced by 0..K-1 (with --chain: one after another, each speculating on the one before).\n"
              "Exit 0 when every operation succeeded; on a file-system error prints `errno N`.");
  p.option("socket", "PATH", "the relay's Unix socket").required("socket");
  p.option("op", "OP", "the operation").required("op");
  p.option("path", "PATH", "the object (absolute path in the file system)", "/");
  p.option("data", "TEXT", "write: the bytes to write");
  p.option("offset", "N", "read/write: byte offset", "0");
  p.option("count", "N", "read: bytes; readdir: entries per request (0: the most)", "65536");
  p.option("mode", "MODE", "create/mkdir: permissions (octal; default 0644 for create, 0755 for mkdir)");
  p.flag("exclusive", "create: fail with EEXIST if the file exists");
  p.option("uid", "U", "caller's uid", "0");
  p.option("gid", "G", "caller's gid", "0");
  p.option("parallel", "K", "submit K operations at once", "1");
  p.flag("chain", "with --parallel K: submit the K operations one after another, each depending on the one\n"
                  "                               before and sent as soon as that one's first reply arrives (PBFT-CS)");
  p.flag("first", "ask for the first (speculative) reply too, and print which replica sent it");
  p.option("timeout-s", "S", "give up after S seconds", "30");
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  bool ok = true;
  FsopArgs a;
  a.op = p.get("op");
  a.data = p.get("data");
  a.offset = p.get_u64("offset", ok);
  a.count = static_cast<std::uint32_t>(p.get_u64("count", ok, 0, fs::kIoBytesMax));
  a.cred.uid = static_cast<std::uint32_t>(p.get_u64("uid", ok, 0, 0xFFFFFFFFu));
  a.cred.gid = static_cast<std::uint32_t>(p.get_u64("gid", ok, 0, 0xFFFFFFFFu));
  a.exclusive = p.has("exclusive");
  const auto parallel = p.get_u64("parallel", ok, 1, 100000);
  const auto timeout_s = p.get_u64("timeout-s", ok, 1, 86400);
  char* end = nullptr;
  const std::string mode = p.has("mode") ? p.get("mode") : (a.op == "mkdir" ? "0755" : "0644");
  a.mode = static_cast<std::uint32_t>(std::strtoul(mode.c_str(), &end, 8));
  if (*end != '\0' || a.mode > 07777) {
    error("fsop", "--mode: expected octal permissions, got '" + mode + "'");
    ok = false;
  }
  if (!ok) return kExitUsage;

  RelayConnection conn;
  if (std::string err = conn.connect(p.get("socket"), mono_ms() + timeout_s * 1000); !err.empty()) {
    error("fsop", err);
    return kExitFailure;
  }
  if (a.op == "status") {
    relay::RelayMsg m;
    if (std::string err = conn.send(relay::StatusQuery{}); !err.empty()) return error("fsop", err), kExitFailure;
    if (std::string err = conn.receive(m); !err.empty()) return error("fsop", err), kExitFailure;
    if (!std::holds_alternative<relay::StatusReply>(m)) return error("fsop", "expected STATUS_REPLY"), kExitFailure;
    std::fputs(std::get<relay::StatusReply>(m).text.c_str(), stdout);
    return kExitOk;
  }

  const bool chain = p.has("chain");
  std::map<std::uint64_t, std::string> paths;  // tag -> path, for the requests in flight
  std::uint64_t next = 0;                      // the next operation to submit (0..parallel-1; tag = index + 1)
  std::uint64_t with_dependency = 0;           // chain: submitted while the one it depends on was in flight
  std::uint64_t chain_tip = 0;                 // chain: the tag of the latest operation (0: none yet)
  // Submits operation `next`; in a chain it depends on the one before (tag next), which may be in flight.
  const auto submit_next = [&]() -> int {
    const std::string path = instantiate(p.get("path"), next);
    fs::Request req;
    bool read_only = false;
    if (std::string err = build_request(a, path, req, read_only); !err.empty()) {
      error("fsop", err);
      return kExitUsage;
    }
    if (chain && read_only) {
      error("fsop", "--chain needs an operation that writes (a read-only request cannot depend on another)");
      return kExitUsage;
    }
    relay::Submit s;
    s.tag = next + 1;
    s.flags = static_cast<std::uint8_t>((read_only ? relay::kFlagReadOnly : 0) |
                                        (p.has("first") || chain ? relay::kFlagReportFirst : 0));
    if (chain && chain_tip != 0) {
      s.deps.push_back(chain_tip);
      if (paths.count(chain_tip) != 0) ++with_dependency;
    }
    s.request = fs::encode_request(req);
    if (std::string err = conn.send(s); !err.empty()) {
      error("fsop", err);
      return kExitFailure;
    }
    paths[s.tag] = path;
    chain_tip = s.tag;
    ++next;
    return kExitOk;
  };
  // Without --chain everything goes at once; with it, one at a time, each as soon as the one before has a
  // FIRST (speculating on it) or a FINAL.
  while (next < (chain ? 1 : parallel)) {
    if (int rc = submit_next(); rc != kExitOk) return rc;
  }
  int rc = kExitOk;
  std::uint64_t failed = 0;
  std::set<std::uint64_t> firsts;
  std::uint64_t resubmitted = 0;
  while (!paths.empty()) {
    relay::RelayMsg m;
    if (std::string err = conn.receive(m); !err.empty()) {
      error("fsop", err + " (" + std::to_string(paths.size()) + " operations unanswered)");
      return kExitFailure;
    }
    if (const auto* first = std::get_if<relay::First>(&m)) {
      if (paths.count(first->tag) == 0 || !firsts.insert(first->tag).second) {
        error("fsop", "the relay sent an unexpected FIRST for tag " + std::to_string(first->tag));
        return kExitFailure;
      }
      if (parallel == 1) std::printf("first from replica %u\n", first->replica);
      if (chain && first->tag == chain_tip && next < parallel) {
        if (int rc = submit_next(); rc != kExitOk) return rc;
      }
      continue;
    }
    const auto* fin = std::get_if<relay::Final>(&m);
    if (fin == nullptr || paths.count(fin->tag) == 0) {
      error("fsop", "the relay sent an unexpected frame");
      return kExitFailure;
    }
    if (fin->status == relay::FinalStatus::kRolledBack && fin->result.empty()) {
      // Not executed: the first reply it depended on was wrong. Resubmit it (its dependency is final now).
      ++resubmitted;
      relay::Submit s{fin->tag + 0x100000000ull * resubmitted, 0, {}, {}};
      fs::Request req;
      bool read_only = false;
      BFT_ASSERT(build_request(a, paths[fin->tag], req, read_only).empty());
      s.request = fs::encode_request(req);
      if (std::string err = conn.send(s); !err.empty()) return error("fsop", err), kExitFailure;
      paths[s.tag] = paths[fin->tag];
      paths.erase(fin->tag);
      if (chain_tip == fin->tag) chain_tip = s.tag;  // the chain continues from the resubmitted one
      continue;
    }
    if (report(a, paths[fin->tag], *fin, parallel > 1) != kExitOk) {
      rc = kExitFailure;
      ++failed;
    }
    // READDIR returns at most kReaddirEntriesMax entries: continue from the last cookie until eof.
    if (a.op == "readdir" && parallel == 1 && fin->status != relay::FinalStatus::kRefused) {
      fs::Result res;
      if (fs::decode_result(fin->result, res) == fs::FsDecodeError::kOk && res.outcome == fs::Outcome::kDone &&
          !res.results.back().eof && !res.results.back().entries.empty()) {
        a.cookie = res.results.back().entries.back().cookie;
        fs::Request req;
        bool read_only = false;
        BFT_ASSERT(build_request(a, paths[fin->tag], req, read_only).empty());
        relay::Submit s{fin->tag + 1, relay::kFlagReadOnly, {}, fs::encode_request(req)};
        if (std::string err = conn.send(s); !err.empty()) return error("fsop", err), kExitFailure;
        paths[s.tag] = paths[fin->tag];
      }
    }
    paths.erase(fin->tag);
    if (chain && fin->tag == chain_tip && next < parallel) {
      if (int r = submit_next(); r != kExitOk) return r;
    }
  }
  if (parallel > 1) {
    std::printf("%llu of %llu operations succeeded (%zu first replies", static_cast<unsigned long long>(parallel - failed),
                static_cast<unsigned long long>(parallel), firsts.size());
    if (chain) std::printf(", %llu submitted depending on one in flight", static_cast<unsigned long long>(with_dependency));
    if (resubmitted > 0) std::printf(", %llu resubmitted", static_cast<unsigned long long>(resubmitted));
    std::printf(")\n");
  }
  return rc;
}

}  // namespace bftfs::cli
