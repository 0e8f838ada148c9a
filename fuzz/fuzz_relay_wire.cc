// libFuzzer target for the relay socket protocol (relay/relay_wire.h): a frame body decoded in both directions
// (the relay decodes what a mount sends; a mount decodes what the relay sends), and the input as a byte stream
// through FrameSplitter fed in uneven pieces. Invariants: no decoder crashes; an accepted body re-encodes to
// exactly the input (canonical); the splitter yields the same bodies however the stream is cut, and never a
// body its length check would reject.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "relay/relay_wire.h"

namespace {

using namespace bftfs;
using namespace bftfs::relay;

bool same_as_body(const Bytes& frame, std::span<const std::uint8_t> body) {
  if (frame.size() != body.size() + kFrameLengthBytes) return false;
  return std::equal(frame.begin() + kFrameLengthBytes, frame.end(), body.begin(), body.end());
}

// Splits `input` as a stream, appending `piece` bytes at a time; returns the bodies and whether it broke.
std::vector<Bytes> split(std::span<const std::uint8_t> input, std::size_t piece, bool& broken) {
  FrameSplitter s;
  std::vector<Bytes> bodies;
  broken = false;
  for (std::size_t off = 0; off < input.size() && !broken; off += piece) {
    s.append(input.subspan(off, std::min(piece, input.size() - off)));
    for (;;) {
      Bytes body;
      RelayWireError why = RelayWireError::kOk;
      const auto next = s.next(body, why);
      if (next == FrameSplitter::Next::kNeedMore) break;
      if (next == FrameSplitter::Next::kBroken) {
        if (why == RelayWireError::kOk) fuzz::fail("splitter broke without a reason");
        broken = true;
        break;
      }
      if (check_frame_length(static_cast<std::uint32_t>(body.size())) != RelayWireError::kOk) {
        fuzz::fail("splitter yielded a body of a bad length");
      }
      bodies.push_back(std::move(body));
    }
  }
  return bodies;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> input(data, size);

  MountMsg m;
  if (decode_mount_body(input, m) == RelayWireError::kOk) {
    if (!same_as_body(encode_relay_frame(m), input)) fuzz::fail("accepted mount frame is not canonical");
  }
  RelayMsg r;
  if (decode_relay_body(input, r) == RelayWireError::kOk) {
    if (!same_as_body(encode_relay_frame(r), input)) fuzz::fail("accepted relay frame is not canonical");
  }

  bool broken_whole = false;
  bool broken_bytes = false;
  const auto whole = split(input, std::max<std::size_t>(size, 1), broken_whole);
  const auto bytewise = split(input, 1 + size % 7, broken_bytes);
  if (whole != bytewise) fuzz::fail("splitter depends on how the stream is cut");
  if (broken_whole != broken_bytes) fuzz::fail("splitter breaks depending on how the stream is cut");
  return 0;
}
