// Cluster configuration: key generation to files, and strict parsing of cluster.conf and key files (config.h).
#include "common/config.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs {

namespace {

constexpr std::uint32_t kConfigVersion = 1;
constexpr std::size_t kSecretFileBytesMax = 4096;
constexpr std::size_t kConfigFileBytesMax = 1u << 20;

// ---- small helpers ----

// An owned file descriptor (RAII: closed on every path).
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error close(2) may return (for files whose durability matters).
  bool close_checked() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

std::string errno_text(int err) { return std::strerror(err); }

std::string hex_of(std::span<const std::uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(bytes.size() * 2, '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 0x0F];
  }
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Exactly 2*N hex digits into `out`.
template <std::size_t N>
bool parse_hex(std::string_view s, std::array<std::uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = hex_value(s[2 * i]);
    const int lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

// A decimal number without sign or leading zeros that fits in `max`.
bool parse_decimal(std::string_view s, std::uint64_t max, std::uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  if (s.size() > 1 && s[0] == '0') return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (v > (max - digit) / 10) return false;
    v = v * 10 + digit;
  }
  out = v;
  return true;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::vector<std::string_view> split_tokens(std::string_view line) {
  std::vector<std::string_view> tokens;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) tokens.push_back(line.substr(start, i - start));
  }
  return tokens;
}

// Host names and numeric addresses: letters, digits, '.', '-', '_' (and ':' for IPv6, only in brackets).
bool valid_host(std::string_view host, bool ipv6) {
  if (host.empty() || host.size() > 253) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_' || (ipv6 && (c == ':' || c == '%'));
    if (!ok) return false;
  }
  return true;
}

// "host:port" or "[v6addr]:port".
std::string parse_address(std::string_view s, ReplicaAddress& out) {
  const std::size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return "address '" + std::string(s) + "' has no port";
  std::string_view host = s.substr(0, colon);
  const std::string_view port = s.substr(colon + 1);
  bool ipv6 = false;
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 2 || host.back() != ']') return "unterminated '[' in address '" + std::string(s) + "'";
    host = host.substr(1, host.size() - 2);
    // Brackets are for IPv6 only, so that formatting (which brackets exactly the hosts with ':') round-trips.
    if (host.find(':') == std::string_view::npos) return "brackets around a non-IPv6 host in '" + std::string(s) + "'";
    ipv6 = true;
  } else if (host.find(':') != std::string_view::npos) {
    return "IPv6 address '" + std::string(s) + "' must be written as [addr]:port";
  }
  if (!valid_host(host, ipv6)) return "invalid host '" + std::string(host) + "'";
  std::uint64_t p = 0;
  if (!parse_decimal(port, 65535, p) || p == 0) return "invalid port '" + std::string(port) + "' (1..65535)";
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(p);
  return "";
}

std::string format_address(const ReplicaAddress& a) {
  const bool ipv6 = a.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
}

// An X25519 public key is usable if a key exchange with it does not produce the all-zero shared point
// (libsodium refuses low-order points); an Ed25519 key must be a canonical point of the main subgroup.
bool valid_public_keys(const PublicKeys& keys) {
  static const auto probe = [] {
    PublicKeys pub;
    SecretKeys sec;
    generate_keys_from_seed(0x70726f6265ull, 0, pub, sec);  // any fixed key pair works as the probe
    return std::make_pair(pub, sec);
  }();
  std::uint8_t rx[crypto_kx_SESSIONKEYBYTES];
  std::uint8_t tx[crypto_kx_SESSIONKEYBYTES];
  const bool kx_ok = crypto_kx_client_session_keys(rx, tx, probe.first.kx.data(), probe.second.kx.data(),
                                                   keys.kx.data()) == 0;
  return kx_ok && crypto_core_ed25519_is_valid_point(keys.sign.data()) == 1;
}

// "kx=<64 hex>" and "sign=<64 hex>" tokens.
std::string parse_public_keys(std::string_view kx, std::string_view sign, PublicKeys& out) {
  if (kx.substr(0, 3) != "kx=") return "expected kx=<64 hex digits>, got '" + std::string(kx) + "'";
  if (!parse_hex(kx.substr(3), out.kx)) return "kx key must be exactly 64 hex digits";
  if (sign.substr(0, 5) != "sign=") return "expected sign=<64 hex digits>, got '" + std::string(sign) + "'";
  if (!parse_hex(sign.substr(5), out.sign)) return "sign key must be exactly 64 hex digits";
  if (!valid_public_keys(out)) return "invalid public key (not a usable curve point)";
  return "";
}

// ---- cluster.conf lines ----

