"""Real bftfs processes for the integration tests and the benchmarks (harness/README.md).

Modules, from the ground up:
  binaries     where the build is and the `bftfs` executable in it
  waiting      wait_until: poll a predicate with a deadline
  log          progress lines on stderr
  ports        ranges of free ports
  procs        commands in their own process group, /proc lookups (pids, command lines, CPU time)
  daemon       Daemon: one background process, its log, its status.json readiness, stop and kill
  counter      the `bftfs counter` client: one run, a background stream of runs, a background load
  cluster      Cluster: keys from `bftfs keygen`, n = 3f+1 replicas and a NO-REP server; WAN options;
               status helpers (last_executed, waiting for replicas to catch up or converge)
  cli_cluster  CliCluster: a cluster started by `bftfs cluster start` (replicas or NO-REP, and the relay);
               kill and restart of its members
  relay        Relay: `bftfs relay` in front of a Cluster; the relay's STATUS counters
  mount        Mount: `bftfs mount -f`, unmounted and stopped always
  netns        NetnsLab: network namespaces with partition and isolation adversaries
  users        as_user: run a function with another user's credentials
  andrew       the Andrew benchmark's source trees and phases
  durability   the fsync durability workload: writer process, checker, crash rounds
  spec_run     `bftfs run` on a real cluster: a primary-local WAN cluster with a lying primary, one run with its
               output read as it appears, --trace and --stats-json read back
  fake_spec_daemon  FakeSpecDaemon: the mount daemon's side of `bftfs run`'s control protocol, scripted (commit
               or fail chosen epochs), for testing the supervisor before the daemon's spec session exists

Nothing here imports pytest: a missing capability raises netns.Unavailable, which the test fixtures turn into a
skip. Keep this file free of imports: `python3 -m harness.durability` runs the writer process through it.
"""
