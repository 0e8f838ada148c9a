// CriuService over libcriu (built when CMake finds criu.pc; criu_service_stub.cc otherwise).
#include "criu-hooks/criu_service.h"

#include <criu/criu.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/assert.h"
#include "os/unique_fd.h"

namespace bftfs::criu {
namespace {

struct OptsDeleter {
  void operator()(criu_opts* o) const { criu_local_free_opts(o); }
};
using Opts = std::unique_ptr<criu_opts, OptsDeleter>;

// libcriu's notification callback has no user argument: the request in progress is reached through this
// pointer, set for the duration of one dump (calls are never concurrent: see the header).
const DumpRequest* g_dump_in_progress = nullptr;
std::string g_while_frozen_error;

int on_notify(char* action, criu_notify_arg_t) {
  if (g_dump_in_progress == nullptr || std::strcmp(action, "post-dump") != 0) return 0;
  if (!g_dump_in_progress->while_frozen) return 0;
  g_while_frozen_error = g_dump_in_progress->while_frozen();
  return g_while_frozen_error.empty() ? 0 : -1;
}

// The first error lines CRIU wrote to `log_name` in the images directory (the harmless RLIMIT_NOFILE complaint
// of a sandbox without CAP_SYS_RESOURCE left out), joined with " | ".
std::string log_errors(int images_dir_fd, const char* log_name) {
  UniqueFd fd(::openat(images_dir_fd, log_name, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::string("no ") + log_name;
  std::string text;
  char buf[65536];
  for (ssize_t n; text.size() < (4u << 20) && (n = ::read(fd.get(), buf, sizeof buf)) > 0;) {
    text.append(buf, static_cast<std::size_t>(n));
  }
  std::string out;
  int found = 0;
  for (std::size_t pos = 0; pos < text.size() && found < 3;) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.find("Error") == std::string::npos || line.find("RLIMIT_NOFILE") != std::string::npos) continue;
    out += (found++ ? " | " : "") + line;
  }
  return out.empty() ? std::string("no error line in ") + log_name : out;
}

std::string describe(int rc, const std::string& binary, int images_dir_fd, const char* log_name) {
  if (rc == -ECONNREFUSED || rc == -ECOMM)
    return "cannot talk to the CRIU service " + binary + ": " + std::strerror(-rc);
  if (rc == -EBADE) return log_errors(images_dir_fd, log_name);
  return "libcriu returned " + std::to_string(rc) + " (" + std::strerror(-rc) + "); " +
         log_errors(images_dir_fd, log_name);
}

std::string make_opts(const std::string& binary, int images_dir_fd, int log_level, const char* log_name, Opts& out) {
  criu_opts* raw = nullptr;
  if (criu_local_init_opts(&raw) != 0) return "criu_local_init_opts failed";
  Opts opts(raw);
  if (criu_local_set_service_binary(opts.get(), binary.c_str()) != 0) return "criu_local_set_service_binary failed";
  criu_local_set_images_dir_fd(opts.get(), images_dir_fd);
  criu_local_set_log_level(opts.get(), log_level);
  if (criu_local_set_log_file(opts.get(), log_name) != 0) return "criu_local_set_log_file failed";
  criu_local_set_file_locks(opts.get(), true);
  out = std::move(opts);
  return "";
}

}  // namespace

bool CriuService::available() { return true; }

CriuService::CriuService(std::string binary, std::string config_file)
    : binary_(std::move(binary)), config_file_(std::move(config_file)) {
  // Every service binary this process starts reads it; nothing else in this process looks at the variable.
  BFT_ASSERT(::setenv("CRIU_CONFIG_FILE", config_file_.c_str(), 1) == 0);
}

std::string CriuService::dump(const DumpRequest& request) const {
  BFT_ASSERT(request.pid > 0);
  BFT_ASSERT(g_dump_in_progress == nullptr);
  Opts opts;
  if (std::string err = make_opts(binary_, request.images_dir_fd, request.log_level, "dump.log", opts); !err.empty())
    return err;
  criu_local_set_pid(opts.get(), request.pid);
  criu_local_set_leave_running(opts.get(), true);
  for (const std::string& key : request.externals) {
    if (criu_local_add_external(opts.get(), key.c_str()) != 0) return "criu_local_add_external " + key + " failed";
  }
  criu_local_set_notify_cb(opts.get(), on_notify);
  g_dump_in_progress = &request;
  g_while_frozen_error.clear();
  const int rc = criu_local_dump(opts.get());
  g_dump_in_progress = nullptr;
  if (!g_while_frozen_error.empty()) return "while the tree was frozen: " + g_while_frozen_error;
  if (rc < 0) return "dump failed: " + describe(rc, binary_, request.images_dir_fd, "dump.log");
  return "";
}

std::string CriuService::restore_child(const RestoreRequest& request, pid_t& root) const {
  Opts opts;
  if (std::string err = make_opts(binary_, request.images_dir_fd, request.log_level, "restore.log", opts); !err.empty())
    return err;
  for (const auto& [fd, key] : request.inherit_fds) {
    BFT_ASSERT(fd >= 0);
    BFT_ASSERT((::fcntl(fd, F_GETFD) & FD_CLOEXEC) == 0);
    if (criu_local_add_inherit_fd(opts.get(), fd, key.c_str()) != 0)
      return "criu_local_add_inherit_fd " + key + " failed";
  }
  const int rc = criu_local_restore_child(opts.get());
  if (rc <= 0) return "restore failed: " + describe(rc, binary_, request.images_dir_fd, "restore.log");
  root = rc;
  return "";
}

}  // namespace bftfs::criu
