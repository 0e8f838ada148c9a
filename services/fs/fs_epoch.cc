// EPOCH (see fs_service_impl.h and docs/SPECULATION.md §5.4): the only place where a speculating tree's changes
// are applied. The chain check, then the staged parts, then every entry in order with one undo mark; an EPOCH
// that does not apply changes nothing (its staged parts stay until a later STAGE or STREAM_CLOSE).
#include <utility>

#include "common/assert.h"
#include "common/crypto.h"
#include "services/fs/fs_service_impl.h"

namespace bftfs::fs {

std::uint32_t FsService::Impl::op_epoch(const Op& op, OpResult& out) {
  const StreamId sid{cur_client, op.stream};
  StreamRec rec;
  const bool exists = load_stream(sid, rec);
  out.last_before = rec.last;
  if (rec.last != op.prev) {
    out.verdict = EpochVerdict::kChain;
    return err::kOk;
  }
  std::vector<Entry> staged;
  if (!collect_staged(op, sid, exists, rec, staged)) {
    out.verdict = EpochVerdict::kStaging;
    return err::kOk;
  }
  std::vector<const Entry*> entries;
  entries.reserve(staged.size() + op.entries.size());
  for (const Entry& e : staged) entries.push_back(&e);
  for (const Entry& e : op.entries) entries.push_back(&e);
  if (!run_epoch_entries(entries, sid, out)) return err::kOk;  // kEntry: nothing changed
  // Applied. A 65th stream of the client fails the whole op instead (ENOSPC: run_ops undoes the entries).
  const std::uint32_t e = check_stream_room(sid, exists, true);
  if (e != err::kOk) return e;
  rec.last = op.epoch;
  if (rec.staging_epoch <= op.epoch) erase_staged(sid, rec);  // parts of a later epoch are kept for it
  rec.last_seq = cur_seq;
  save_stream(sid, rec);
  out.verdict = EpochVerdict::kApplied;
  return err::kOk;
}

bool FsService::Impl::collect_staged(const Op& op, const StreamId& sid, bool exists, const StreamRec& rec,
                                     std::vector<Entry>& out) const {
  if (op.parts == 0) return true;
  if (!exists || rec.staging_epoch != op.epoch) return false;
  std::vector<Bytes> parts;
  parts.reserve(op.parts);
  DigestBuilder digest;
  for (std::uint32_t p = 0; p < op.parts; ++p) {
    parts.push_back(read_part(sid, p));
    if (parts.back().empty()) return false;  // not staged (or erased by a later epoch's STAGE)
    digest.add(parts.back());
  }
  if (digest.finish() != op.parts_digest) return false;
  for (const Bytes& part : parts) {
    std::vector<Entry> entries;
    const FsDecodeError de = decode_entries(part, entries);
    BFT_ASSERT(de == FsDecodeError::kOk);  // STAGE stored only entries it decoded
    if (out.size() + entries.size() + op.entries.size() > kEntriesMax) return false;
    for (Entry& entry : entries) out.push_back(std::move(entry));
  }
  return true;
}

bool FsService::Impl::run_epoch_entries(const std::vector<const Entry*>& entries, const StreamId& sid,
                                        OpResult& out) {
  const std::size_t mark = undo.size();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Result actual = run_as_entry(entries[i]->request, sid);
    if (entry_matches(*entries[i], actual)) continue;
    restore_to(mark);
    out.verdict = EpochVerdict::kEntry;
    out.entry = static_cast<std::uint32_t>(i);
    out.entry_outcome = actual.outcome;
    if (actual.outcome != Outcome::kDone) {
      // What the replicas returned for the op that stopped it: the consensus value for the tree's re-run.
      out.entry_stop = actual.stop;
      out.entry_err = actual.results[actual.stop].err;
      out.entry_result.push_back(actual.results[actual.stop]);
    }
    return false;
  }
  return true;
}

}  // namespace bftfs::fs
