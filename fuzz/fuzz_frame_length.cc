// libFuzzer target for frame_length (the stream reader's first look at untrusted bytes).
// Invariants: no crash; a result is 0 exactly when a reason is given; a length is within the frame limits and
// equals the header's body size plus the overhead; and frame_length agrees with decode_frame on the header
// checks they share (a header frame_length refuses is never accepted by decode_frame).
#include <cstdint>
#include <span>

#include "common/codec.h"
#include "fuzz/fuzz_common.h"
#include "protocol/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  const std::span<const std::uint8_t> input(data, size);
  Reject why = Reject::kNone;
  const std::size_t n = frame_length(input, why);
  if ((n == 0) != (why != Reject::kNone)) fuzz::fail("frame_length: result and reason disagree");
  if (size < kHeaderBytes && why != Reject::kTooShort) fuzz::fail("frame_length: short header not refused");
  if (n != 0) {
    if (n < kFrameOverheadBytes || n > kFrameBytesMax) fuzz::fail("frame_length: length out of range");
    if (n != kFrameOverheadBytes + load_u32_le(data + 32)) fuzz::fail("frame_length: length is not the header's");
  } else if (size >= kFrameOverheadBytes) {
    const Decoded d = decode_frame(input, fuzz::kReplicas, fuzz::cluster().at(0));
    if (d.ok()) fuzz::fail("decode_frame accepted a header that frame_length refused");
  }
  return 0;
}