// What parse_cluster has read so far.
struct ClusterParse {
  ClusterConfig config;
  bool seen_version = false;
  bool seen_f = false;
};

using Tokens = std::vector<std::string_view>;

// "version <n>": first, once, and the version this parser knows.
std::string parse_version_line(const Tokens& t, ClusterParse& parse) {
  if (parse.seen_version) return "duplicate version";
  if (t.size() != 2) return "expected 'version <n>'";
  std::uint64_t v = 0;
  if (!parse_decimal(t[1], 0xFFFFFFFFu, v) || v != kConfigVersion) {
    return "unsupported version '" + std::string(t[1]) + "' (expected " + std::to_string(kConfigVersion) + ")";
  }
  parse.seen_version = true;
  return "";
}

// "f <faults>": once, at least 1, and small enough that n = 3f+1 fits kClusterReplicasMax.
std::string parse_f_line(const Tokens& t, ClusterParse& parse) {
  if (parse.seen_f) return "duplicate f";
  if (t.size() != 2) return "expected 'f <faults>'";
  std::uint64_t f = 0;
  if (!parse_decimal(t[1], 0xFFFFFFFFu, f)) return "invalid f '" + std::string(t[1]) + "'";
  if (f < 1) return "f must be at least 1";
  if (3 * f + 1 > kClusterReplicasMax) {
    return "f " + std::to_string(f) + " needs more than " + std::to_string(kClusterReplicasMax) + " replicas";
  }
  parse.config.f = static_cast<std::uint32_t>(f);
  parse.config.n = 3 * parse.config.f + 1;
  parse.seen_f = true;
  return "";
}

// "replica <id> <host:port> kx=<hex> sign=<hex>": after f, ids 0..n-1 in order.
std::string parse_replica_line(const Tokens& t, ClusterParse& parse) {
  ClusterConfig& c = parse.config;
  if (!parse.seen_f) return "'f' must come before replica lines";
  if (t.size() != 5) return "expected 'replica <id> <host:port> kx=<hex> sign=<hex>'";
  std::uint64_t id = 0;
  if (!parse_decimal(t[1], 0xFFFFFFFFu, id)) return "invalid replica id '" + std::string(t[1]) + "'";
  if (id >= c.n) return "replica id " + std::to_string(id) + " out of range (n = " + std::to_string(c.n) + ")";
  if (id != c.replicas.size()) {
    return "replica id " + std::to_string(id) + " out of order (expected " + std::to_string(c.replicas.size()) + ")";
  }
  ReplicaAddress addr;
  if (std::string e = parse_address(t[2], addr); !e.empty()) return e;
  PublicKeys keys;
  if (std::string e = parse_public_keys(t[3], t[4], keys); !e.empty()) return e;
  c.replicas.push_back(addr);
  c.public_keys[static_cast<NodeId>(id)] = keys;
  return "";
}

// "client <id> kx=<hex> sign=<hex>": after f, ids at least n and strictly increasing.
std::string parse_client_line(const Tokens& t, ClusterParse& parse) {
  ClusterConfig& c = parse.config;
  if (!parse.seen_f) return "'f' must come before client lines";
  if (t.size() != 4) return "expected 'client <id> kx=<hex> sign=<hex>'";
  std::uint64_t id = 0;
  // 0xFFFFFFFF is kAllReplicas / kReplierAll on the wire, never a node.
  if (!parse_decimal(t[1], 0xFFFFFFFEu, id)) return "invalid client id '" + std::string(t[1]) + "'";
  if (id < c.n) return "client id " + std::to_string(id) + " must be >= n = " + std::to_string(c.n);
  if (!c.clients.empty() && id <= c.clients.back()) {
    return "client id " + std::to_string(id) + " not greater than the previous client id " +
           std::to_string(c.clients.back());
  }
  PublicKeys keys;
  if (std::string e = parse_public_keys(t[2], t[3], keys); !e.empty()) return e;
  c.clients.push_back(static_cast<NodeId>(id));
  c.public_keys[static_cast<NodeId>(id)] = keys;
  return "";
}

// One line of cluster.conf (comments start with '#'; blank lines are skipped). Returns "" or the reason the
// line is wrong.
std::string parse_cluster_line(std::string_view line, ClusterParse& parse) {
  if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
  if (line.find('\0') != std::string_view::npos) return "NUL byte in line";
  const Tokens t = split_tokens(line);
  if (t.empty()) return "";
  const std::string_view keyword = t[0];
  if (!parse.seen_version && keyword != "version") {
    return "expected 'version " + std::to_string(kConfigVersion) + "' first";
  }
  if (keyword == "version") return parse_version_line(t, parse);
  if (keyword == "f") return parse_f_line(t, parse);
  if (keyword == "replica") return parse_replica_line(t, parse);
  if (keyword == "client") return parse_client_line(t, parse);
  return "unknown keyword '" + std::string(keyword) + "'";
}

