// libFuzzer target for the body decoder of one message type (compiled once per MsgType with -DFUZZ_TYPE=N).
// Invariants: decode_body never crashes; a body it accepts is the canonical encoding of what it decoded to
// (encode_body gives the same bytes back), and decoding that again gives an equal message.
#include <cstdint>
#include <span>

#include "fuzz/fuzz_common.h"
#include "protocol/wire.h"

#ifndef FUZZ_TYPE
#error "FUZZ_TYPE must name the MsgType value of this target"
#endif

namespace {
constexpr auto kType = static_cast<bftfs::MsgType>(FUZZ_TYPE);
static_assert(FUZZ_TYPE >= 1 && FUZZ_TYPE <= static_cast<int>(bftfs::MsgType::kStateLeaf));
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  const std::span<const std::uint8_t> input(data, size);
  Message m;
  if (decode_body(kType, input, fuzz::kReplicas, m) != Reject::kNone) return 0;
  if (type_of(m) != kType) fuzz::fail("decoded message has another type");
  const Bytes again = encode_body(m);
  if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
    fuzz::fail("accepted body is not the canonical encoding of its message");
  }
  Message m2;
  if (decode_body(kType, again, fuzz::kReplicas, m2) != Reject::kNone) fuzz::fail("re-encoded body rejected");
  if (!(m2 == m)) fuzz::fail("re-decoded message differs");
  return 0;
}
