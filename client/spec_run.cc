// The daemon's side of one `bftfs run` (client/spec_run.h): the control protocol's requests (SPECULATION.md §9)
// turned into calls on the run's SpecBackend and SpecSession, and the run directory's life.
#include "client/spec_run.h"

#include <cerrno>
#include <random>
#include <utility>
#include <variant>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {

namespace {

constexpr fs::Handle kRoot = fs::Handle{false, 0, 1, 1};
const char* const kRunRoot = ".bftfs-run";
const char* const kTemporaryDirs[] = {"tmp", "var-tmp", "shm"};

fs::Op root_op(fs::OpCode code, const fs::Handle& dir, std::string name) {
  fs::Op op;
  op.code = code;  // root credentials (uid 0, gid 0): the daemon's own bookkeeping
  op.handle = dir;
  op.name = std::move(name);
  return op;
}

// The errno of a single-op request's final, or EIO when it did not execute.
std::uint32_t err_of(const Final& f) {
  if (f.status == FinalStatus::kRefused || f.result.results.empty()) return EIO;
  if (f.result.outcome == fs::Outcome::kDone) return 0;
  return f.result.results.back().err != 0 ? f.result.results.back().err : EIO;
}

// The directory `name` in `dir` with `mode`, made if absent (another run may make the same one meanwhile).
std::optional<fs::Attr> ensure_dir(Backend& relay, const fs::Handle& dir, const std::string& name, std::uint32_t mode,
                                   std::string& why) {
  fs::Op mk = root_op(fs::OpCode::kMkdir, dir, name);
  mk.mode = mode;
  Final f = call_and_wait(relay, fs::Request{{mk}}, false);
  if (err_of(f) == 0) return f.result.results[0].attr;
  if (err_of(f) != EEXIST) {  // the wire's errnos are Linux's
    why = "mkdir " + name + ": errno " + std::to_string(err_of(f));
    return std::nullopt;
  }
  f = call_and_wait(relay, fs::Request{{root_op(fs::OpCode::kLookup, dir, name)}}, true);
  if (err_of(f) != 0 || f.result.results[0].attr.type != fs::FileType::kDirectory) {
    why = "lookup " + name + ": errno " + std::to_string(err_of(f));
    return std::nullopt;
  }
  return f.result.results[0].attr;
}

// Removes everything below directory `dir` (depth first). Best effort: what cannot be removed stays.
void remove_below(Backend& relay, const fs::Handle& dir, int depth) {
  if (depth > 64) return;
  std::uint64_t cookie = 0;
  for (;;) {
    fs::Op rd = root_op(fs::OpCode::kReaddir, dir, "");
    rd.count = 256;
    rd.cookie = cookie;
    const Final f = call_and_wait(relay, fs::Request{{rd}}, true);
    if (err_of(f) != 0) return;
    const fs::OpResult& res = f.result.results[0];
    for (const fs::DirEntry& d : res.entries) {
      cookie = d.cookie;
      if (d.name == "." || d.name == "..") continue;
      if (d.type == fs::FileType::kDirectory) {
        const Final l = call_and_wait(relay, fs::Request{{root_op(fs::OpCode::kLookup, dir, d.name)}}, true);
        if (err_of(l) == 0) remove_below(relay, l.result.results[0].attr.handle(), depth + 1);
        (void)call_and_wait(relay, fs::Request{{root_op(fs::OpCode::kRmdir, dir, d.name)}}, false);
      } else {
        (void)call_and_wait(relay, fs::Request{{root_op(fs::OpCode::kRemove, dir, d.name)}}, false);
      }
    }
    if (res.eof || res.entries.empty()) return;
  }
}

std::uint64_t new_stream_id() {
  std::random_device rd;
  std::uint64_t id = 0;
  while (id == 0) id = (static_cast<std::uint64_t>(rd()) << 32) | rd();
  return id;
}

}  // namespace

SpecRun::SpecRun(RelayBackend& relay, MountOptions mount, EventSink events)
    : relay_(relay), mount_(std::move(mount)), events_(std::move(events)) {}

SpecRun::~SpecRun() {
  if (backend_ != nullptr) backend_->close();  // every wait of a handler ends
  session_.reset();
  backend_.reset();
}

void SpecRun::interrupt() {
  if (backend_ != nullptr) backend_->close();
}

spec::DaemonMsg SpecRun::fatal(std::string why) {
  LOG_WARN("", "bftfs run: %s", why.c_str());
  return spec::Fatal{std::move(why)};
}

std::optional<spec::DaemonMsg> SpecRun::handle(const spec::SupervisorMsg& m, UniqueFd fuse) {
  if (std::holds_alternative<spec::Hello>(m)) return hello();
  if (backend_ == nullptr) return fatal("a request before the run's stream exists");
  if (const auto* a = std::get_if<spec::Attach>(&m)) return attach(*a, std::move(fuse));
  if (std::holds_alternative<spec::StatsQuery>(m)) return spec::StatsReply{backend_->stats_text()};
  if (session_ == nullptr) return fatal("a request before ATTACH");
  if (const auto* p = std::get_if<spec::Prepare>(&m)) return prepare(*p);
  if (const auto* s = std::get_if<spec::Seal>(&m)) return seal(*s);
  if (std::holds_alternative<spec::Abort>(m)) {
    backend_->abort();
    session_->set_synchronous_writes(backend_->speculative());
    return std::nullopt;
  }
  if (const auto* r = std::get_if<spec::Rollback>(&m)) return rollback(*r);
  if (const auto* r = std::get_if<spec::Restored>(&m)) return restored(*r);
  if (std::holds_alternative<spec::Finish>(m)) {
    session_->flush_writes();  // the tree's last writes belong to its last epoch
    backend_->finish();
    session_->set_synchronous_writes(false);
    session_->set_zero_timeouts(false);
    return std::nullopt;
  }
  if (std::holds_alternative<spec::Detach>(m)) return detach();
  return fatal("an unexpected request");
}

