// The simulator's checks of the file service's speculation ops (docs/SPECULATION.md §14, checker properties 11
// to 13), kept apart from the service's own code so that a bug there cannot hide itself:
//
//   11. Predicates hold where applied: an EPOCH whose verdict is APPLIED gave every one of its entries the outcome,
//       stop and errno the entry expects, and every op of a done entry the result its errno or digest predicate
//       names. EpochReplay checks it on the agreed history (every execution a correct replica recorded, handed
//       over in seq order by sim/fs_check.h): on a replica of its own it runs each entry of the EPOCH, staged ones
//       first, at the EPOCH's place, compares the results with the expectations itself (not with
//       fs::entry_matches), undoes them, and then lets the EPOCH execute. The verdict it computes (chain, staged
//       parts and their digest from the STAGE executions it saw, then the first entry that does not match) must
//       be the one the correct replicas recorded, in both directions: an EPOCH that applies although an entry's predicate is false is a
//       violation, and so is one that fails although every entry held.
//   12. All or nothing: StreamOpAudit sits under the shim of every replica and digests the service's objects
//       around each execution of EPOCH and STAGE (tentative and early ones included): an EPOCH that does not apply
//       changes no object at all, and neither kind changes an object outside the stream kinds (kStream ..
//       kStaged) unless the EPOCH applied.
//   13. Chain: per stream (client, stream id), the applied EPOCHs form one chain: each names as prev the epoch
//       applied last (0 for the first), epochs increase, and no two name the same prev (EpochReplay).
//
// Pure bookkeeping over FsService: no I/O, no clocks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "protocol/forwarding_service.h"
#include "protocol/service.h"
#include "services/fs/fs_codec.h"
#include "services/fs/fs_service.h"
#include "sim/recording_service.h"

namespace bftfs::sim {

// Counts of what the speculation checks saw (plain data).
struct SpecAuditStats {
  std::uint64_t stages = 0;            // STAGE executions in the agreed history (that reached the service)
  std::uint64_t stages_stored = 0;     // ... that stored their part
  std::uint64_t epochs = 0;            // EPOCH executions in the agreed history
  std::uint64_t epochs_applied = 0;    // ... APPLIED, every entry replayed and checked (property 11)
  std::uint64_t epochs_chain = 0;      // ... CHAIN (a discarded epoch's batch, or a resubmission)
  std::uint64_t epochs_staging = 0;    // ... STAGING
  std::uint64_t epochs_entry = 0;      // ... ENTRY: an entry's predicate was false where the batch executed
  std::uint64_t entries_replayed = 0;  // entries run by the independent replay
  std::uint64_t entries_staged = 0;    // ... of them from staged parts
  std::uint64_t reserves = 0;          // RESERVE executions in the agreed history
  std::uint64_t fetches = 0;           // FETCH executions in the agreed history
  void add(const SpecAuditStats& o);
};

// An EPOCH that applied in the agreed history, with what its entries gave where it applied: the serial
// execution that checker property 14 compares an epoch client's output with (sim/spec_output.h).
struct AppliedEpoch {
  NodeId client = 0;
  std::uint64_t stream = 0;
  std::uint64_t epoch = 0;
  std::uint64_t seq = 0;
  std::uint64_t request_id = 0;     // the EPOCH request's
  std::vector<fs::Entry> entries;   // staged ones first, as the EPOCH runs them
  std::vector<fs::Result> results;  // the replay's result of each entry, in order
};

// Property 12 at one replica: a pass-through Service over the file service that digests its objects around every
// execution of a request holding STAGE or EPOCH. Every other call forwards.
class StreamOpAudit final : public ForwardingService {
 public:
  // `inner` is the service the calls go to (the file service, or a decorator of it); `fs` the file service
  // itself, whose objects are digested. Both must outlive this object.
  StreamOpAudit(Service& inner, const fs::FsService& fs) : ForwardingService(inner), fs_(fs) {}

  Bytes execute(const ExecContext& ctx, std::span<const std::uint8_t> op) override;

  // The first breach of property 12 ("" if none).
  const std::string& violation() const { return violation_; }
  std::uint64_t audited() const { return audited_; }  // STAGE and EPOCH executions digested

 private:
  const fs::FsService& fs_;
  std::string violation_;
  std::uint64_t audited_ = 0;
};

// Properties 11 and 13 on the agreed history: a replica of its own (FsService in memory, the replicas' options)
// that executes every agreed execution that reached the file service, and replays each EPOCH's entries before it.
class EpochReplay {
 public:
  explicit EpochReplay(const fs::FsOptions& options);
  ~EpochReplay();
  EpochReplay(const EpochReplay&) = delete;
  EpochReplay& operator=(const EpochReplay&) = delete;

  // The next agreed execution (in seq order, then place in its batch), as a correct replica recorded it (op and
  // result kept whole). Reports a violation at once; after one, does nothing.
  void on_execution(const ExecRecord& rec);

  bool failed() const { return !violation_.empty(); }
  const std::string& violation() const { return violation_; }
  const SpecAuditStats& stats() const { return stats_; }
  // The applied EPOCHs of stream (client, stream id) so far, in agreed order (property 14).
  std::vector<AppliedEpoch> applied(NodeId client, std::uint64_t stream) const;

 private:
  using StreamKey = std::pair<NodeId, std::uint64_t>;  // (client, stream id)
  struct Staging {  // what the stream's STAGEs left, as §5.5 says they are kept
    std::uint64_t epoch = 0;
    std::map<std::uint32_t, Bytes> parts;  // part number -> its bytes (u32 n || n * Entry)
  };
  struct Expected {  // the verdict the replay computes
    fs::EpochVerdict verdict = fs::EpochVerdict::kApplied;
    std::uint32_t entry = 0;  // kEntry: the first entry that did not match
    std::string why;          // what did not match, for the report
    std::vector<fs::Entry> entries;   // kApplied: the entries replayed ...
    std::vector<fs::Result> results;  // ... and what each gave
  };

  void on_fs_request(const ExecRecord& rec, const fs::Request& request, std::span<const std::uint8_t> inner_op);
  Expected replay_epoch(const ExecRecord& rec, const fs::Op& op);
  // Gathers the entries an EPOCH executes (staged ones first); false when its staged parts are not all there.
  bool entries_of(const StreamKey& key, const fs::Op& op, std::vector<fs::Entry>& out) const;
  void after_epoch(const ExecRecord& rec, const fs::Op& op, const fs::OpResult& actual, const Expected& expected);
  void after_stage(const StreamKey& key, const fs::Op& op, const fs::OpResult& actual);
  void fail(std::string what);

  std::unique_ptr<fs::FsService> service_;
  std::map<StreamKey, std::uint64_t> last_applied_;           // per stream: its last applied epoch
  std::map<StreamKey, std::set<std::uint64_t>> prevs_used_;   // per stream: the prevs of its applied EPOCHs
  std::map<StreamKey, Staging> staging_;
  std::map<StreamKey, std::vector<AppliedEpoch>> applied_;
  std::uint64_t committed_ = 0;  // the service's undo is committed through this seq
  std::string violation_;
  SpecAuditStats stats_;
};

// One entry's result against its expectation, compared here rather than by fs::entry_matches: "" if the entry
// gave the outcome, stop and errno (op #stop's, for kPredicateFailed too) it expects and, when done, every op with a
// predicate the errno or result digest it names; else what differs.
std::string entry_mismatch(const fs::Entry& entry, const fs::Result& actual);

}  // namespace bftfs::sim
