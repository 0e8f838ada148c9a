// libFuzzer target for decode_record (write-ahead log records).
// Invariants: no crash; an accepted record is the canonical encoding of what it decoded to, and decoding the
// re-encoding gives an equal record.
#include <cstdint>
#include <span>

#include "fuzz/fuzz_common.h"
#include "protocol/effects.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  const std::span<const std::uint8_t> input(data, size);
  PersistRecord r;
  if (!decode_record(input, r)) return 0;
  const Bytes again = encode_record(r);
  if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
    fuzz::fail("accepted record is not the canonical encoding of its record");
  }
  PersistRecord r2;
  if (!decode_record(again, r2)) fuzz::fail("re-encoded record rejected");
  if (!(r2 == r)) fuzz::fail("re-decoded record differs");
  return 0;
}
