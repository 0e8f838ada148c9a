// Supervisor: checkpoints, commits and rollbacks (supervisor.cc has the tree's start, its bytes and its end).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/assert.h"
#include "common/log.h"
#include "criu-hooks/criu_stats.h"
#include "criu-hooks/supervisor_impl.h"
#include "criu-hooks/tree_copy.h"
#include "criu-hooks/tree_spawn.h"
#include "os/clock.h"

namespace bftfs::criu {
namespace {

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

std::uint64_t since_us(std::uint64_t start_ns) { return (mono_ns() - start_ns) / 1000; }

std::string read_small_file(int dir_fd, const char* name) {
  UniqueFd fd(::openat(dir_fd, name, O_RDONLY | O_CLOEXEC));
  std::string out;
  if (!fd.valid()) return out;
  char buf[4096];
  for (ssize_t n; out.size() < (1u << 16) && (n = ::read(fd.get(), buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// The total size of the regular files directly in `dir_fd` (a dump's images).
std::uint64_t image_bytes(int dir_fd) {
  const int dup_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return 0;
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    ::close(dup_fd);
    return 0;
  }
  ::rewinddir(dir);
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(dir)) {
    struct stat st{};
    if (::fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += static_cast<std::uint64_t>(st.st_size);
  }
  ::closedir(dir);
  return total;
}

// True when a TCP connection is established in this network namespace: only the tree's can be (the supervisor
// has none), and CRIU then needs --tcp-established.
bool has_tcp_connections() {
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
    std::string text;
    char buf[8192];
    for (ssize_t n; fd.valid() && text.size() < (1u << 20) && (n = ::read(fd.get(), buf, sizeof buf)) > 0;) {
      text.append(buf, static_cast<std::size_t>(n));
    }
    // "sl local_address rem_address st ...": the state 01 is ESTABLISHED.
    for (std::size_t pos = text.find('\n'); pos != std::string::npos && pos + 1 < text.size();) {
      const std::size_t eol = text.find('\n', pos + 1);
      const std::string line = text.substr(pos + 1, eol == std::string::npos ? std::string::npos : eol - pos - 1);
      char st[8] = {};
      if (std::sscanf(line.c_str(), "%*s %*s %*s %7s", st) == 1 && std::strcmp(st, "01") == 0) return true;
      pos = eol;
    }
  }
  return false;
}

}  // namespace

void Supervisor::Impl::kill_tree() {
  if (root <= 0) return;
  // SIGKILL to a pid namespace's init kills every process in it, and the init's exit completes only once they
  // are all reaped (the kernel's zap_pid_ns_processes): when waitpid returns, no pid of the old tree remains (a
  // restore would fail on a leftover zombie: "Can't fork ... File exists").
  ::kill(root, SIGKILL);
  int status = 0;
  while (::waitpid(root, &status, 0) < 0 && errno == EINTR) {
  }
  root = -1;
  reap();  // other orphans, if any
}

void Supervisor::Impl::remove_epoch_dir(EpochId epoch) {
  const std::string name = epoch_dir_name(epoch);
  const int images = boundary->images_root();
  UniqueFd dir(::openat(images, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) return;
  if (std::string err = clear_tree(dir.get()); !err.empty())
    LOG_WARN("run", "cleaning %s: %s", name.c_str(), err.c_str());
  dir.reset();
  if (::unlinkat(images, name.c_str(), AT_REMOVEDIR) != 0)
    LOG_WARN("run", "removing %s: %s", name.c_str(), std::strerror(errno));
}

// size: the post-dump notification's steps belong together, in the order the exact cut needs.
std::string Supervisor::Impl::checkpoint(EpochId id, const std::function<std::string(const DumpFacts&)>& seal,
                                         CheckpointCost& cost) {
  if (root <= 0) return "the tree is not running";
  const std::string name = epoch_dir_name(id);
  const int images = boundary->images_root();
  if (::mkdirat(images, name.c_str(), 0700) != 0) return errno_text("mkdir " + name);
  UniqueFd dir(::openat(images, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return errno_text("open " + name);
  const int private_tmp = boundary->private_tmp_root();
  UniqueFd tmp_copy;
  if (private_tmp >= 0) {
    if (::mkdirat(dir.get(), "tmp", 0700) != 0) return errno_text("mkdir " + name + "/tmp");
    tmp_copy.reset(::openat(dir.get(), "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!tmp_copy.valid()) return errno_text("open " + name + "/tmp");
  }

  EpochRecord record;
  record.id = id;
  channels->keys(record.stdin_key, record.stdout_key, record.stderr_key);
  cost = CheckpointCost{};
  cost.epoch = id;
  DumpRequest request;
  request.pid = root;
  request.images_dir_fd = dir.get();
  request.externals = channels->dump_externals();
  request.log_level = options.criu_log_level;
  request.tcp_established = record.tcp_established = has_tcp_connections();
  const std::uint64_t start = mono_ns();
  std::uint64_t freeze_start = start;
  bool sealed = false;
  request.before_freeze = [&] { freeze_start = mono_ns(); };
  // While the tree is frozen: everything it printed so far belongs before the checkpoint, what it has not read
  // from stdin stays to be read after it, a private /tmp is copied as it is, and the daemon seals the epoch last.
  request.while_frozen = [&]() -> std::string {
    const std::uint64_t work = mono_ns();
    drain_outputs();
    std::size_t unread = 0;
    if (std::string err = channels->stdin_unread(unread); !err.empty()) return err;
    if (options.terminal_input) {
      // Keystrokes the tree has not read would become speculative input: the policy never asks for this.
      if (unread > 0 || channels->partial_line_after(last_forwarded)) return "terminal input waits in the pty";
    } else {
      BFT_ASSERT(unread <= input.written());
      record.stdin_consumed = input.written() - unread;
    }
    record.terminal = channels->terminal_state();
    if (tmp_copy.valid()) {
      if (std::string err = copy_tree(private_tmp, tmp_copy.get()); !err.empty()) return "copying /tmp: " + err;
    }
    if (std::string err = boundary->freeze_run(); !err.empty()) return err;
    // Pages the tree dirtied through shared mappings are written back now, into the closing epoch: its image
    // does not hold them.
    if (options.boundary.spec_session && ::syncfs(boundary->mount_fd()) != 0) return errno_text("syncfs");
    const DumpFacts facts{since_us(start), since_us(freeze_start), image_bytes(dir.get())};
    const std::uint64_t seal_start = mono_ns();
    if (std::string err = seal(facts); !err.empty()) return err;
    cost.seal_us = since_us(seal_start);
    sealed = true;
    cost.frozen_work_us = since_us(work);
    return "";
  };
  const std::string err = criu->dump(request);
  cost.wall_us = since_us(start);
  if (!sealed) {
    ++stats.checkpoint_failures;
    tmp_copy.reset();
    dir.reset();
    remove_epoch_dir(id);
    return err.empty() ? "the dump ended without its post-dump notification" : err;
  }
  // Sealed means the daemon moved on: the image was complete when the notification ran, so it stands even if
  // CRIU reported something afterwards.
  if (!err.empty()) LOG_WARN("run", "checkpoint %s: after the seal: %s", name.c_str(), err.c_str());
  DumpStats dump;
  if (std::string bad = decode_dump_stats(read_small_file(dir.get(), "stats-dump"), dump); bad.empty()) {
    cost.frozen_us = dump.frozen_us;
    cost.freezing_us = dump.freezing_us;
  } else {
    LOG_WARN("run", "%s/stats-dump: %s", name.c_str(), bad.c_str());
  }
  cost.image_bytes = image_bytes(dir.get());
  epochs.begin(std::move(record));
  LOG_INFO("run", "checkpoint %llu: dump %llu us, frozen %llu us (freezing %llu, post-dump %llu, seal %llu), images %llu bytes",
           static_cast<unsigned long long>(id), static_cast<unsigned long long>(cost.wall_us),
           static_cast<unsigned long long>(cost.frozen_us), static_cast<unsigned long long>(cost.freezing_us),
           static_cast<unsigned long long>(cost.frozen_work_us), static_cast<unsigned long long>(cost.seal_us),
           static_cast<unsigned long long>(cost.image_bytes));
  return "";
}

std::vector<EpochId> Supervisor::Impl::commit_through(EpochId epoch) {
  std::vector<EpochId> done;
  const std::uint64_t now = mono_ns() / 1000;
  for (EpochRecord& record : epochs.commit_through(epoch)) {
    for (const OutputChunk& chunk : record.output) release(record.id, chunk.stream, chunk.bytes);
    if (auto it = first_output_us.find(record.id); it != first_output_us.end()) {
      stats.output_hold_us_max = std::max(stats.output_hold_us_max, now - it->second);
      first_output_us.erase(it);
    }
    remove_epoch_dir(record.id);
    done.push_back(record.id);
  }
  // Replay never reaches back past the oldest uncommitted checkpoint.
  input.trim(epochs.empty() ? input.written() : epochs.oldest().stdin_consumed);
  return done;
}

// size: the rollback's steps in the order SPECULATION.md §8.8 gives them; splitting them would scatter it.
std::string Supervisor::Impl::rollback(EpochId failed, bool speculative, const RollbackHooks& hooks,
                                       RestoreCost& cost) {
  BFT_ASSERT(!epochs.empty());
  BFT_ASSERT(epochs.oldest().id == failed);  // every earlier epoch committed
  cost = RestoreCost{};
  cost.epoch = failed;
  const std::uint64_t start = mono_ns();
  kill_tree();
  finished = false;
  exit_code = 125;
  // What the killed tree printed after the checkpoint is dropped, with everything held for this epoch and later.
  std::size_t dropped = 0;
  for (const auto& [fd, stream] : channels->outputs()) {
    std::string bytes;
    channels->read_available(fd, bytes);
    dropped += bytes.size();
  }
  std::size_t held_dropped = 0;
  for (const EpochRecord& later : epochs.rollback_to(failed, held_dropped)) remove_epoch_dir(later.id);
  first_output_us.clear();  // only the failed epoch and later ones held output
  stats.output_bytes_dropped += dropped + held_dropped;
  const EpochRecord target = epochs.newest();
  channels->restore_terminal_state(target.terminal);
  cost.kill_reap_us = since_us(start);
  if (std::string err = hooks.before_restore(cost.rerun); !err.empty()) return err;

  const std::string name = epoch_dir_name(failed);
  UniqueFd dir(::openat(boundary->images_root(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return errno_text("open " + name);
  if (const int private_tmp = boundary->private_tmp_root(); private_tmp >= 0) {
    const std::uint64_t tmp_start = mono_ns();
    UniqueFd tmp_copy(::openat(dir.get(), "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!tmp_copy.valid()) return errno_text("open " + name + "/tmp");
    // Restore checks the size of every file the tree had open: /tmp must look as it did at the checkpoint.
    if (std::string err = clear_tree(private_tmp); !err.empty()) return "clearing /tmp: " + err;
    if (std::string err = copy_tree(tmp_copy.get(), private_tmp); !err.empty()) return "restoring /tmp: " + err;
    cost.tmp_us = since_us(tmp_start);
  }
  std::vector<std::pair<int, std::string>> inherit;
  if (std::string err = channels->prepare_restore(target, inherit); !err.empty()) return err;
  RestoreRequest request;
  request.images_dir_fd = dir.get();
  request.inherit_fds = inherit;
  request.log_level = options.criu_log_level;
  request.tcp_established = target.tcp_established;
  const std::uint64_t restore_start = mono_ns();
  request.before_resume = [&](pid_t restored_root) -> std::string {
    // CRIU leaves an inherited pipe as it was given (it restores a pipe's data only into pipes it creates):
    // the fresh stdin pipe is empty, and gets exactly what the tree had not consumed at the checkpoint.
    if (const std::size_t extra = channels->empty_stdin(); extra > 0)
      LOG_WARN("run", "the restored stdin pipe held %zu bytes; emptied", extra);
    stats.stdin_bytes_replayed += input.written() - target.stdin_consumed;
    input.rewind(target.stdin_consumed);
    write_tree_stdin();
    return hooks.pre_resume(pid_namespace_of(restored_root), since_us(restore_start));
  };
  pid_t restored = -1;
  const std::string err = criu->restore_child(request, restored);
  cost.restore_us = since_us(restore_start);
  channels->close_tree_ends();
  if (restored > 0) root = restored;
  if (!err.empty()) {
    kill_tree();
    return err;
  }
  if (speculative) {
    epochs.renumber_newest(cost.rerun);
    const std::string new_name = epoch_dir_name(cost.rerun);
    if (::renameat(boundary->images_root(), name.c_str(), boundary->images_root(), new_name.c_str()) != 0)
      return errno_text("rename " + name);
  } else {
    epochs.discard_newest();
    remove_epoch_dir(failed);
    input.trim(input.written());
  }
  cost.total_us = since_us(start);
  LOG_INFO("run", "rolled back epoch %llu to its checkpoint: %llu us (kill %llu, /tmp %llu, restore %llu); "
           "re-run as epoch %llu%s", static_cast<unsigned long long>(failed),
           static_cast<unsigned long long>(cost.total_us), static_cast<unsigned long long>(cost.kill_reap_us),
           static_cast<unsigned long long>(cost.tmp_us), static_cast<unsigned long long>(cost.restore_us),
           static_cast<unsigned long long>(cost.rerun), speculative ? "" : ", not speculating");
  return "";
}

}  // namespace bftfs::criu
