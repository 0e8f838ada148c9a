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

}  // namespace

void Supervisor::Impl::kill_tree() {
  if (root <= 0) return;
  // SIGKILL to a pid namespace's init kills every process in it; the init's exit completes only after they are
  // all gone, so once it is reaped no pid of the old tree remains (a restore would fail on a leftover zombie).
  ::kill(root, SIGKILL);
  int status = 0;
  while (::waitpid(root, &status, 0) < 0 && errno == EINTR) {
  }
  root = -1;
  reap();  // other orphans, if any
}

void Supervisor::Impl::remove_epoch_dir(EpochId epoch) {
  const std::string name = epoch_dir_name(epoch);
  UniqueFd dir(::openat(images_root.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) return;
  if (std::string err = clear_tree(dir.get()); !err.empty())
    LOG_WARN("run", "cleaning %s: %s", name.c_str(), err.c_str());
  dir.reset();
  if (::unlinkat(images_root.get(), name.c_str(), AT_REMOVEDIR) != 0)
    LOG_WARN("run", "removing %s: %s", name.c_str(), std::strerror(errno));
}

std::string Supervisor::Impl::begin_epoch(EpochId& out) {
  if (root <= 0) return "the tree is not running";
  const EpochId id = next_epoch;
  const std::string name = epoch_dir_name(id);
  if (::mkdirat(images_root.get(), name.c_str(), 0700) != 0) return errno_text("mkdir " + name);
  UniqueFd dir(::openat(images_root.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid() || ::mkdirat(dir.get(), "tmp", 0700) != 0) return errno_text("prepare " + name);
  UniqueFd tmp_copy(::openat(dir.get(), "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!tmp_copy.valid()) return errno_text("open " + name + "/tmp");

  EpochRecord record;
  record.id = id;
  channels->keys(record.stdin_key, record.stdout_key, record.stderr_key);
  CheckpointCost cost;
  cost.epoch = id;
  DumpRequest request;
  request.pid = root;
  request.images_dir_fd = dir.get();
  request.externals = channels->dump_externals();
  request.log_level = options.criu_log_level;
  // While the tree is frozen: everything it printed so far belongs before the checkpoint, what it has not read
  // from stdin stays to be read after it, and /tmp is copied as it is.
  request.while_frozen = [&]() -> std::string {
    const std::uint64_t start = mono_ns();
    drain_outputs();
    std::size_t unread = 0;
    if (std::string err = channels->stdin_unread(unread); !err.empty()) return err;
    BFT_ASSERT(unread <= input.written());
    record.stdin_consumed = input.written() - unread;
    if (std::string err = copy_tree(tmp_dir.get(), tmp_copy.get()); !err.empty()) return "copying /tmp: " + err;
    cost.frozen_work_us = since_us(start);
    return "";
  };
  const std::uint64_t start = mono_ns();
  std::string err = criu->dump(request);
  cost.wall_us = since_us(start);
  if (!err.empty()) {
    ++stats.checkpoint_failures;
    tmp_copy.reset();
    dir.reset();
    remove_epoch_dir(id);
    return err;
  }
  DumpStats dump;
  if (std::string bad = decode_dump_stats(read_small_file(dir.get(), "stats-dump"), dump); bad.empty()) {
    cost.frozen_us = dump.frozen_us;
    cost.freezing_us = dump.freezing_us;
  } else {
    LOG_WARN("run", "%s/stats-dump: %s", name.c_str(), bad.c_str());
  }
  cost.image_bytes = image_bytes(dir.get());
  stats.checkpoints.push_back(cost);
  ++next_epoch;
  epochs.begin(std::move(record));
  LOG_INFO("run", "checkpoint %llu: dump %llu us, frozen %llu us, images %llu bytes",
           static_cast<unsigned long long>(id), static_cast<unsigned long long>(cost.wall_us),
           static_cast<unsigned long long>(cost.frozen_us), static_cast<unsigned long long>(cost.image_bytes));
  out = id;
  return "";
}

void Supervisor::Impl::commit_epoch(EpochId epoch) {
  BFT_ASSERT(!epochs.empty());
  BFT_ASSERT(epochs.oldest().id == epoch);
  EpochRecord done = epochs.commit_oldest();
  for (const OutputChunk& chunk : done.output) release(chunk.stream, chunk.bytes);
  remove_epoch_dir(epoch);
  ++stats.epochs_committed;
  // Replay never reaches back past the oldest uncommitted checkpoint.
  input.trim(epochs.empty() ? input.written() : epochs.oldest().stdin_consumed);
  LOG_INFO("run", "epoch %llu committed: %zu bytes of output released", static_cast<unsigned long long>(epoch),
           done.output_bytes);
}

std::string Supervisor::Impl::rollback_to(EpochId epoch) {
  const EpochRecord* target = epochs.find(epoch);
  BFT_ASSERT(target != nullptr);
  RestoreCost cost;
  cost.epoch = epoch;
  const std::uint64_t start = mono_ns();
  kill_tree();
  // What the killed tree printed after the checkpoint is dropped, with everything held for this epoch and later.
  std::size_t dropped = 0;
  for (const auto& [fd, stream] : channels->outputs()) {
    std::string bytes;
    channels->read_available(fd, bytes);
    dropped += bytes.size();
  }
  std::size_t held_dropped = 0;
  for (const EpochRecord& later : epochs.rollback_to(epoch, held_dropped)) {
    remove_epoch_dir(later.id);
    ++stats.epochs_discarded;
  }
  stats.output_bytes_dropped += dropped + held_dropped;
  cost.kill_reap_us = since_us(start);
  exited = false;
  exit_code = 125;
  auto fail = [this](const std::string& why) {
    exited = true;  // no tree any more: the caller reports why
    return why;
  };

  const std::uint64_t tmp_start = mono_ns();
  const std::string name = epoch_dir_name(epoch);
  UniqueFd dir(::openat(images_root.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd tmp_copy(dir.valid() ? ::openat(dir.get(), "tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1);
  if (!tmp_copy.valid()) return fail(errno_text("open " + name + "/tmp"));
  // Restore checks the size of every file the tree had open: /tmp must look as it did at the checkpoint.
  if (std::string err = clear_tree(tmp_dir.get()); !err.empty()) return fail("clearing /tmp: " + err);
  if (std::string err = copy_tree(tmp_copy.get(), tmp_dir.get()); !err.empty()) return fail("restoring /tmp: " + err);
  cost.tmp_us = since_us(tmp_start);

  std::vector<std::pair<int, std::string>> inherit;
  if (std::string err = channels->prepare_restore(*target, inherit); !err.empty()) return fail(err);
  RestoreRequest request;
  request.images_dir_fd = dir.get();
  request.inherit_fds = inherit;
  request.log_level = options.criu_log_level;
  const std::uint64_t restore_start = mono_ns();
  pid_t restored = -1;
  const std::string err = criu->restore_child(request, restored);
  cost.restore_us = since_us(restore_start);
  channels->close_tree_ends();
  if (!err.empty()) return fail(err);
  root = restored;
  // The restored tree had consumed exactly this much of stdin: it reads the rest again.
  stats.stdin_bytes_replayed += input.written() - target->stdin_consumed;
  input.rewind(target->stdin_consumed);
  write_tree_stdin();
  cost.total_us = since_us(start);
  stats.restores.push_back(cost);
  LOG_INFO("run", "rolled back to epoch %llu: %llu us (kill %llu, /tmp %llu, restore %llu); root pid %d",
           static_cast<unsigned long long>(epoch), static_cast<unsigned long long>(cost.total_us),
           static_cast<unsigned long long>(cost.kill_reap_us), static_cast<unsigned long long>(cost.tmp_us),
           static_cast<unsigned long long>(cost.restore_us), static_cast<int>(root));
  return "";
}

}  // namespace bftfs::criu
