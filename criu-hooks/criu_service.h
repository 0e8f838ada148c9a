// CRIU driven through libcriu in swrk mode: each call starts the service binary (`bftfs-criu swrk`) as a child
// of this process, sends it one request over a socket pair and waits for the answer.
//
// What libcriu cannot set goes in a CRIU configuration file that every call reads (CRIU_CONFIG_FILE): the
// supervisor writes `file-validation filesize` there, because the default validation reads every open file and
// hangs when a read blocks. The calling process must block SIGCHLD (libcriu's rule: a restored tree may exit
// before the call returns) and must not run several calls at once (the notification callback is per process).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace bftfs::criu {

struct DumpRequest {
  pid_t pid = -1;           // the root of the tree, as this process sees it
  int images_dir_fd = -1;   // an empty directory: the images, dump.log and stats-dump go there
  std::vector<std::string> externals;  // --external keys, e.g. "tty[8803:19]" for a pty whose master is not dumped
  // Runs once while every task of the tree is still frozen, after its image was written (CRIU's post-dump
  // notification). A non-empty return fails the dump; the tree then resumes as if nothing happened.
  std::function<std::string()> while_frozen;
  int log_level = 2;        // CRIU's: 0 messages, 1 errors, 2 warnings, 3 info, 4 debug
};

struct RestoreRequest {
  int images_dir_fd = -1;   // a directory a dump filled; restore.log and stats-restore go there
  // --inherit-fd: the image's file named by the key (e.g. "pipe:[1234]") becomes this process's fd. The fds
  // must be open without FD_CLOEXEC during the call, so the service binary inherits them.
  std::vector<std::pair<int, std::string>> inherit_fds;
  int log_level = 2;
};

class CriuService {
 public:
  // True when this build links libcriu; otherwise every call fails with a reason that says how to get it.
  static bool available();

  // `binary`: the swrk service binary (a path, or a name looked up in PATH). `config_file`: the CRIU
  // configuration file every call reads.
  CriuService(std::string binary, std::string config_file);

  // Checkpoints the tree rooted at request.pid and leaves it running, with file locks. Returns "" or why it
  // failed (with the first errors of dump.log).
  [[nodiscard]] std::string dump(const DumpRequest& request) const;
  // Restores the images as a child of this process (CRIU's restore-sibling) and sets `root` to the restored
  // root's pid. Returns "" or why it failed (with the first errors of restore.log).
  [[nodiscard]] std::string restore_child(const RestoreRequest& request, pid_t& root) const;

 private:
  std::string binary_;
  std::string config_file_;
};

}  // namespace bftfs::criu
