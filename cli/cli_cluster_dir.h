// The layout of a local cluster's directory (cluster start, cluster stop, status) and the checks on the
// processes it records. Under DIR: cluster.conf, keys/; r<i>/ (data, with status.json), r<i>.log, r<i>.pid for
// replica i; norep/, norep.log, norep.pid for a NO-REP server; relay.sock, relay.log, relay.pid and
// relay.status.json for the relay of the file service.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/types.h"

namespace bftfs::cli {

inline std::string pid_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i) + ".pid"; }
inline std::string data_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i); }
inline std::string log_path(const std::string& dir, NodeId i) { return dir + "/r" + std::to_string(i) + ".log"; }
inline std::string norep_data_path(const std::string& dir) { return dir + "/norep"; }
inline std::string relay_socket_path(const std::string& dir) { return dir + "/relay.sock"; }
inline std::string relay_status_path(const std::string& dir) { return dir + "/relay.status.json"; }

bool file_exists(const std::string& path);
// The pid in a pid file, or 0.
pid_t read_pid(const std::string& path);
// True if `pid` is alive and is a `bftfs <role>` process (guards against a recycled pid).
bool is_our_process(pid_t pid, const char* role);
// Sleeps for `ms` milliseconds (the polling loops of start and stop).
void sleep_ms(int ms);

}  // namespace bftfs::cli
