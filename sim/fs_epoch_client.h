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
// The program prints a line per result it gets and consumes a few bytes of a seeded input stream for each
// (sim/spec_output.h). Lines of an epoch are held until it commits, then externalized; a rollback drops the held
// lines of the failed epoch and every later one, and the restored program, whose input position is part of its
// checkpoint, reads the same input again. When the client is told to stop (the liveness phase), the program's
// length is fixed at the requests it has begun: a rollback after that makes it run again up to there, and it has
// finished when it has answered them all and its last epoch committed.
//
// What the client sent and learned feeds the checker's properties 11-13 only through the agreed history
// (sim/spec_audit.h); property 14 compares what the program externalized with a serial replay of that history
// (sim/spec_output.h), and property 15 requires the program to finish in the liveness phase (finished()).
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
#include "sim/spec_output.h"
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
  std::uint64_t lines_externalized = 0;  // output lines of committed epochs
  std::uint64_t lines_dropped = 0;      // output lines of failed epochs, never externalized
  std::uint64_t input_replayed = 0;     // input bytes consumed again after a rollback
  std::uint64_t rollbacks_stopped = 0;  // rollbacks after the client stopped: the program runs again to its end
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
    std::uint64_t answered = 0;   // requests answered (each printed one line)
    std::uint64_t input_pos = 0;  // the input consumed so far
  };
  struct Sealed {
    std::uint64_t epoch = 0;
    std::uint64_t request = 0;  // the EPOCH request's id
    std::optional<fs::OpResult> verdict;  // its final result, once it came (verdicts are used in epoch order)
    bool failed_request = false;          // its final did not carry an EPOCH result
    std::uint64_t entries = 0;
  };

  // `seed` seeds the program's Prng, `input_seed` its input stream.
  EpochClient(const fs::FsOptions& fs_options, NodeId client, std::uint64_t stream, const EpochClientOptions& o,
              const FsWorkloadOptions& work, std::uint64_t seed, std::uint64_t input_seed)
      : options(o), model(fs_options, client, stream), log(stream, o.part_bytes),
        program{FsWorkload(work), Prng(seed), 0, std::nullopt, 0, 0} {
    output.client = client;
    output.stream = stream;
    output.input_seed = input_seed;
    output.program_seed = seed;
    output.work = work;
    checkpoints.emplace(log.open_epoch(), program);
  }

  // The program has answered every request of its fixed length (program_end) and every epoch committed.
  bool finished() const {
    return program_end && program.answered >= *program_end && !program.pending && log.open_entries() == 0 &&
           sealed.empty();
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
  std::map<std::uint64_t, std::vector<OutputLine>> held;  // lines of epochs not yet committed, by epoch
  ProgramOutput output;                    // what was externalized, and the epochs committed
  std::uint64_t input_high = 0;            // the furthest input position any execution reached
  std::optional<std::uint64_t> program_end;  // the program's length, fixed when the client stops
  EpochClientStats stats;
};

}  // namespace bftfs::sim
