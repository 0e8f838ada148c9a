// libFuzzer target for the supervisor-daemon control protocol (spec/control_wire.h): a frame body decoded in
// both directions (the daemon decodes what the supervisor sends and the other way round), and the input as a
// byte stream through ControlFrameSplitter fed in uneven pieces. Invariants: no decoder crashes; an accepted body
// re-encodes to exactly the input (canonical); the splitter yields the same bodies however the stream is cut,
// and never a body its length check would reject.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "spec/control_wire.h"

namespace {

using namespace bftfs;
using namespace bftfs::spec;

bool same_as_body(const Bytes& frame, std::span<const std::uint8_t> body) {
  if (frame.size() != body.size() + kControlLengthBytes) return false;
  return std::equal(frame.begin() + kControlLengthBytes, frame.end(), body.begin(), body.end());
}

// Splits `input` as a stream, appending `piece` bytes at a time; returns the bodies and whether it broke.
std::vector<Bytes> split(std::span<const std::uint8_t> input, std::size_t piece, bool& broken) {
  ControlFrameSplitter s;
  std::vector<Bytes> bodies;
  broken = false;
  for (std::size_t off = 0; off < input.size() && !broken; off += piece) {
    s.append(input.subspan(off, std::min(piece, input.size() - off)));
    for (;;) {
      Bytes body;
      ControlWireError why = ControlWireError::kOk;
      const auto step = s.next(body, why);
      if (step == ControlFrameSplitter::Step::kNeedMore) break;
      if (step == ControlFrameSplitter::Step::kBroken) {
        if (why == ControlWireError::kOk) fuzz::fail("splitter broke without a reason");
        broken = true;
        break;
      }
      if (check_control_length(static_cast<std::uint32_t>(body.size())) != ControlWireError::kOk) {
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

  SupervisorMsg m;
  if (decode_supervisor_body(input, m) == ControlWireError::kOk) {
    if (!same_as_body(encode_control_frame(m), input)) fuzz::fail("accepted supervisor frame is not canonical");
  }
  DaemonMsg d;
  if (decode_daemon_body(input, d) == ControlWireError::kOk) {
    if (!same_as_body(encode_control_frame(d), input)) fuzz::fail("accepted daemon frame is not canonical");
  }

  bool broken_whole = false;
  bool broken_bytes = false;
  const auto whole = split(input, std::max<std::size_t>(size, 1), broken_whole);
  const auto bytewise = split(input, 1 + size % 7, broken_bytes);
  if (whole != bytewise) fuzz::fail("splitter depends on how the stream is cut");
  if (broken_whole != broken_bytes) fuzz::fail("splitter breaks depending on how the stream is cut");
  return 0;
}
