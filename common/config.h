// The cluster configuration written by `bftfs keygen` and read by every daemon.
//
// cluster.conf is a line-oriented text file (comments start with '#'):
//   version 1
//   f 1
//   replica 0 127.0.0.1:7000 kx=<64 hex> sign=<64 hex>
//   replica 1 ...
//   client 4 kx=<64 hex> sign=<64 hex>
// Replica ids are 0..n-1 with n = 3f+1; client ids follow (n..n+m-1). Each node's secrets are in
// keys/node-<id>.key (mode 0600): "kx=<64 hex>\nsign=<128 hex>\n". Every field is validated on load and an
// error names the file, line and reason.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/crypto.h"
#include "common/types.h"

namespace bftfs {

struct ReplicaAddress {
  std::string host;  // numeric IPv4/IPv6 address or host name
  std::uint16_t port = 0;
  friend bool operator==(const ReplicaAddress&, const ReplicaAddress&) = default;
};

// The largest cluster a configuration may describe (n = 3f+1 <= 64, so f <= 21); equals the wire limit
// kReplicasMax of protocol/messages.h (checked there), restated here because common/ does not know protocol/.
inline constexpr std::uint32_t kClusterReplicasMax = 64;

struct ClusterConfig {
  std::uint32_t f = 1;
  std::uint32_t n = 4;  // 3f+1
  std::vector<ReplicaAddress> replicas;  // index = replica id
  std::vector<NodeId> clients;           // client ids, increasing, each >= n
  std::map<NodeId, PublicKeys> public_keys;  // every replica and client

  bool is_replica(NodeId id) const { return id < n; }
  bool is_client(NodeId id) const;
  friend bool operator==(const ClusterConfig&, const ClusterConfig&) = default;
};

// Writes `dir`/cluster.conf and `dir`/keys/node-<id>.key for n = 3f+1 replicas and `clients` clients, with
// fresh keys. Replica i listens on hosts[i % hosts.size()]:(base_port + i). Returns "" on success or an error.
std::string generate_cluster(const std::string& dir, std::uint32_t f, std::uint32_t clients,
                             const std::vector<std::string>& hosts, std::uint16_t base_port);

// Parses cluster.conf. Returns "" on success or "path:line: reason". `out` is changed only on success.
// Validates: "version 1" first; then "f <f>" once with 1 <= f and 3f+1 <= kClusterReplicasMax; exactly 3f+1
// "replica" lines with ids 0..n-1 in order, "host:port" (IPv6 as "[addr]:port") with port 1..65535;
// "client" lines with ids >= n, strictly increasing, below 0xFFFFFFFF; keys as exactly 64 hex digits that are
// valid public keys (no low-order X25519 key, Ed25519 a valid point); no unknown keywords or extra tokens.
std::string load_cluster(const std::string& path, ClusterConfig& out);
// The parser behind load_cluster, on text already in memory; `name` is used in error messages as the path.
std::string parse_cluster(std::string_view text, const std::string& name, ClusterConfig& out);
// The cluster.conf text of `config` (what generate_cluster writes); parse_cluster of it gives `config` back.
// Precondition: `config` is valid (as parse_cluster would accept).
std::string format_cluster(const ClusterConfig& config);
// Reads a node's secret key file. Returns "" on success or an error. The file must be a regular file not
// readable or writable by group or others (mode 0600 or stricter), like an ssh private key.
std::string load_secret(const std::string& path, SecretKeys& out);
// The conventional secret key path for node `id` next to cluster.conf at `config_path`.
std::string secret_path_for(const std::string& config_path, NodeId id);

// Builds the crypto context of node `self` from the configuration and its secret keys. Returns nullptr (and
// logs an ERROR) if `self` is not in the configuration or `secret` does not belong to self's public keys (the
// wrong key file): an operating error the caller reports, not a crash.
std::unique_ptr<Crypto> make_crypto(const ClusterConfig& config, NodeId self, const SecretKeys& secret);

}  // namespace bftfs
