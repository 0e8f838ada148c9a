// libFuzzer target for the shim's request envelope (shim/envelope.h), which carries bytes a client chose.
// Invariants: decode_request never crashes; the copying and the zero-copy forms agree on every input; an
// accepted envelope is the canonical encoding of what it decoded to (encode_request gives the same bytes back),
// and decoding that again gives an equal request. decode_result is fuzzed on the same bytes: an accepted result
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
  if (decode_result(input, res)) {
    const Bytes again = encode_result(res.status, res.inner);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted result is not the canonical encoding of its result");
    }
  }

  ShimRequest r;
  const DecodeError e = decode_request(input, r);
  std::vector<Dependency> deps;
  std::span<const std::uint8_t> op;
  if (decode_request(input, deps, op) != e) fuzz::fail("the two decode_request forms disagree");
  if (e != DecodeError::kOk) {
    if (!op.empty()) fuzz::fail("a rejected envelope left an op view");
    return 0;
  }
  if (r.deps.size() > kDependenciesMax) fuzz::fail("accepted more than kDependenciesMax dependencies");
  if (deps != r.deps) fuzz::fail("the zero-copy form decoded other dependencies");
  if (!std::equal(op.begin(), op.end(), r.op.begin(), r.op.end())) fuzz::fail("the zero-copy form viewed another op");
  const Bytes again = encode_request(r);
  if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
    fuzz::fail("accepted envelope is not the canonical encoding of its request");
  }
  ShimRequest r2;
  if (decode_request(again, r2) != DecodeError::kOk) fuzz::fail("re-encoded envelope rejected");
  if (!(r2 == r)) fuzz::fail("re-decoded envelope differs");
  return 0;
}
