// libFuzzer target for the shim's request envelope (shim/envelope.h), which carries bytes a client chose.
// Invariants: decode_envelope never crashes; the copying and the zero-copy forms agree on every input; an
// accepted envelope is the canonical encoding of what it decoded to (encode_envelope gives the same bytes back),
// and decoding that again gives an equal request. decode_envelope_result is fuzzed on the same bytes: an accepted result
// re-encodes to them.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "shim/envelope.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  using namespace bftfs::shim;
  const std::span<const std::uint8_t> input(data, size);

  ShimResult res;
  if (decode_envelope_result(input, res)) {
    const Bytes again = encode_envelope_result(res.status, res.inner);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted result is not the canonical encoding of its result");
    }
  }

  ShimRequest r;
  const EnvelopeError e = decode_envelope(input, r);
  std::vector<Dependency> deps;
  std::span<const std::uint8_t> op;
  if (decode_envelope(input, deps, op) != e) fuzz::fail("the two decode_envelope forms disagree");
  if (e != EnvelopeError::kOk) {
    if (!op.empty()) fuzz::fail("a rejected envelope left an op view");
    return 0;
  }
  if (r.deps.size() > kDependenciesMax) fuzz::fail("accepted more than kDependenciesMax dependencies");
  if (deps != r.deps) fuzz::fail("the zero-copy form decoded other dependencies");
  if (!std::equal(op.begin(), op.end(), r.op.begin(), r.op.end())) fuzz::fail("the zero-copy form viewed another op");
  const Bytes again = encode_envelope(r);
  if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
    fuzz::fail("accepted envelope is not the canonical encoding of its request");
  }
  ShimRequest r2;
  if (decode_envelope(again, r2) != EnvelopeError::kOk) fuzz::fail("re-encoded envelope rejected");
  if (!(r2 == r)) fuzz::fail("re-decoded envelope differs");
  return 0;
}