void SpecRun::tick() {
  if (backend_ == nullptr || session_ == nullptr) return;
  if (std::optional<spec::Waits> w = backend_->take_waits()) events_(*w);
}

spec::DaemonMsg SpecRun::hello() {
  if (backend_ != nullptr) return fatal("HELLO twice");
  stream_ = new_stream_id();
  std::string why;
  const std::optional<fs::Attr> runs = ensure_dir(relay_, kRoot, kRunRoot, 0755, why);
  if (!runs) return fatal("the run directory: " + why);
  const std::optional<fs::Attr> mine = ensure_dir(relay_, runs->handle(), std::to_string(stream_), 0755, why);
  if (!mine) return fatal("the run directory: " + why);
  for (const char* name : kTemporaryDirs) {
    if (!ensure_dir(relay_, mine->handle(), name, 01777, why)) return fatal("the run directory: " + why);
  }
  run_dir_ = std::string("/") + kRunRoot + "/" + std::to_string(stream_);
  SpecBackendOptions o;
  o.client = relay_.client_id();  // known: the requests above went through the relay
  o.stream = stream_;
  backend_ = std::make_unique<SpecBackend>(relay_, o, events_);
  if (std::string err = backend_->start(); !err.empty()) return fatal(err);
  std::string fuse_options = "allow_other";
  if (mount_.default_permissions) fuse_options += ",default_permissions";
  LOG_INFO("", "bftfs run: stream %llu, run directory %s", static_cast<unsigned long long>(stream_), run_dir_.c_str());
  return spec::HelloOk{spec::kControlWireVersion, static_cast<std::uint32_t>(o.client), fuse_options, run_dir_, stream_};
}

spec::DaemonMsg SpecRun::attach(const spec::Attach& a, UniqueFd fuse) {
  if (session_ != nullptr) return fatal("ATTACH twice");
  backend_->set_model_bytes(static_cast<std::uint64_t>(a.model_mb) << 20);
  if (std::string err = SpecSession::start(std::move(fuse), mount_, *backend_, session_); !err.empty()) {
    return fatal(err);
  }
  return spec::Attached{};
}

// A dump follows: writes become synchronous (a write answered from now on is an entry, never staged), and what
// write-behind holds is sent and made final (C_1 captures a tree with nothing outstanding, §6.10).
spec::DaemonMsg SpecRun::prepare(const spec::Prepare& p) {
  session_->set_synchronous_writes(true);
  session_->flush_writes();
  backend_->prepare(p);
  return spec::Prepared{true, ""};
}

spec::DaemonMsg SpecRun::seal(const spec::Seal& s) {
  session_->flush_writes();
  std::optional<spec::Sealed> r = backend_->seal(s);
  if (!r) return fatal("SEAL of stretch " + std::to_string(s.epoch) + ", which is not the open one");
  const bool speculative = s.next == spec::Next::kSpeculative;
  session_->set_synchronous_writes(speculative);
  return *r;
}

// The tree is dead. Its staged writes are handed over (they queue behind the failed epoch and are refused with
// it); then the model forgets the failed epochs and the kernel every cached page and attribute of this session.
spec::DaemonMsg SpecRun::rollback(const spec::Rollback& r) {
  session_->kick_writes();
  std::optional<spec::ReadyForRestore> ready = backend_->rollback(r);
  if (!ready) return fatal("ROLLBACK of epoch " + std::to_string(r.epoch) + ", which did not fail");
  session_->set_zero_timeouts(true);
  session_->invalidate_all();
  session_->set_synchronous_writes(true);
  return *ready;
}

spec::DaemonMsg SpecRun::restored(const spec::Restored& r) {
  const spec::WindowClosed w = backend_->restored(r);
  session_->invalidate_all();
  session_->set_synchronous_writes(r.next == spec::Next::kSpeculative);
  session_->set_zero_timeouts(false);
  return w;
}

spec::DaemonMsg SpecRun::detach() {
  session_->flush_writes();
  if (!backend_->all_committed()) return fatal("DETACH with epochs or requests not final");
  if (std::string err = backend_->close_stream(); !err.empty()) LOG_WARN("", "bftfs run: %s", err.c_str());
  const Final f = call_and_wait(relay_, fs::Request{{root_op(fs::OpCode::kLookup, kRoot, kRunRoot)}}, true);
  if (err_of(f) == 0) {
    const fs::Handle runs = f.result.results[0].attr.handle();
    const std::string name = std::to_string(stream_);
    const Final mine = call_and_wait(relay_, fs::Request{{root_op(fs::OpCode::kLookup, runs, name)}}, true);
    if (err_of(mine) == 0) remove_below(relay_, mine.result.results[0].attr.handle(), 0);
    (void)call_and_wait(relay_, fs::Request{{root_op(fs::OpCode::kRmdir, runs, name)}}, false);
  }
  backend_->close();
  session_.reset();
  return spec::Detached{};
}

}  // namespace bftfs::client
