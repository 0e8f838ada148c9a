// What an epoch client's program showed the world, and checker property 14 of docs/SPECULATION.md §14 over it:
// serial equivalence of what was externalized.
//
// The simulated program (sim/fs_epoch_client.h) prints one line per result it gets: render_result() of its
// request and the result the local model gave it, then the input bytes it consumed for that request
// (read_input(): a seeded stream, a few bytes per request). Lines of epoch k are held until k commits and are
// then externalized, in order; a rollback drops the lines of the failed epoch and every later one, and the
// restored program, whose input position is part of its checkpoint, consumes the same bytes again. This is what
// the supervisor does with a real tree's stdout and stdin (§8.6, §8.7).
//
// Property 14, checked at the end of a seed on the agreed history (check_serial_output): EpochReplay
// (sim/spec_audit.h) replays every EPOCH's entries serially at the EPOCH's place and keeps, for each that applied,
// the entries and the results they gave there. Then
//   - the client's committed epochs are exactly the stream's applied epochs, in the same order: each committed
//     epoch applied exactly once, at the seq of the EPOCH request the client took its verdict from, and no epoch
//     the client rolled back applied (its effects would be duplicated by the re-run);
//   - the externalized lines are, line for line, render_result() of the applied entries and their replayed
//     results, followed by the input the serial program consumes: the input stream from position 0, each byte
//     exactly once, in order, each line's bytes at the position the line says;
//   - no line of a failed epoch was externalized, and no line before the client received the final verdict of
//     its epoch's EPOCH (the step the checker recorded for that completion);
//   - the program itself is the serial one (check_serial_program): a fresh program with the same seed, given the
//     replayed results, issues exactly the requests of the applied entries, in order. So a checkpoint that does
//     not restore the whole program, or a result the program learned from that no predicate covered, shows.
//     The program learns only what a tree sees (program_view), as the entries predict only that.
//
// Pure: no I/O, no clocks.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/types.h"
#include "services/fs/fs_codec.h"
#include "sim/fs_workload.h"
#include "sim/spec_audit.h"

namespace bftfs::sim {

// The program's input stream: byte `pos` of the stream seeded by `seed`.
std::uint8_t program_input_byte(std::uint64_t seed, std::uint64_t pos);

// What the program consumes for one request at input position `pos`: one byte b, then b % 4 more (so the
// positions depend on the stream only, and a checker can recompute them).
Bytes read_input(std::uint64_t seed, std::uint64_t pos);

// One line of the program's output for entry request `request` (TIME as op 0, as the local model and the
// replicas execute it) and its result `result`: the outcome, then per op its code, the names it carries, and what
// a program sees of its result (attributes, bytes read as a length and a digest, bytes written, listings, link
// targets, access bits, errno). A request that stopped (an op failed, or a predicate did not hold) shows only the
// op that stopped it and its errno, the ops
// the tree never sees beyond success (WRITE: its count; REMOVE, RMDIR, RENAME: ok) show no more, as
// spec::build_entry predicts only what the tree saw. Deterministic.
std::string render_result(const fs::Request& request, const fs::Result& result);

// What a tree sees of the result of a request of its own (the handler's view, without TIME): a request that
// stopped shows the op that stopped it and its errno only (not, say, the bytes a READ whose digest predicate
// failed read); in a done one, WRITE shows its count and REMOVE, RMDIR and RENAME their success only. The rest of
// those results is blanked (spec::build_entry predicts none of it).
fs::Result program_view(const fs::Result& result);

// The whole line: render_result's text and the input bytes consumed for it, in hex.
std::string output_line(const std::string& rendered, std::span<const std::uint8_t> input);

// One externalized line, as the client recorded it.
struct OutputLine {
  std::uint64_t epoch = 0;      // the epoch that produced it
  std::string text;             // output_line()
  std::uint64_t input_pos = 0;  // where its input began
  Bytes input;                  // the bytes consumed
  std::uint64_t step = 0;       // the step at which it was externalized
  fs::Result seen;              // the result the program learned from (program_view, without TIME)
};

// An epoch the client committed: the EPOCH request whose final verdict it acted on.
struct CommittedEpoch {
  std::uint64_t epoch = 0;
  std::uint64_t request = 0;
  bool by_chain = false;  // committed on a CHAIN verdict naming a descendant (an earlier execution applied)
};

// What one epoch client's program externalized by the end of a seed.
struct ProgramOutput {
  NodeId client = 0;
  std::uint64_t stream = 0;
  std::uint64_t input_seed = 0;
  std::uint64_t program_seed = 0;  // its Prng's
  FsWorkloadOptions work;          // its FsWorkload's
  std::vector<CommittedEpoch> committed;  // in commit order
  std::vector<OutputLine> lines;          // in externalization order
};

// What the check needs to know about the client's requests from the checker (sim/checker.h): the seq at which
// a request executed in the agreed history, and the step at which the client accepted its final result.
struct RequestFacts {
  std::function<std::optional<std::uint64_t>(std::uint64_t request)> agreed_seq;
  std::function<std::optional<std::uint64_t>(std::uint64_t request)> completed_step;
};

// Property 14 for one client: "" if it holds, else the first breach, naming the client, the epoch and the line.
// `applied` are the client's stream's applied epochs in agreed order (EpochReplay::applied).
std::string check_serial_output(const ProgramOutput& out, std::span<const AppliedEpoch> applied,
                                const RequestFacts& facts);

// Property 14, the program's part: "" if a fresh FsWorkload (out.work, Prng(out.program_seed)), fed the replayed
// results through program_view, draws exactly the applied entries' requests in order (spec::build_entry of its
// request, with the entry's TIME, and the replayed result gives the entry), else the first that differs.
std::string check_serial_program(const ProgramOutput& out, std::span<const AppliedEpoch> applied);

}  // namespace bftfs::sim
