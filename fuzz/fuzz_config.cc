// libFuzzer target for parse_cluster (cluster.conf text).
// Invariants: no crash; an error has the "name:line: reason" form; an accepted configuration is consistent
// (n = 3f+1 replicas, clients >= n and increasing, a public key for every node), and format_cluster of it
// parses back to an equal configuration and formats to the same text.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/config.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace bftfs;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ClusterConfig c;
  const std::string error = parse_cluster(text, "fuzz.conf", c);
  if (!error.empty()) {
    if (error.rfind("fuzz.conf:", 0) != 0) fuzz::fail("config error without file and line");
    return 0;
  }
  if (c.n != 3 * c.f + 1 || c.f < 1 || c.n > kClusterReplicasMax) fuzz::fail("config: bad f or n");
  if (c.replicas.size() != c.n) fuzz::fail("config: replica count");
  for (std::size_t i = 0; i < c.clients.size(); ++i) {
    if (c.clients[i] < c.n) fuzz::fail("config: client id below n");
    if (i > 0 && c.clients[i] <= c.clients[i - 1]) fuzz::fail("config: client ids not increasing");
  }
  if (c.public_keys.size() != c.n + c.clients.size()) fuzz::fail("config: public key count");
  const std::string formatted = format_cluster(c);
  ClusterConfig again;
  if (!parse_cluster(formatted, "formatted", again).empty()) fuzz::fail("config: formatted text rejected");
  if (!(again == c)) fuzz::fail("config: round trip differs");
  if (format_cluster(again) != formatted) fuzz::fail("config: formatting is not stable");
  return 0;
}
