// Status files: every daemon writes <data>/status.json about every 500 ms (write to a temporary name, then
// rename, so a reader never sees half a file). `bftfs status`, `bftfs cluster start` and tests read them.
// The format is one flat JSON object whose values are numbers, booleans or strings, with nested objects for
// groups of counters; readers look keys up by name (keys are unique across the nesting).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace bftfs {

// Builds one JSON object. Keys are our own identifiers (no escaping needed); string values are escaped.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, std::uint64_t v);
  JsonObject& add(const std::string& key, std::int64_t v);
  JsonObject& add(const std::string& key, double v);
  JsonObject& add(const std::string& key, bool v);
  JsonObject& add(const std::string& key, const std::string& v);
  JsonObject& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonObject& add(const std::string& key, const JsonObject& nested);
  JsonObject& add(const std::string& key, const std::vector<std::uint64_t>& array);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

// Writes `text` to `path` atomically (tmp + rename). Returns "" or an error. Not fsynced: status is advisory.
[[nodiscard]] std::string write_file_atomically(const std::string& path, const std::string& text);

// Reads every "key": scalar pair of a JSON object written by JsonObject (nested objects are flattened; the
// first occurrence of a key wins). Strings are returned without quotes. Returns "" or an error.
[[nodiscard]] std::string read_status_file(const std::string& path, std::map<std::string, std::string>& out);

}  // namespace bftfs
