// Copies of a directory tree that lives on one file system: how the supervisor snapshots the supervised tree's
// private /tmp at every checkpoint (CRIU does not copy file contents) and puts it back before a restore.
#pragma once

#include <string>

namespace bftfs::criu {

// Copies everything under the directory `src_dir_fd` that lies on the same file system as it into the directory
// `dst_dir_fd`: directories, regular files, symbolic links, fifos and device nodes, with mode, owner and
// timestamps; files hard-linked to each other within the tree stay hard-linked. Mount points under the source
// (another file system) and their contents are skipped, and so are sockets (a restored process binds its socket
// anew). The root's own mode, owner and timestamps are copied too. Directories that already exist in the
// destination are reused; any other existing name is an error. Returns "" or what failed, with the path.
[[nodiscard]] std::string copy_tree(int src_dir_fd, int dst_dir_fd);

// Removes everything under the directory `dir_fd` that lies on its file system, except mount points and the
// directories that lead to them (they cannot be removed). Returns "" or what failed, with the path.
[[nodiscard]] std::string clear_tree(int dir_fd);

}  // namespace bftfs::criu
