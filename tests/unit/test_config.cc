// Cluster configuration: generation, loading, validation errors, key files (common/config.h).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/config.h"
#include "common/log.h"

using namespace bftfs;

namespace {

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/bftfs-config-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

void write_text(const std::string& path, const std::string& text, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
  }
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

std::string hex_key(std::uint64_t seed, NodeId id, bool sign) {
  PublicKeys p;
  SecretKeys s;
  generate_keys_from_seed(seed, id, p, s);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (auto b : sign ? p.sign : p.kx) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::string keys(NodeId id) { return "kx=" + hex_key(1, id, false) + " sign=" + hex_key(1, id, true); }

// A valid f=1 configuration with one client, line by line, so tests can break one line.
std::vector<std::string> valid_lines() {
  return {"version 1",
          "f 1",
          "replica 0 127.0.0.1:7000 " + keys(0),
          "replica 1 127.0.0.1:7001 " + keys(1),
          "replica 2 10.0.0.3:7002 " + keys(2),
          "replica 3 [::1]:7003 " + keys(3),
          "client 4 " + keys(4)};
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::string parse_error(const std::vector<std::string>& lines) {
  ClusterConfig c;
  return parse_cluster(join(lines), "c.conf", c);
}

}  // namespace

TEST_CASE("a valid configuration parses with every field", "[config]") {
  ClusterConfig c;
  auto lines = valid_lines();
  lines.insert(lines.begin() + 2, "   # a comment line, then a blank one");
  lines.insert(lines.begin() + 3, "");
  lines[0] += "   # trailing comment";
  REQUIRE(parse_cluster(join(lines), "c.conf", c) == "");
  CHECK(c.f == 1);
  CHECK(c.n == 4);
  REQUIRE(c.replicas.size() == 4);
  CHECK(c.replicas[1].host == "127.0.0.1");
  CHECK(c.replicas[1].port == 7001);
  CHECK(c.replicas[3].host == "::1");
  CHECK(c.clients == std::vector<NodeId>{4});
  CHECK(c.public_keys.size() == 5);
  PublicKeys p;
  SecretKeys s;
  generate_keys_from_seed(1, 2, p, s);
  CHECK(c.public_keys.at(2) == p);
  CHECK(c.is_replica(3));
  CHECK_FALSE(c.is_replica(4));
  CHECK(c.is_client(4));
  CHECK_FALSE(c.is_client(5));
  CHECK_FALSE(c.is_client(0));
}

TEST_CASE("format_cluster and parse_cluster round-trip", "[config]") {
  ClusterConfig c;
  REQUIRE(parse_cluster(join(valid_lines()), "c.conf", c) == "");
  const std::string text = format_cluster(c);
  ClusterConfig again;
  REQUIRE(parse_cluster(text, "again.conf", again) == "");
  CHECK(again == c);
  CHECK(format_cluster(again) == text);
}

TEST_CASE("malformed configuration lines are rejected with file, line and reason", "[config]") {
  auto with = [](std::size_t index, const std::string& line) {
    auto lines = valid_lines();
    lines[index] = line;
    return parse_error(lines);
  };
  auto starts = [](const std::string& error, const std::string& prefix) {
    INFO(error);
    CHECK(error.rfind(prefix, 0) == 0);
  };
  starts(with(0, "version 2"), "c.conf:1: unsupported version");
  starts(with(0, "f 1"), "c.conf:1: expected 'version 1' first");
  starts(with(1, "f 0"), "c.conf:2: f must be at least 1");
  starts(with(1, "f 22"), "c.conf:2: f 22 needs more than 64 replicas");
  starts(with(1, "f -1"), "c.conf:2: invalid f");
  starts(with(1, "f 1 2"), "c.conf:2: expected 'f <faults>'");
  starts(with(1, "version 1"), "c.conf:2: duplicate version");
  starts(with(2, "replica 1 127.0.0.1:7000 " + keys(0)), "c.conf:3: replica id 1 out of order (expected 0)");
  starts(with(2, "replica 4 127.0.0.1:7000 " + keys(0)), "c.conf:3: replica id 4 out of range");
  starts(with(2, "replica 0 127.0.0.1:0 " + keys(0)), "c.conf:3: invalid port '0'");
  starts(with(2, "replica 0 127.0.0.1:65536 " + keys(0)), "c.conf:3: invalid port '65536'");
  starts(with(2, "replica 0 127.0.0.1 " + keys(0)), "c.conf:3: address '127.0.0.1' has no port");
  starts(with(2, "replica 0 ::1:7000 " + keys(0)), "c.conf:3: IPv6 address");
  starts(with(2, "replica 0 [::1:7000 " + keys(0)), "c.conf:3: unterminated '['");
  starts(with(2, "replica 0 h/st:7000 " + keys(0)), "c.conf:3: invalid host");
  starts(with(2, "replica 0 [host%1]:7000 " + keys(0)), "c.conf:3: brackets around a non-IPv6 host");
  starts(with(2, "replica 0 127.0.0.1:7000 kx=abcd sign=" + hex_key(1, 0, true)), "c.conf:3: kx key must be exactly 64 hex digits");
  starts(with(2, "replica 0 127.0.0.1:7000 kx=" + hex_key(1, 0, false) + " sign=" + hex_key(1, 0, true) + "0"),
         "c.conf:3: sign key must be exactly 64 hex digits");
  starts(with(2, "replica 0 127.0.0.1:7000 sign=" + hex_key(1, 0, true) + " kx=" + hex_key(1, 0, false)),
         "c.conf:3: expected kx=");
  std::string bad_hex = hex_key(1, 0, false);
  bad_hex[10] = 'g';
  starts(with(2, "replica 0 127.0.0.1:7000 kx=" + bad_hex + " sign=" + hex_key(1, 0, true)), "c.conf:3: kx key must be");
  starts(with(2, "replica 0 127.0.0.1:7000 kx=" + std::string(64, '0') + " sign=" + hex_key(1, 0, true)),
         "c.conf:3: invalid public key");
  starts(with(2, "replica 0 127.0.0.1:7000 " + keys(0) + " extra"), "c.conf:3: expected 'replica <id>");
  starts(with(6, "client 3 " + keys(4)), "c.conf:7: client id 3 must be >= n = 4");
  starts(with(6, "client 4294967295 " + keys(4)), "c.conf:7: invalid client id");
  starts(with(6, "server 4 " + keys(4)), "c.conf:7: unknown keyword 'server'");
  starts(with(6, "client 04 " + keys(4)), "c.conf:7: invalid client id '04'");

  auto lines = valid_lines();
  lines.push_back("client 4 " + keys(5));
  starts(parse_error(lines), "c.conf:8: client id 4 not greater than the previous client id 4");
  lines = valid_lines();
  lines.erase(lines.begin() + 5);
  starts(parse_error(lines), "c.conf:6: expected 4 replicas, found 3");
  lines = valid_lines();
  lines.erase(lines.begin() + 1);
  starts(parse_error(lines), "c.conf:2: 'f' must come before replica lines");
  starts(parse_error({}), "c.conf:0: missing 'version'");
  starts(parse_error({"version 1"}), "c.conf:1: missing 'f'");
  ClusterConfig untouched;
  untouched.f = 77;
  CHECK(parse_cluster("version 1\nf 1\n", "x", untouched) != "");
  CHECK(untouched.f == 77);  // out is changed only on success
}

TEST_CASE("generate_cluster writes private key files and a configuration that loads", "[config]") {
  TempDir dir;
  const std::string root = dir.path + "/cluster";
  REQUIRE(generate_cluster(root, 1, 3, {"127.0.0.1", "::1"}, 9000) == "");
  CHECK(mode_of(root + "/keys") == 0700);
  for (NodeId id = 0; id < 7; ++id) CHECK(mode_of(root + "/keys/node-" + std::to_string(id) + ".key") == 0600);
  CHECK_FALSE(std::filesystem::exists(root + "/cluster.conf.tmp"));

  ClusterConfig c;
  const std::string conf = root + "/cluster.conf";
  REQUIRE(load_cluster(conf, c) == "");
  CHECK(c.n == 4);
  CHECK(c.clients == std::vector<NodeId>{4, 5, 6});
  CHECK(c.replicas[0].host == "127.0.0.1");
  CHECK(c.replicas[1].host == "::1");
  CHECK(c.replicas[3].port == 9003);
  CHECK(secret_path_for(conf, 5) == root + "/keys/node-5.key");
  CHECK(secret_path_for("cluster.conf", 2) == "./keys/node-2.key");

  std::vector<std::unique_ptr<Crypto>> nodes;
  for (NodeId id = 0; id < 7; ++id) {
    SecretKeys s;
    REQUIRE(load_secret(secret_path_for(conf, id), s) == "");
    auto crypto = make_crypto(c, id, s);
    REQUIRE(crypto != nullptr);
    nodes.push_back(std::move(crypto));
  }
  const Bytes msg = {1, 2, 3};
  CHECK(nodes[5]->verify_mac(2, msg, nodes[2]->mac(5, msg)));
  CHECK(nodes[0]->verify_signature(6, msg, nodes[6]->sign(msg)));

  // Keys are fresh: generating again gives another cluster.
  REQUIRE(generate_cluster(root, 1, 3, {"127.0.0.1"}, 9000) == "");
  ClusterConfig c2;
  REQUIRE(load_cluster(conf, c2) == "");
  CHECK_FALSE(c2.public_keys.at(0) == c.public_keys.at(0));
}

TEST_CASE("generate_cluster refuses impossible parameters", "[config]") {
  TempDir dir;
  CHECK(generate_cluster(dir.path, 0, 1, {"h"}, 9000) != "");
  CHECK(generate_cluster(dir.path, 22, 1, {"h"}, 9000) != "");
  CHECK(generate_cluster(dir.path, 1, 1, {}, 9000) != "");
  CHECK(generate_cluster(dir.path, 1, 1, {"bad host"}, 9000) != "");
  CHECK(generate_cluster(dir.path, 1, 1, {"h"}, 0) != "");
  CHECK(generate_cluster(dir.path, 1, 1, {"h"}, 65533) != "");  // replica 3 would need port 65536
  CHECK(generate_cluster(dir.path, 1, 1, {"h"}, 65532) == "");
  CHECK(generate_cluster("/proc/no-such-dir/x", 1, 1, {"h"}, 9000) != "");
}

TEST_CASE("secret key files are validated", "[config]") {
  TempDir dir;
  REQUIRE(generate_cluster(dir.path, 1, 0, {"127.0.0.1"}, 7000) == "");
  const std::string key = dir.path + "/keys/node-1.key";
  std::string text;
  {
    std::ifstream in(key);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  SecretKeys s;
  REQUIRE(load_secret(key, s) == "");

  const std::string other = dir.path + "/other.key";
  write_text(other, text, 0644);
  CHECK(load_secret(other, s).find("insecure permissions 0644") != std::string::npos);
  write_text(other, text.substr(0, text.size() - 1), 0600);
  CHECK(load_secret(other, s).find("malformed") != std::string::npos);
  std::string flipped = text;
  flipped[flipped.size() - 5] = flipped[flipped.size() - 5] == '0' ? '1' : '0';  // the embedded public key
  write_text(other, flipped, 0600);
  CHECK(load_secret(other, s).find("inconsistent sign key") != std::string::npos);
  CHECK(load_secret(dir.path + "/missing.key", s).find("cannot open") != std::string::npos);
  CHECK(load_secret(dir.path, s) != "");  // a directory

  // The key of node 1 is not node 2's.
  ClusterConfig c;
  REQUIRE(load_cluster(dir.path + "/cluster.conf", c) == "");
  SecretKeys one;
  REQUIRE(load_secret(key, one) == "");
  std::vector<std::string> lines;
  log_set_sink([&lines](LogLevel, std::string_view line) { lines.emplace_back(line); });
  CHECK(make_crypto(c, 2, one) == nullptr);
  CHECK(make_crypto(c, 40, one) == nullptr);
  log_set_sink(nullptr);
  CHECK(lines.size() == 2);
  CHECK(make_crypto(c, 1, one) != nullptr);
}

// Logging lives in common/ with the configuration; its contract is small enough to test here.
TEST_CASE("log lines carry level and context, are filtered by level, and ERRORs are counted", "[log]") {
  std::vector<std::pair<LogLevel, std::string>> lines;
  log_set_sink([&lines](LogLevel l, std::string_view line) { lines.emplace_back(l, std::string(line)); });
  const LogLevel before = log_level();
  const std::uint64_t errors = log_error_count();
  log_set_level(LogLevel::kInfo);
  LOG_DEBUG("r1 v2 s3", "hidden %d", 1);
  LOG_INFO("r1 v2 s3", "view change complete primary=%u", 3u);
  LOG_WARN("", "no context");
  const std::string longer(1000, 'x');
  LOG_ERROR("r0", "%s", longer.c_str());
  log_set_level(before);
  log_set_sink(nullptr);

  REQUIRE(lines.size() == 3);
  CHECK(lines[0].first == LogLevel::kInfo);
  CHECK(lines[0].second == "INFO r1 v2 s3 view change complete primary=3");
  CHECK(lines[1].second == "WARN no context");
  CHECK(lines[2].second == "ERROR r0 " + longer);  // longer than the formatting fast path
  CHECK(log_error_count() == errors + 1);
  CHECK(to_string(LogLevel::kDebug) == "DEBUG");
}
