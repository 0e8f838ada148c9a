#include "runtime/status_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "os/unique_fd.h"

namespace bftfs {

void JsonObject::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
}

JsonObject& JsonObject::add(const std::string& k, std::uint64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, std::int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, double v) {
  key(k);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  body_ += buf;
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const std::string& v) {
  key(k);
  body_ += "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      body_ += '\\';
      body_ += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      body_ += buf;
    } else {
      body_ += c;
    }
  }
  body_ += "\"";
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const std::vector<std::uint64_t>& array) {
  key(k);
  body_ += "[";
  for (std::size_t i = 0; i < array.size(); ++i) {
    if (i != 0) body_ += ",";
    body_ += std::to_string(array[i]);
  }
  body_ += "]";
  return *this;
}
JsonObject& JsonObject::add(const std::string& k, const JsonObject& nested) {
  key(k);
  body_ += nested.str();
  return *this;
}

std::string write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return "cannot create " + tmp + ": " + std::strerror(errno);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd.get(), text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
    done += static_cast<std::size_t>(w);
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return "cannot rename " + tmp + ": " + std::strerror(errno);
  return "";
}

std::string read_status_file(const std::string& path, std::map<std::string, std::string>& out) {
  out.clear();
  std::ifstream in(path);
  if (!in) return "cannot read " + path + ": " + std::strerror(errno);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::size_t i = 0;
  auto skip_ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  };
  auto read_string = [&](std::string& v) -> bool {
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    v.clear();
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      v += s[i++];
    }
    if (i >= s.size()) return false;
    ++i;
    return true;
  };
  while (i < s.size()) {
    skip_ws();
    if (i >= s.size()) break;
    const char c = s[i];
    if (c == '{' || c == '}' || c == ',') {
      ++i;
      continue;
    }
    std::string k;
    if (!read_string(k)) return path + ": malformed status file at byte " + std::to_string(i);
    skip_ws();
    if (i >= s.size() || s[i] != ':') return path + ": malformed status file at byte " + std::to_string(i);
    ++i;
    skip_ws();
    if (i < s.size() && s[i] == '{') continue;  // nested object: its pairs are read by the loop
    std::string v;
    if (i < s.size() && s[i] == '"') {
      if (!read_string(v)) return path + ": malformed string at byte " + std::to_string(i);
    } else {
      while (i < s.size() && s[i] != ',' && s[i] != '}') v += s[i++];
      while (!v.empty() && (v.back() == ' ' || v.back() == '\n')) v.pop_back();
    }
    out.emplace(k, v);
  }
  if (out.empty()) return path + ": empty status file";
  return "";
}

}  // namespace bftfs