// Reads a whole small file. Returns "" or an error.
std::string read_file(const std::string& path, std::size_t max_bytes, std::string& out, struct stat* st_out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return path + ": cannot open: " + errno_text(errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return path + ": cannot stat: " + errno_text(errno);
  if (!S_ISREG(st.st_mode)) return path + ": not a regular file";
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) return path + ": file too large";
  if (st_out != nullptr) *st_out = st;
  out.clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return path + ": read failed: " + errno_text(errno);
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) return path + ": file too large";
  }
  return "";
}

// Writes `data` to `path` atomically with exactly `mode`: a fresh temporary file (never one left behind with
// other permissions), fsync, rename over `path`, fsync of the directory.
std::string write_file_atomic(const std::string& path, std::string_view data, mode_t mode) {
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return tmp + ": cannot remove: " + errno_text(errno);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (fd.get() < 0) return tmp + ": cannot create: " + errno_text(errno);
  if (::fchmod(fd.get(), mode) != 0) return tmp + ": chmod failed: " + errno_text(errno);
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return tmp + ": write failed: " + errno_text(errno);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return tmp + ": fsync failed: " + errno_text(errno);
  if (!fd.close_checked()) return tmp + ": close failed: " + errno_text(errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return path + ": rename failed: " + errno_text(errno);
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());  // best effort: some file systems refuse fsync on directories
  return "";
}

std::string make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0) {
    if (errno != EEXIST) return path + ": cannot create directory: " + errno_text(errno);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path + ": exists and is not a directory";
  }
  return "";
}

std::string format_secret(const SecretKeys& keys) {
  return "kx=" + hex_of(keys.kx) + "\nsign=" + hex_of(keys.sign) + "\n";
}

void wipe(std::string& s) {
  sodium_memzero(s.data(), s.size());
  s.clear();
}

}  // namespace

bool ClusterConfig::is_client(NodeId id) const { return std::binary_search(clients.begin(), clients.end(), id); }

std::string format_cluster(const ClusterConfig& config) {
  BFT_ASSERT(config.n == 3 * config.f + 1);
  BFT_ASSERT(config.replicas.size() == config.n);
  std::string s = "# bftfs cluster configuration (bftfs keygen). Secrets are in keys/node-<id>.key.\n";
  s += "version " + std::to_string(kConfigVersion) + "\n";
  s += "f " + std::to_string(config.f) + "\n";
  auto keys_of = [&config](NodeId id) {
    auto it = config.public_keys.find(id);
    BFT_ASSERT(it != config.public_keys.end());
    return "kx=" + hex_of(it->second.kx) + " sign=" + hex_of(it->second.sign);
  };
  for (NodeId id = 0; id < config.n; ++id) {
    s += "replica " + std::to_string(id) + " " + format_address(config.replicas[id]) + " " + keys_of(id) + "\n";
  }
  for (NodeId id : config.clients) s += "client " + std::to_string(id) + " " + keys_of(id) + "\n";
  return s;
}

std::string parse_cluster(std::string_view text, const std::string& name, ClusterConfig& out) {
  ClusterParse parse;
  parse.config.replicas.clear();
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    ++line_no;
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (std::string reason = parse_cluster_line(line, parse); !reason.empty()) {
      return name + ":" + std::to_string(line_no) + ": " + reason;
    }
  }
  const ClusterConfig& c = parse.config;
  const std::string at_end = name + ":" + std::to_string(line_no) + ": ";
  if (!parse.seen_version) return at_end + "missing 'version'";
  if (!parse.seen_f) return at_end + "missing 'f'";
  if (c.replicas.size() != c.n) {
    return at_end + "expected " + std::to_string(c.n) + " replicas, found " + std::to_string(c.replicas.size());
  }
  out = std::move(parse.config);
  return "";
}

std::string load_cluster(const std::string& path, ClusterConfig& out) {
  std::string text;
  if (std::string e = read_file(path, kConfigFileBytesMax, text, nullptr); !e.empty()) return e;
  return parse_cluster(text, path, out);
}

