// The PBFT-CS predicated request (Wester et al., NSDI'09 §3.2 "predicated writes", §5 "shim layer"): what a
// speculating client puts in Request::op when the replicas run the shim (shim/shim.h) in front of a service.
//
// A request names the client's own earlier requests whose results it relied on, with the result digests it
// predicted ({c, <t_i, d_i>...} of §3.2; c is the authenticated client of the request, so it is not encoded).
// The shim executes the inner operation only if, for every dependency, its per-client log holds request t_i
// with result digest d_i; otherwise it executes nothing and returns a retry result. Dependencies need only be
// direct: a request that was turned into a no-op logged its retry result, so anything that predicted its
// success fails in turn (the failure propagates through the log, not through the dependency lists).
//
// Wire form (little-endian), validated like network input by decode_envelope (it comes from a client):
//   request:  u8 version (=1) | u8 flags (=0) | u16 dep_count (<= kDependenciesMax)
//             | dep_count x ( u64 request_id | 32-byte result digest ) | inner op (all remaining bytes)
//   result:   u8 status (ShimStatus) | inner result (all remaining bytes; empty unless kExecuted)
// The result digest a dependency names is digest_of(the whole encoded result), i.e. Reply::result_digest of
// the reply that carried it: the client predicts exactly the bytes the replicas return.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace bftfs::shim {

inline constexpr std::uint8_t kEnvelopeVersion = 1;
inline constexpr std::uint32_t kDependenciesMax = 256;
inline constexpr std::size_t kRequestHeaderBytes = 4;
inline constexpr std::size_t kDependencyBytes = 8 + kDigestBytes;
inline constexpr std::size_t kResultHeaderBytes = 1;

struct Dependency {
  std::uint64_t request_id = 0;  // t_i: an earlier request of the same client
  Digest result_digest;          // d_i: the digest of the result the client predicted for it
  friend bool operator==(const Dependency&, const Dependency&) = default;
};

struct ShimRequest {
  std::vector<Dependency> deps;  // at most kDependenciesMax
  Bytes op;                      // the inner service's operation
  friend bool operator==(const ShimRequest&, const ShimRequest&) = default;
};

enum class ShimStatus : std::uint8_t {
  kExecuted = 0,              // every predicate held; the inner result follows
  kRetryPredicateFailed = 1,  // a dependency's logged digest differs from the prediction: a no-op
  kRetryDependencyUnknown = 2,  // a dependency is not in the log (truncated, never executed, or a read-only
                                // optimized reply, whose digest is never logged: NSDI'09 §3.3): a no-op
  kMalformed = 3,             // the op is not a valid envelope: a no-op
};
inline constexpr std::uint8_t kShimStatusMax = 3;
std::string_view to_string(ShimStatus s);
// True for the statuses that mean "nothing was executed, resubmit once the dependencies committed".
inline bool is_retry(ShimStatus s) {
  return s == ShimStatus::kRetryPredicateFailed || s == ShimStatus::kRetryDependencyUnknown;
}

struct ShimResult {
  ShimStatus status = ShimStatus::kExecuted;
  Bytes inner;  // the inner service's result when kExecuted, else empty
  friend bool operator==(const ShimResult&, const ShimResult&) = default;
};

// Precondition (asserted): deps.size() <= kDependenciesMax.
Bytes encode_envelope(const ShimRequest& r);
Bytes encode_envelope(std::span<const Dependency> deps, std::span<const std::uint8_t> op);

enum class EnvelopeError : std::uint8_t {
  kOk = 0,
  kTooShort,
  kBadVersion,
  kBadFlags,
  kTooManyDependencies,
  kTruncatedDependencies,
};
std::string_view to_string(EnvelopeError e);
// Never fails on any input other than by returning an error; `out` is unspecified on error.
EnvelopeError decode_envelope(std::span<const std::uint8_t> bytes, ShimRequest& out);
// The same checks without copying the inner op: on kOk, `op` views the inner op inside `bytes` (valid as long as
// `bytes` is). On error `deps` is unspecified and `op` is empty. What the shim uses on the execution path, where
// the inner op may be up to kOpBytesMax.
EnvelopeError decode_envelope(std::span<const std::uint8_t> bytes, std::vector<Dependency>& deps,
                           std::span<const std::uint8_t>& op);

Bytes encode_envelope_result(ShimStatus status, std::span<const std::uint8_t> inner);
// False when the bytes are not a result envelope (empty, unknown status, or bytes after a retry status).
bool decode_envelope_result(std::span<const std::uint8_t> bytes, ShimResult& out);

}  // namespace bftfs::shim
