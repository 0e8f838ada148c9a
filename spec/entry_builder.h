// From a tree's request to the entry its epoch's log records (docs/SPECULATION.md §6.4, §6.6): the TIME op the
// backend puts first, the handler's view of the result without it, and the expectations and digest predicates
// that make the replicas' replay check exactly what the tree was told.
//
// Pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "services/fs/fs_codec.h"

namespace bftfs::spec {

// The entry request of a handler's request: TIME `time_ns` as op 0, then the request's ops with every result
// reference moved past the TIME op. Precondition: the request has at most kCompoundOpsMax - 1 ops, all on files.
fs::Request with_time(const fs::Request& request, std::uint64_t time_ns);

// The handler's view of the result of an entry request: the result without TIME's, its stop moved back.
// Precondition: an entry request's result that did not stop at op 0 (TIME never fails).
fs::Result without_time(const fs::Result& result);

// The entry for `request` (an entry request) that the model executed with `model_result`: the expectation is
// the model's outcome, stop and errno; when every op passed, each op without a predicate of its own, or whose own
// predicate is "errno 0" (success, which says nothing of the bytes or attributes the tree saw), expects the
// digest of the model's result for it, except TIME and the ops whose result the tree never sees beyond
// success (WRITE, REMOVE, RMDIR, RENAME: the expected outcome already says they succeeded). A request that
// stopped gets no predicates: the tree was told only op #stop's errno, and the ops before it are undone either
// way.
fs::Entry build_entry(const fs::Request& request, const fs::Result& model_result);

// An op of stream `stream` (RESERVE, FETCH, STAGE, EPOCH: §5.1), for epoch `epoch` where it has one.
fs::Op stream_op(fs::OpCode code, std::uint64_t stream, std::uint64_t epoch = 0);

// The FETCH of stream `stream` for entry request `entry`, which the model could not finish: with `trace`, the
// facts `entry` reads (trace mode); else the keys `missing` names, at most kFetchKeysMax (keys mode, §5.7).
// `missing` empty always traces.
fs::Request fetch_request(std::uint64_t stream, const fs::Request& entry, const std::vector<fs::ObjectKey>& missing,
                          bool trace);

}  // namespace bftfs::spec
