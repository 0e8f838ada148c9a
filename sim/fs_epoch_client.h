// A speculating file-service client that runs epochs (docs/SPECULATION.md §14): the pure epoch engine of spec/
// (the local model, entries, epoch logs and their chain) driven by a simulated program, the FsWorkload
// generator (sim/fs_workload.h), whose state (its knowledge and its Prng) is its checkpoint.
//
// The program's requests are answered at once by the local model; what the model does not know it fetches
// (FETCH of the request's trace, then of the keys still missing), using the FETCH's first reply (a 1-reply
// prediction: a lying primary's early reply feeds the model) or waiting for its final one. Answers become entries
// of the open epoch; parts that fill are STAGEd at once; after a drawn number of entries the epoch is sealed into
// an EPOCH request chained to the epoch before it, and the next epoch runs while it is agreed (a pipeline of a
// few). RESERVE keeps the stream's pool of inode numbers filled. A batch whose verdict is not APPLIED (another
// client changed what the program observed, a lie fed the model, or an earlier batch failed) rolls the program
// back to the checkpoint of that epoch: the model undoes that epoch and every later one, forgets its clean
// facts, and the program runs on from there with consensus values only for its next epoch.
//
// What the client sent and learned feeds the checker's properties 11-13 only through the agreed history
// (sim/spec_audit.h); properties 14 and 15 (what the program externalized; liveness of its last epoch) are not
// checked here.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "common/prng.h"
#include "services/fs/fs_codec.h"
#include "sim/fs_workload.h"
#include "spec/epoch_log.h"
#include "spec/local_model.h"

namespace bftfs::sim {

// The seed's choices for its epoch clients (sim/scenario.h).
struct EpochClientOptions {
  std::uint32_t entries_min = 1;      // entries of an epoch before it is sealed: drawn in [min, max]
  std::uint32_t entries_max = 8;
  std::uint32_t pipeline = 2;         // sealed epochs in flight at most
  bool first_replies = true;          // use a FETCH's first reply (1-reply predictions)
  std::size_t part_bytes = 4096;      // STAGE part size (small, so that parts are staged)
  std::uint16_t reserve = 16;         // inode numbers one RESERVE asks for
};

// What the epoch clients did (plain data, summed into SimStats).
struct EpochClientStats {
  std::uint64_t program_steps = 0;      // requests of the program answered by the model (entries)
  std::uint64_t fetches = 0;            // FETCH requests sent
  std::uint64_t first_replies_used = 0;  // ... whose first reply fed the model
  std::uint64_t first_replies_wrong = 0;  // ... whose final reply then differed
  std::uint64_t inconsistent = 0;       // model runs that found contradicting facts (clean facts dropped)
  std::uint64_t reserves = 0;
  std::uint64_t stages = 0;
  std::uint64_t sealed = 0;             // EPOCH requests sent
  std::uint64_t committed = 0;          // epochs whose batch applied
  std::uint64_t failed = 0;             // epochs whose batch did not apply (verdict, or chained on one that failed)
  std::uint64_t rollbacks = 0;          // program restored from a checkpoint
  std::uint64_t discarded_entries = 0;  // entries of epochs rolled back
};

// One epoch client's state (ClientNode::epochs).
struct EpochClient {
  // The program's checkpoint: what it knows and its random stream.
  struct Program {
    FsWorkload work;
    Prng prng{0};
    std::uint64_t creates = 0;  // inode numbers its answered requests took from the stream's pool
    // The request it is waiting on (drawn, not yet answered): an epoch sealed while a request waits for facts
    // checkpoints the program inside that request, which a restore issues again.
    std::optional<FsWorkRequest> pending;
  };
  struct Sealed {
    std::uint64_t epoch = 0;
    std::uint64_t request = 0;  // the EPOCH request's id
    std::optional<fs::OpResult> verdict;  // its final result, once it came (verdicts are used in epoch order)
    bool failed_request = false;          // its final did not carry an EPOCH result
    std::uint64_t entries = 0;
  };

  EpochClient(const fs::FsOptions& fs_options, NodeId client, std::uint64_t stream, const EpochClientOptions& o,
              const FsWorkloadOptions& work, std::uint64_t seed)
      : options(o), model(fs_options, client, stream), log(stream, o.part_bytes), program{FsWorkload(work), Prng(seed), 0, std::nullopt} {
    checkpoints.emplace(log.open_epoch(), program);
  }

  EpochClientOptions options;
  spec::LocalModel model;
  spec::EpochLog log;
  Program program;                         // the running program
  std::map<std::uint64_t, Program> checkpoints;  // C_e: the program when epoch e opened (e not yet committed)
  fs::Request pending_entry;               // program.pending as an entry request (TIME first)
  std::uint32_t fetch_rounds = 0;          // FETCHes for the pending request so far
  std::uint64_t fetch = 0;                 // the FETCH whose reply the pending request waits for (0: none)
  std::map<std::uint64_t, Bytes> firsts_used;  // FETCHes answered by their first reply: that reply's result
  std::uint64_t reserve = 0;               // the RESERVE in flight (0: none)
  std::uint64_t reserved = 0;              // inode numbers RESERVE put into the pool (program.creates used)
  bool reserve_failed = false;             // a RESERVE failed (ENOSPC): no further ones
  std::deque<Sealed> sealed;               // EPOCH requests in flight or waiting for an earlier verdict
  std::set<std::uint64_t> other;           // requests whose results no longer matter to the client (STAGEs,
                                           // FETCHes and EPOCHs of discarded epochs)
  std::uint32_t epoch_length = 0;          // entries of the open epoch before it is sealed
  bool consensus_only = false;             // after a rollback: this epoch uses final replies only (§10)
  std::uint64_t time_ns = 1'700'000'000'000'000'000ull;
  EpochClientStats stats;
};

}  // namespace bftfs::sim
