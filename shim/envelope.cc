// The PBFT-CS predicated-request envelope (NSDI'09 §3.2, §5). See envelope.h for the wire form.
//
// decode_envelope reads bytes a client chose: every field is checked before it is used, with one check per
// line and a reason of its own, and the reader never allocates more than the input backs (the dependency
// count is bounded by kDependenciesMax and then checked against the bytes that remain).
#include "shim/envelope.h"

#include "common/assert.h"
#include "common/codec.h"

namespace bftfs::shim {

std::string_view to_string(ShimStatus s) {
  switch (s) {
    case ShimStatus::kExecuted:
      return "executed";
    case ShimStatus::kRetryPredicateFailed:
      return "retry-predicate-failed";
    case ShimStatus::kRetryDependencyUnknown:
      return "retry-dependency-unknown";
    case ShimStatus::kMalformed:
      return "malformed";
  }
  return "unknown-status";
}

std::string_view to_string(EnvelopeError e) {
  switch (e) {
    case EnvelopeError::kOk:
      return "ok";
    case EnvelopeError::kTooShort:
      return "shorter than the request header";
    case EnvelopeError::kBadVersion:
      return "unknown envelope version";
    case EnvelopeError::kBadFlags:
      return "nonzero flags";
    case EnvelopeError::kTooManyDependencies:
      return "more than kDependenciesMax dependencies";
    case EnvelopeError::kTruncatedDependencies:
      return "dependency list runs past the end";
  }
  return "unknown-error";
}

Bytes encode_envelope(const ShimRequest& r) { return encode_envelope(r.deps, r.op); }

Bytes encode_envelope(std::span<const Dependency> deps, std::span<const std::uint8_t> op) {
  BFT_ASSERT(deps.size() <= kDependenciesMax);
  Bytes out;
  ByteWriter w(out);
  w.reserve(kRequestHeaderBytes + deps.size() * kDependencyBytes + op.size());
  w.u8(kEnvelopeVersion);
  w.u8(0);  // flags
  w.u16(static_cast<std::uint16_t>(deps.size()));
  for (const Dependency& d : deps) {
    w.u64(d.request_id);
    w.digest(d.result_digest);
  }
  w.bytes(op);
  BFT_ASSERT(out.size() == kRequestHeaderBytes + deps.size() * kDependencyBytes + op.size());
  return out;
}

EnvelopeError decode_envelope(std::span<const std::uint8_t> bytes, std::vector<Dependency>& deps,
                           std::span<const std::uint8_t>& op) {
  deps.clear();
  op = {};
  if (bytes.size() < kRequestHeaderBytes) return EnvelopeError::kTooShort;
  ByteReader r(bytes);
  std::uint8_t version = 0;
  std::uint8_t flags = 0;
  std::uint16_t dep_count = 0;
  const bool header_read = r.u8(version) && r.u8(flags) && r.u16(dep_count);
  BFT_ASSERT(header_read);  // the size check above covers the header
  if (version != kEnvelopeVersion) return EnvelopeError::kBadVersion;
  if (flags != 0) return EnvelopeError::kBadFlags;
  if (dep_count > kDependenciesMax) return EnvelopeError::kTooManyDependencies;
  if (r.remaining() < static_cast<std::size_t>(dep_count) * kDependencyBytes) {
    return EnvelopeError::kTruncatedDependencies;
  }
  deps.resize(dep_count);
  for (Dependency& d : deps) {
    const bool dep_read = r.u64(d.request_id) && r.digest(d.result_digest);
    BFT_ASSERT(dep_read);  // the length check above covers every dependency
  }
  const bool op_read = r.view(r.remaining(), op);
  BFT_ASSERT(op_read);
  BFT_ASSERT(r.done());
  return EnvelopeError::kOk;
}

EnvelopeError decode_envelope(std::span<const std::uint8_t> bytes, ShimRequest& out) {
  std::span<const std::uint8_t> op;
  const EnvelopeError e = decode_envelope(bytes, out.deps, op);
  if (e != EnvelopeError::kOk) return e;
  out.op.assign(op.begin(), op.end());
  return EnvelopeError::kOk;
}

Bytes encode_envelope_result(ShimStatus status, std::span<const std::uint8_t> inner) {
  BFT_ASSERT(static_cast<std::uint8_t>(status) <= kShimStatusMax);
  BFT_ASSERT(status == ShimStatus::kExecuted || inner.empty());  // a no-op has no inner result
  Bytes out;
  out.reserve(kResultHeaderBytes + inner.size());
  out.push_back(static_cast<std::uint8_t>(status));
  out.insert(out.end(), inner.begin(), inner.end());
  return out;
}

bool decode_envelope_result(std::span<const std::uint8_t> bytes, ShimResult& out) {
  if (bytes.size() < kResultHeaderBytes) return false;
  if (bytes[0] > kShimStatusMax) return false;
  const auto status = static_cast<ShimStatus>(bytes[0]);
  // Only an executed request carries an inner result; every no-op status (retries, malformed) is one byte.
  if (status != ShimStatus::kExecuted && bytes.size() != kResultHeaderBytes) return false;
  out.status = status;
  out.inner.assign(bytes.begin() + kResultHeaderBytes, bytes.end());
  return true;
}

}  // namespace bftfs::shim
