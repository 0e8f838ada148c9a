// `bftfs mount` and `bftfs umount` (registered in cli/bftfs_main.cc). Exit codes as cli/cli_common.h:
// 0 success, 1 failure at run time, 2 usage error.
#pragma once

namespace bftfs::client {

int cmd_mount(int argc, char** argv);
int cmd_umount(int argc, char** argv);

}  // namespace bftfs::client
