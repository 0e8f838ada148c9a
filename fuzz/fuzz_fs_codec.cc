// libFuzzer target for the file service's decoders (services/fs/fs_codec.h, services/fs/object_store.h): the
// compound request (a client's bytes), the result (what a client decodes from replicas), a staged part's
// entries (what EPOCH reads back), and a partition's bytes (what state transfer installs). Invariants: no
// decoder crashes; an accepted request, result or part is the canonical encoding of what it decoded to; an
// accepted request's worst-case result fits kFsResultBytesMax; an accepted partition re-encodes to the same
// bytes and every object hashes into it.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "services/fs/fs_codec.h"
#include "services/fs/object_store.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  using namespace bftfs::fs;
  const std::span<const std::uint8_t> input(data, size);

  fs::Request req;
  if (decode_request(input, req) == FsDecodeError::kOk) {
    const Bytes again = encode_request(req);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted fs request is not the canonical encoding of its ops");
    }
    std::size_t worst = 3;
    for (const Op& op : req.ops) worst += worst_case_result_bytes(op);
    if (worst > kFsResultBytesMax) fuzz::fail("accepted fs request whose result could exceed the bound");
  }

  fs::Result res;
  if (decode_result(input, res) == FsDecodeError::kOk) {
    const Bytes again = encode_result(res);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted fs result is not the canonical encoding of its results");
    }
  }

  std::vector<Entry> entries;
  if (decode_entries(input, entries) == FsDecodeError::kOk) {
    const Bytes again = encode_entries(entries);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted staged part is not the canonical encoding of its entries");
    }
  }

  // A partition of a small store (P = 4): decode, load into a store, re-encode.
  constexpr std::uint64_t kPartitions = 4;
  for (std::uint64_t p = 0; p < kPartitions; ++p) {
    std::vector<std::pair<ObjectKey, Value>> objects;
    const auto any_value = [](const ObjectKey&, const Bytes&) { return true; };
    if (!decode_partition(input, p, kPartitions, any_value, objects).empty()) continue;
    MemoryObjectStore store(kPartitions);
    store.replace_partition(p, objects);
    const Bytes again = encode_partition(store, p);
    if (!std::equal(again.begin(), again.end(), input.begin(), input.end())) {
      fuzz::fail("accepted partition is not canonical");
    }
  }
  return 0;
}