std::string load_secret(const std::string& path, SecretKeys& out) {
  std::string text;
  struct stat st {};
  std::string e = read_file(path, kSecretFileBytesMax, text, &st);
  if (!e.empty()) return e;
  if ((st.st_mode & 077) != 0) {
    wipe(text);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return path + ": insecure permissions " + mode + " (must not be accessible by group or others; use 0600)";
  }
  SecretKeys keys;
  const std::string expected = "kx=<64 hex>\\nsign=<128 hex>\\n";
  bool ok = text.size() == 3 + 64 + 1 + 5 + 128 + 1 && text.compare(0, 3, "kx=") == 0 && text[67] == '\n' &&
            text.compare(68, 5, "sign=") == 0 && text.back() == '\n';
  ok = ok && parse_hex(std::string_view(text).substr(3, 64), keys.kx) &&
       parse_hex(std::string_view(text).substr(73, 128), keys.sign);
  wipe(text);
  if (!ok) return path + ": malformed secret key file (expected " + expected + ")";
  // The Ed25519 secret key embeds its public key after the 32-byte seed; regenerating from the seed must give
  // the same key, or the file was corrupted or edited.
  std::array<std::uint8_t, 32> pk{};
  std::array<std::uint8_t, 64> sk{};
  crypto_sign_seed_keypair(pk.data(), sk.data(), keys.sign.data());
  const bool consistent = sodium_memcmp(sk.data(), keys.sign.data(), sk.size()) == 0;
  sodium_memzero(sk.data(), sk.size());
  if (!consistent) {
    sodium_memzero(&keys, sizeof keys);
    return path + ": inconsistent sign key (its public half does not match its seed)";
  }
  out = keys;
  sodium_memzero(&keys, sizeof keys);
  return "";
}

std::string secret_path_for(const std::string& config_path, NodeId id) {
  const std::size_t slash = config_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : config_path.substr(0, slash);
  return dir + "/keys/node-" + std::to_string(id) + ".key";
}

std::unique_ptr<Crypto> make_crypto(const ClusterConfig& config, NodeId self, const SecretKeys& secret) {
  auto it = config.public_keys.find(self);
  if (it == config.public_keys.end()) {
    LOG_ERROR("", "config: node %u is not in the cluster configuration", self);
    return nullptr;
  }
  std::array<std::uint8_t, 32> kx_pub{};
  crypto_scalarmult_base(kx_pub.data(), secret.kx.data());
  const bool kx_match = kx_pub == it->second.kx;
  const bool sign_match = std::equal(it->second.sign.begin(), it->second.sign.end(), secret.sign.begin() + 32);
  if (!kx_match || !sign_match) {
    LOG_ERROR("", "config: the secret keys do not belong to node %u (wrong key file?)", self);
    return nullptr;
  }
  return std::make_unique<Crypto>(self, secret, config.public_keys);
}

std::string generate_cluster(const std::string& dir, std::uint32_t f, std::uint32_t clients,
                             const std::vector<std::string>& hosts, std::uint16_t base_port) {
  if (f < 1) return "f must be at least 1";
  if (3ull * f + 1 > kClusterReplicasMax) return "f too large: at most " + std::to_string(kClusterReplicasMax) + " replicas";
  const std::uint32_t n = 3 * f + 1;
  if (hosts.empty()) return "no hosts given";
  for (const auto& h : hosts) {
    if (!valid_host(h, h.find(':') != std::string::npos)) return "invalid host '" + h + "'";
  }
  if (base_port == 0) return "base port must be at least 1";
  if (static_cast<std::uint32_t>(base_port) + n - 1 > 65535) return "base port too high for " + std::to_string(n) + " replicas";
  if (static_cast<std::uint64_t>(n) + clients > 0xFFFFFFFEull) return "too many clients";

  if (std::string e = make_dir(dir, 0755); !e.empty()) return e;
  const std::string keys_dir = dir + "/keys";
  if (std::string e = make_dir(keys_dir, 0700); !e.empty()) return e;
  if (::chmod(keys_dir.c_str(), 0700) != 0) return keys_dir + ": chmod failed: " + errno_text(errno);

  ClusterConfig config;
  config.f = f;
  config.n = n;
  for (NodeId id = 0; id < n + clients; ++id) {
    PublicKeys pub;
    SecretKeys sec;
    generate_keys(pub, sec);
    std::string secret_text = format_secret(sec);
    sodium_memzero(&sec, sizeof sec);
    std::string e = write_file_atomic(keys_dir + "/node-" + std::to_string(id) + ".key", secret_text, 0600);
    wipe(secret_text);
    if (!e.empty()) return e;
    config.public_keys[id] = pub;
    if (id < n) {
      config.replicas.push_back({hosts[id % hosts.size()], static_cast<std::uint16_t>(base_port + id)});
    } else {
      config.clients.push_back(id);
    }
  }
  return write_file_atomic(dir + "/cluster.conf", format_cluster(config), 0644);
}

}  // namespace bftfs
