// bftfs replica / bftfs norep: the daemons. They run in the foreground until SIGTERM or SIGINT.
#include <cstdio>

#include "common/log.h"
#include "cli/cli_common.h"
#include "norep/norep_server.h"
#include "replica/replica_runtime.h"
#include "runtime/service_factory.h"

namespace bftfs::cli {
int cmd_replica(int argc, char** argv) {
  ArgParser p("replica",
              "Runs PBFT replica ID of the cluster in CONFIG, with its durable state in DATADIR (write-ahead log,\n"
              "service snapshots, status.json). Stops cleanly on SIGTERM or SIGINT.");
  p.option("config", "FILE", "cluster.conf written by keygen").required("config");
  p.option("id", "I", "replica id (0..n-1)").required("id");
  p.option("data", "DATADIR", "data directory (created if missing)").required("data");
  p.option("service", "NAME", std::string("replicated service: ") + service_names(), "counter");
  p.option("log-level", "LEVEL", "debug|info|warn|error", "info");
  p.flag("no-batching", "one request per pre-prepare (batch_window = 0)");
  p.option("batch-max", "N", "requests per pre-prepare", "64");
  p.option("batch-window", "W", "batches in flight before requests wait to be batched", "1");
  p.option("checkpoint-interval", "K", "checkpoint every K sequence numbers (log window 2K)", "128");
  p.flag("no-piggyback-commits", "send each COMMIT at once instead of with the next PRE-PREPARE/PREPARE");
  p.flag("no-batch-hold", "as primary, send the next batch as soon as the window opens instead of waiting briefly "
         "for the clients just answered");
  p.flag("no-quiet-primary", "as primary, persist, COMMIT and vote for every batch even while all backups answer");
  p.flag("no-fsync", "do not fdatasync the log (NOT durable; for measuring what fsync costs)");
  p.flag("check-invariants", "check the core's invariants after every step (slow)");
  p.flag("shim", "run the service behind the PBFT-CS shim (predicated requests of speculating clients)");
  p.flag("early-replies", "PBFT-CS: as primary, execute requests on receipt and send early speculative replies");
  p.option("corrupt-early-replies", "FRACTION",
           "fault injection: as primary, corrupt this fraction (0..1) of early replies", "0");
  add_wan_options(p);
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  bool ok = true;
  ReplicaRuntimeOptions o;
  o.config_path = p.get("config");
  o.id = static_cast<NodeId>(p.get_u64("id", ok, 0, kReplicasMax - 1));
  o.data_dir = p.get("data");
  o.service = p.get("service");
  o.core.batch_requests_max = static_cast<std::uint32_t>(p.get_u64("batch-max", ok, 1, kBatchRequestsMax));
  o.core.checkpoint_interval = p.get_u64("checkpoint-interval", ok, 1, 1u << 20);
  o.core.log_window = 2 * o.core.checkpoint_interval;
  o.core.batch_window = static_cast<std::uint32_t>(p.get_u64("batch-window", ok, 1, 1024));
  if (p.has("no-batching")) o.core.batch_window = 0;
  o.core.piggyback_commits = !p.has("no-piggyback-commits");
  o.core.batch_hold = !p.has("no-batch-hold");
  o.core.quiet_primary = !p.has("no-quiet-primary");
  o.wal.fsync = !p.has("no-fsync");
  o.check_invariants = p.has("check-invariants");
  o.shim = p.has("shim");
  o.core.early_replies = p.has("early-replies");
  const double corrupt = p.get_double("corrupt-early-replies", ok);
  if (ok && (corrupt < 0 || corrupt > 1)) {
    error("replica", "--corrupt-early-replies: expected a fraction in [0, 1]");
    ok = false;
  }
  o.corrupt_early_replies_ppm = static_cast<std::uint32_t>(corrupt * 1e6 + 0.5);
  o.handle_signals = true;
  if (!ok || !get_wan_options(p, o.transport.wan) || !set_log_level("replica", p.get("log-level"))) return kExitUsage;
  std::unique_ptr<ReplicaRuntime> rt;
  if (std::string err = ReplicaRuntime::create(o, rt); !err.empty()) {
    error("replica", err);
    return kExitFailure;
  }
  if (!o.wal.fsync) LOG_WARN("r" + std::to_string(o.id), "--no-fsync: the log is NOT durable");
  rt->run();
  return kExitOk;
}

int cmd_norep(int argc, char** argv) {
  ArgParser p("norep",
              "Runs the unreplicated baseline: one server executing every authenticated request at once and\n"
              "answering with the full result. It authenticates as replica 0 of CONFIG. The file service keeps its\n"
              "state on the replicas' disk store (DATADIR/fs) with a checkpoint every 128 requests. Without\n"
              "--durable it keeps no log (a restart loses what follows the last checkpoint); with --durable it\n"
              "group-commits each executed request to a write-ahead log before replying, like the replicas do.\n"
              "For WAN emulation the server is at node 0's site.");
  p.option("config", "FILE", "cluster.conf written by keygen").required("config");
  p.option("data", "DATADIR", "data directory (status.json; fs/ for the file service; wal/ with --durable)").required("data");
  p.option("service", "NAME", std::string("service: ") + service_names(), "counter");
  p.option("listen", "HOST:PORT", "address to listen on (default: replica 0's address)");
  p.flag("durable", "log every executed request with group commit before replying");
  p.option("log-level", "LEVEL", "debug|info|warn|error", "info");
  add_wan_options(p);
  if (auto rc = p.parse(argc, argv, 2)) return *rc;
  NorepOptions o;
  o.config_path = p.get("config");
  o.data_dir = p.get("data");
  o.service = p.get("service");
  o.durable = p.has("durable");
  o.handle_signals = true;
  if (p.has("listen")) {
    if (std::string err = parse_host_port(p.get("listen"), o.listen); !err.empty()) {
      error("norep", "--listen: " + err);
      return kExitUsage;
    }
  }
  if (!get_wan_options(p, o.transport.wan) || !set_log_level("norep", p.get("log-level"))) return kExitUsage;
  std::unique_ptr<NorepServer> server;
  if (std::string err = NorepServer::create(o, server); !err.empty()) {
    error("norep", err);
    return kExitFailure;
  }
  server->run();
  return kExitOk;
}

}  // namespace bftfs::cli
