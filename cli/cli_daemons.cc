// bftfs replica / bftfs norep: the daemons. They run in the foreground until SIGTERM or SIGINT.
#include <cstdio>
#include <memory>

#include "cli/cli_common.h"
#include "common/assert.h"
#include "common/log.h"
#include "norep/norep_server.h"
#include "replica/replica_runtime.h"
#include "runtime/service_factory.h"
#include "runtime/transport.h"

namespace bftfs::cli {
namespace {

// `bftfs replica` as given on the command line; to_runtime_options turns it into what ReplicaRuntime takes.
struct ReplicaArgs {
  std::string config;
  NodeId id = 0;
  std::string data;
  std::string service = "counter";
  std::string log_level = "info";
  bool no_batching = false;
  std::uint32_t batch_max = 64;
  std::uint32_t batch_window = 1;
  std::uint64_t checkpoint_interval = 128;
  bool no_piggyback_commits = false;
  bool no_batch_hold = false;
  bool no_quiet_primary = false;
  bool no_fsync = false;
  bool check_invariants = false;
  bool shim = false;
  bool early_replies = false;
  double corrupt_early_replies = 0;
  WanArgs wan;
};

ReplicaRuntimeOptions to_runtime_options(const ReplicaArgs& a) {
  ReplicaRuntimeOptions o;
  o.config_path = a.config;
  o.id = a.id;
  o.data_dir = a.data;
  o.service = a.service;
  o.core.batch_requests_max = a.batch_max;
  o.core.checkpoint_interval = a.checkpoint_interval;
  o.core.log_window = 2 * a.checkpoint_interval;
  o.core.batch_window = a.no_batching ? 0 : a.batch_window;
  o.core.piggyback_commits = !a.no_piggyback_commits;
  o.core.batch_hold = !a.no_batch_hold;
  o.core.quiet_primary = !a.no_quiet_primary;
  o.core.early_replies = a.early_replies;
  o.wal.fsync = !a.no_fsync;
  o.check_invariants = a.check_invariants;
  o.shim = a.shim;
  o.corrupt_early_replies_ppm = static_cast<std::uint32_t>(a.corrupt_early_replies * 1e6 + 0.5);
  o.transport.wan = wan_spec(a.wan);
  o.handle_signals = true;
  return o;
}

int run_replica(const ReplicaArgs& a) {
  log_set_level(log_level_of(a.log_level));
  const ReplicaRuntimeOptions o = to_runtime_options(a);
  std::unique_ptr<ReplicaRuntime> rt;
  if (std::string err = ReplicaRuntime::create(o, rt); !err.empty()) {
    error("replica", err);
    return kExitFailure;
  }
  if (!o.wal.fsync) LOG_WARN("r" + std::to_string(o.id), "--no-fsync: the log is NOT durable");
  rt->run();
  return kExitOk;
}

// The options that tune the protocol core of the replica.
void add_replica_tuning(CLI::App& app, ReplicaArgs& a) {
  app.add_flag("--no-batching", a.no_batching, "one request per pre-prepare (batch_window = 0)");
  app.add_option("--batch-max", a.batch_max, "requests per pre-prepare")
      ->type_name("N")->transform(decimal(1, kBatchRequestsMax));
  app.add_option("--batch-window", a.batch_window, "batches in flight before requests wait to be batched")
      ->type_name("W")->transform(decimal(1, 1024));
  app.add_option("--checkpoint-interval", a.checkpoint_interval, "checkpoint every K sequence numbers (log window 2K)")
      ->type_name("K")->transform(decimal(1, 1u << 20));
  app.add_flag("--no-piggyback-commits", a.no_piggyback_commits,
               "send each COMMIT at once instead of with the next PRE-PREPARE/PREPARE");
  app.add_flag("--no-batch-hold", a.no_batch_hold,
               "as primary, send the next batch as soon as the window opens instead of waiting briefly for the "
               "clients just answered");
  app.add_flag("--no-quiet-primary", a.no_quiet_primary,
               "as primary, persist, COMMIT and vote for every batch even while all backups answer");
  app.add_flag("--no-fsync", a.no_fsync, "do not fdatasync the log (NOT durable; for measuring what fsync costs)");
  app.add_flag("--check-invariants", a.check_invariants, "check the core's invariants after every step (slow)");
  app.add_flag("--shim", a.shim, "run the service behind the PBFT-CS shim (predicated requests of speculating clients)");
  app.add_flag("--early-replies", a.early_replies,
               "PBFT-CS: as primary, execute requests on receipt and send early speculative replies");
  app.add_option("--corrupt-early-replies", a.corrupt_early_replies,
                 "fault injection: as primary, corrupt this fraction (0..1) of early and read-only replies")
      ->type_name("FRACTION")->check(fraction());
}

struct NorepArgs {
  std::string config;
  std::string data;
  std::string service = "counter";
  std::string listen;  // empty: replica 0's address
  bool durable = false;
  std::string log_level = "info";
  WanArgs wan;
};

int run_norep(const NorepArgs& a) {
  log_set_level(log_level_of(a.log_level));
  NorepOptions o;
  o.config_path = a.config;
  o.data_dir = a.data;
  o.service = a.service;
  o.durable = a.durable;
  o.handle_signals = true;
  o.transport.wan = wan_spec(a.wan);
  if (!a.listen.empty()) {
    const std::string err = parse_host_port(a.listen, o.listen);
    BFT_ASSERT(err.empty());  // checked by the option's validator
  }
  std::unique_ptr<NorepServer> server;
  if (std::string err = NorepServer::create(o, server); !err.empty()) {
    error("norep", err);
    return kExitFailure;
  }
  server->run();
  return kExitOk;
}

}  // namespace

void add_replica(CLI::App& root, Commands& out) {
  auto a = std::make_shared<ReplicaArgs>();
  CLI::App* app = root.add_subcommand("replica",
      "run one PBFT replica\n\n"
      "Runs PBFT replica ID of the cluster in CONFIG, with its durable state in DATADIR (write-ahead log,\n"
      "service snapshots, status.json). Stops cleanly on SIGTERM or SIGINT.");
  app->add_option("--config", a->config, "cluster.conf written by keygen")->type_name("FILE")->required();
  app->add_option("--id", a->id, "replica id (0..n-1)")->type_name("I")->required()
      ->transform(decimal(0, kReplicasMax - 1));
  app->add_option("--data", a->data, "data directory (created if missing)")->type_name("DATADIR")->required();
  app->add_option("--service", a->service, std::string("replicated service: ") + service_names())->type_name("NAME");
  add_log_level(*app, a->log_level, "debug|info|warn|error");
  add_replica_tuning(*app, *a);
  add_wan_options(*app, a->wan);
  out.push_back({app, [a] { return run_replica(*a); }});
}

void add_norep(CLI::App& root, Commands& out) {
  auto a = std::make_shared<NorepArgs>();
  CLI::App* app = root.add_subcommand("norep",
      "run the unreplicated (NO-REP) baseline server\n\n"
      "Runs the unreplicated baseline: one server executing every authenticated request at once and\n"
      "answering with the full result. It authenticates as replica 0 of CONFIG. The file service keeps its\n"
      "state on the replicas' disk store (DATADIR/fs) with a checkpoint every 128 requests. Without\n"
      "--durable it keeps no log (a restart loses what follows the last checkpoint); with --durable it\n"
      "group-commits each executed request to a write-ahead log before replying, like the replicas do.\n"
      "For WAN emulation the server is at node 0's site.");
  app->add_option("--config", a->config, "cluster.conf written by keygen")->type_name("FILE")->required();
  app->add_option("--data", a->data, "data directory (status.json; fs/ for the file service; wal/ with --durable)")
      ->type_name("DATADIR")->required();
  app->add_option("--service", a->service, std::string("service: ") + service_names())->type_name("NAME");
  app->add_option("--listen", a->listen, "address to listen on (default: replica 0's address)")
      ->type_name("HOST:PORT")->check(host_port());
  app->add_flag("--durable", a->durable, "log every executed request with group commit before replying");
  add_log_level(*app, a->log_level, "debug|info|warn|error");
  add_wan_options(*app, a->wan);
  out.push_back({app, [a] { return run_norep(*a); }});
}

}  // namespace bftfs::cli
