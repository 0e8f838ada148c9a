// The file-service clients that run epochs (simulation.h, sim/fs_epoch_client.h): the program's requests answered
// by the local model, FETCH, RESERVE, STAGE and EPOCH requests through the speculation library, the verdicts in
// epoch order, the rollback of the program to the checkpoint of the first epoch that failed, and its output held
// until its epoch commits (docs/SPECULATION.md §6.4, §6.7, §6.8, §8.6, §8.7, §14).
#include <algorithm>
#include <utility>

#include "common/assert.h"
#include "services/fs/fs_codec.h"
#include "sim/mix.h"
#include "sim/simulation.h"
#include "sim/strfmt.h"
#include "spec/entry_builder.h"

namespace bftfs::sim {

namespace {

constexpr std::uint64_t kEpochStream = 1;      // the stream id every epoch client uses (one run per client)
constexpr std::uint32_t kFirstReplyRounds = 2;  // FETCH rounds of one request that may use first replies
constexpr std::uint64_t kPoolLow = 4;           // RESERVE when fewer inode numbers than this are left
// A request still unanswered after this many FETCHes: the open epoch's entries are sealed without it, so that a
// lie the open epoch used reaches the replicas' replay (which fails it: rollback) instead of stalling the client.
constexpr std::uint32_t kFetchRoundsSeal = 8;

fs::Op stream_op(fs::OpCode code) { return spec::stream_op(code, kEpochStream); }

bool creates_inode(fs::OpCode code) {
  return code == fs::OpCode::kCreate || code == fs::OpCode::kMkdir || code == fs::OpCode::kSymlink ||
         code == fs::OpCode::kMknod;
}

// The one OpResult of a speculation op's executed result, if it has one with no errno.
std::optional<fs::OpResult> stream_result(const SpecEvent& ev, fs::OpCode code) {
  fs::Result r;
  if (ev.status != shim::ShimStatus::kExecuted || fs::decode_result(ev.result, r) != fs::FsDecodeError::kOk ||
      r.outcome != fs::Outcome::kDone || r.results.size() != 1 || r.results[0].code != code) {
    return std::nullopt;
  }
  return std::move(r.results[0]);
}

}  // namespace

void Simulation::make_epoch_client(ClientNode& c) {
  c.epochs = std::make_unique<EpochClient>(sc_.fs_options, c.id, kEpochStream, sc_.epoch_options, sc_.fs_workload,
                                           mix(config_.seed, 0xE90C + c.id), mix(config_.seed, 0x1B9C + c.id));
  c.epochs->epoch_length = epoch_length(c);
}

std::uint32_t Simulation::epoch_length(ClientNode& c) {
  const EpochClientOptions& o = c.epochs->options;
  return o.entries_min + static_cast<std::uint32_t>(c.fs_prng.below(o.entries_max - o.entries_min + 1));
}

std::uint64_t Simulation::epoch_submit(ClientNode& c, fs::Request request, const char* what) {
  const std::uint64_t step = cluster_->next_step();
  const std::uint64_t rid = c.spec->submit(fs::encode_request(request), {});
  checker_->on_submit(c.id, rid, OpKind::kFs, step);
  c.outstanding[rid] = OpKind::kFs;
  ClientNode::FsInFlight f;
  f.request = std::move(request);
  f.learned = true;  // the program learns from the model, never from these results
  c.fs_ops.emplace(rid, std::move(f));
  ++stats_.submitted;
  event(fmt("submit c%u r%llu %s (open epoch %llu)", c.id, ull(rid), what, ull(c.epochs->log.open_epoch())));
  return rid;
}

void Simulation::epoch_pump(ClientNode& c) {
  EpochClient& e = *c.epochs;
  for (;;) {
    if (e.fetch != 0 || e.reserve != 0) return;
    if (!e.program.pending) {
      const bool at_end = e.program_end && e.program.answered >= *e.program_end;
      if (e.log.open_entries() > 0 && (e.log.open_entries() >= e.epoch_length || at_end)) {
        if (e.sealed.size() >= e.options.pipeline || !may_seal()) return;
        epoch_seal(c);
        continue;
      }
      if (at_end || now() < c.next_submit_tick) return;
      if (!e.reserve_failed && e.reserved < e.program.creates + kPoolLow) {
        fs::Op op = stream_op(fs::OpCode::kReserve);
        op.reserve = e.options.reserve;
        e.reserve = epoch_submit(c, fs::Request{{std::move(op)}}, "RESERVE");
        ++e.stats.reserves;
        return;
      }
      e.program.pending = e.program.work.next(e.program.prng);
      e.pending_entry = spec::with_time(e.program.pending->request, e.time_ns += 1000);
      e.fetch_rounds = 0;
    }
    if (!epoch_answer(c)) return;
  }
}

// Answers the pending request from the model, or sends a FETCH for what the model lacks (false).
bool Simulation::epoch_answer(ClientNode& c) {
  EpochClient& e = *c.epochs;
  const fs::EntryRun run = e.model.execute(e.log.open_epoch(), e.pending_entry);
  if (run.inconsistent) {
    // Facts of different times (or a lie) contradict each other: forget the clean ones and fetch again.
    ++e.stats.inconsistent;
    e.model.drop_clean();
  }
  if (!run.complete()) {
    if (e.fetch_rounds >= kFetchRoundsSeal && e.log.open_entries() > 0 && e.sealed.size() < e.options.pipeline &&
        may_seal()) {
      epoch_seal(c);
    }
    e.fetch = epoch_submit(c, spec::fetch_request(kEpochStream, e.pending_entry, run.missing, e.fetch_rounds < kFirstReplyRounds),
                           e.fetch_rounds < kFirstReplyRounds ? "FETCH trace" : "FETCH keys");
    ++e.fetch_rounds;
    ++e.stats.fetches;
    return false;
  }
  // The program learns what a tree would see, no more: what it decides must be what a serial run decides.
  e.program.work.on_result(e.program.pending->request, program_view(spec::without_time(run.result)));
  if (run.result.outcome == fs::Outcome::kDone) {
    for (const fs::Op& op : e.pending_entry.ops) e.program.creates += creates_inode(op.code) ? 1 : 0;
  }
  ++e.stats.program_steps;
  epoch_print(c, run.result);
  if (std::optional<fs::Request> stage = e.log.append(spec::build_entry(e.pending_entry, run.result))) {
    e.other.insert(epoch_submit(c, std::move(*stage), "STAGE"));
    ++e.stats.stages;
  }
  e.program.pending.reset();
  return true;
}

void Simulation::epoch_seal(ClientNode& c) {
  EpochClient& e = *c.epochs;
  const std::uint64_t entries = e.log.open_entries();
  spec::SealedEpoch s = e.log.seal();
  const std::uint64_t rid = epoch_submit(c, std::move(s.request), "EPOCH");
  event(fmt("c%u sealed epoch %llu (prev %llu, %llu entries) as r%llu", c.id, ull(s.epoch), ull(s.prev),
            ull(entries), ull(rid)));
  e.sealed.push_back(EpochClient::Sealed{s.epoch, rid, std::nullopt, false, entries});
  e.checkpoints.emplace(e.log.open_epoch(), e.program);
  e.epoch_length = epoch_length(c);
  e.consensus_only = false;
  ++e.stats.sealed;
}

void Simulation::epoch_on_first(ClientNode& c, const SpecEvent& ev) {
  EpochClient& e = *c.epochs;
  if (ev.id != e.fetch || !e.options.first_replies || e.consensus_only || e.fetch_rounds > kFirstReplyRounds) {
    return;
  }
  const std::optional<fs::OpResult> r = stream_result(ev, fs::OpCode::kFetch);
  if (!r) return;  // not a usable FETCH result: wait for the final one
  e.model.insert(r->facts);
  e.firsts_used.emplace(ev.id, ev.result);
  ++e.stats.first_replies_used;
  e.fetch = 0;
  epoch_pump(c);
}

void Simulation::epoch_on_final(ClientNode& c, const SpecEvent& ev) {
  EpochClient& e = *c.epochs;
  if (const auto used = e.firsts_used.find(ev.id); used != e.firsts_used.end()) {
    // A 1-reply prediction whose final differs: the epochs built on it fail at the replicas' replay.
    e.stats.first_replies_wrong += used->second == ev.result ? 0 : 1;
    e.firsts_used.erase(used);
  } else if (ev.id == e.fetch) {
    if (const std::optional<fs::OpResult> r = stream_result(ev, fs::OpCode::kFetch)) e.model.insert(r->facts);
    e.fetch = 0;
  } else if (ev.id == e.reserve) {
    if (const std::optional<fs::OpResult> r = stream_result(ev, fs::OpCode::kReserve)) {
      e.model.insert_reserved(*r);
      e.reserved += r->reserved.size();
    } else {
      e.reserve_failed = true;
    }
    e.reserve = 0;
  } else if (e.other.erase(ev.id) == 0) {
    const auto s = std::find_if(e.sealed.begin(), e.sealed.end(),
                                [&](const EpochClient::Sealed& x) { return x.request == ev.id; });
    BFT_ASSERT(s != e.sealed.end());
    s->verdict = stream_result(ev, fs::OpCode::kEpoch);
    s->failed_request = !s->verdict;
    epoch_verdicts(c);
  }
  epoch_pump(c);
}

// Verdicts are acted on in epoch order: epoch k's means something only once every epoch before it committed.
void Simulation::epoch_verdicts(ClientNode& c) {
  EpochClient& e = *c.epochs;
  while (!e.sealed.empty() && (e.sealed.front().verdict || e.sealed.front().failed_request)) {
    const EpochClient::Sealed s = e.sealed.front();
    e.sealed.pop_front();
    // A CHAIN verdict naming an epoch that descends from this one: an earlier execution of this batch applied.
    const bool applied = s.verdict && (s.verdict->verdict == fs::EpochVerdict::kApplied ||
                                       (s.verdict->verdict == fs::EpochVerdict::kChain &&
                                        e.log.descends_from(s.verdict->last_before, s.epoch)));
    if (!applied) {
      epoch_rollback(c, s);
      return;
    }
    e.log.committed(s.epoch);
    e.model.commit_through(s.epoch);
    e.output.committed.push_back(
        CommittedEpoch{s.epoch, s.request, s.verdict->verdict == fs::EpochVerdict::kChain});
    epoch_externalize(c, s.epoch);
    e.checkpoints.erase(e.checkpoints.begin(), e.checkpoints.upper_bound(s.epoch));
    ++e.stats.committed;
    event(fmt("c%u epoch %llu committed", c.id, ull(s.epoch)));
  }
}

// Epoch `failed` will never apply and every epoch before it committed: the program goes back to its checkpoint,
// the model forgets that epoch, every later one and every clean fact, and the epochs after it are discarded
// (their batches chain through it and cannot apply).
void Simulation::epoch_rollback(ClientNode& c, const EpochClient::Sealed& failed) {
  EpochClient& e = *c.epochs;
  const auto verdict = failed.verdict ? static_cast<unsigned>(failed.verdict->verdict) : 9u;
  event(fmt("c%u epoch %llu FAILED (verdict %u, entry %u): rollback, %zu later epochs discarded", c.id,
            ull(failed.epoch), verdict, failed.verdict ? failed.verdict->entry : 0u, e.sealed.size()));
  ++e.stats.rollbacks;
  e.stats.rollbacks_stopped += e.program_end ? 1 : 0;
  e.stats.failed += 1 + e.sealed.size();
  e.stats.discarded_entries += failed.entries + e.log.open_entries();
  for (const EpochClient::Sealed& later : e.sealed) {
    e.stats.discarded_entries += later.entries;
    if (!later.verdict && !later.failed_request) e.other.insert(later.request);
  }
  e.sealed.clear();
  for (const auto& [epoch, lines] : e.held) e.stats.lines_dropped += lines.size();
  e.held.clear();  // the failed epoch's lines and every later one's: the restored program prints them again
  e.log.failed(failed.epoch);
  e.model.rollback_to(e.log.last_committed());
  e.model.drop_clean();
  if (config_.sabotage_checkpoint) {
    FsWorkload knows = e.program.work;
    e.program = e.checkpoints.at(failed.epoch);
    e.program.work = std::move(knows);
  } else {
    e.program = e.checkpoints.at(failed.epoch);
  }
  e.checkpoints.clear();
  e.checkpoints.emplace(e.log.open_epoch(), e.program);
  if (e.fetch != 0) e.other.insert(e.fetch);
  e.fetch = 0;
  e.fetch_rounds = 0;
  if (e.program.pending) e.pending_entry = spec::with_time(e.program.pending->request, e.time_ns += 1000);
  e.epoch_length = epoch_length(c);
  e.consensus_only = true;  // the re-run's first epoch uses consensus values only (§10)
}

// ---- the program's output and input (sim/spec_output.h; docs/SPECULATION.md §8.6, §8.7) ----

bool Simulation::may_seal() const { return !(config_.sabotage_last_epoch && phase_ == Phase::kLiveness); }

// The program got `result` for its pending request: it reads its input for it and prints a line, which its epoch
// holds until it commits.
void Simulation::epoch_print(ClientNode& c, const fs::Result& result) {
  EpochClient& e = *c.epochs;
  OutputLine line;
  line.epoch = e.log.open_epoch();
  line.input_pos = e.program.input_pos;
  line.input = read_input(e.output.input_seed, line.input_pos);
  line.text = output_line(render_result(e.pending_entry, result), line.input);
  line.seen = program_view(spec::without_time(result));
  if (line.input_pos < e.input_high) e.stats.input_replayed += line.input.size();
  e.program.input_pos += line.input.size();
  e.input_high = std::max(e.input_high, e.program.input_pos);
  ++e.program.answered;
  if (config_.verbose) event(fmt("c%u prints (epoch %llu): %s", c.id, ull(line.epoch), line.text.c_str()));
  if (config_.sabotage_output) {
    line.step = steps();  // at once, whether or not its epoch will commit
    e.output.lines.push_back(std::move(line));
    ++e.stats.lines_externalized;
    return;
  }
  e.held[line.epoch].push_back(std::move(line));
}

// Epoch `epoch` committed: its lines go out, in order.
void Simulation::epoch_externalize(ClientNode& c, std::uint64_t epoch) {
  EpochClient& e = *c.epochs;
  const auto it = e.held.find(epoch);
  if (it == e.held.end()) return;
  BFT_ASSERT(it == e.held.begin());  // epochs commit in order, and every earlier one's lines went out
  for (OutputLine& line : it->second) {
    line.step = steps();
    e.output.lines.push_back(std::move(line));
    ++e.stats.lines_externalized;
  }
  e.held.erase(it);
}

// The liveness phase stopped the client: the program's length is what it has begun (a rollback after this makes
// it run again up to there).
void Simulation::epoch_stop(ClientNode& c) {
  EpochClient& e = *c.epochs;
  e.program_end = e.program.answered + (e.program.pending ? 1 : 0);
  event(fmt("c%u stops: its program ends after request %llu", c.id, ull(*e.program_end)));
}

// Property 15: "" once the program finished and its last epoch committed, else what it still waits on.
std::string Simulation::epoch_unfinished(const ClientNode& c) const {
  const EpochClient& e = *c.epochs;
  if (e.finished()) return "";
  std::string s = fmt("liveness under quiescence (property 15): epoch client %u has not finished: its program answered "
                      "%llu of %s requests",
                      c.id, ull(e.program.answered), e.program_end ? fmt("%llu", ull(*e.program_end)).c_str() : "its");
  if (e.program.pending) s += fmt(", waits in request %llu", ull(e.program.answered + 1));
  if (e.fetch != 0) s += fmt(" for FETCH r%llu (round %u)", ull(e.fetch), e.fetch_rounds);
  if (e.reserve != 0) s += fmt(", RESERVE r%llu in flight", ull(e.reserve));
  s += fmt("; open epoch %llu with %zu entries (seals at %u)", ull(e.log.open_epoch()), e.log.open_entries(),
           e.epoch_length);
  for (const EpochClient::Sealed& x : e.sealed) {
    s += fmt("; sealed epoch %llu as r%llu, %s", ull(x.epoch), ull(x.request),
             x.verdict ? "verdict in, waiting for an earlier one" : (x.failed_request ? "failed" : "no verdict yet"));
  }
  return s + fmt("; last committed epoch %llu; %zu requests in flight", ull(e.log.last_committed()), c.in_flight());
}

// Property 14 at the end of the seed: what each epoch client externalized against the serial replay.
void Simulation::check_epoch_output() {
  const EpochReplay* replay = fs_check_ ? fs_check_->replay() : nullptr;
  for (const auto& c : clients_) {
    if (!c->epochs) continue;
    BFT_ASSERT(replay != nullptr);
    const ProgramOutput& out = c->epochs->output;
    const NodeId id = c->id;
    const RequestFacts facts{[this, id](std::uint64_t rid) { return checker_->agreed_seq(id, rid); },
                             [this, id](std::uint64_t rid) { return checker_->completion_step(id, rid); }};
    const std::vector<AppliedEpoch> applied = replay->applied(id, out.stream);
    if (std::string why = check_serial_output(out, applied, facts); !why.empty()) fail(why);
    if (std::string why = check_serial_program(out, applied); !why.empty()) fail(why);
  }
}

}  // namespace bftfs::sim
