// Levelled logging with a replaceable process-wide sink (see log.h).
#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <sys/time.h>

namespace bftfs {

namespace {

// Writes "YYYY-MM-DDTHH:MM:SS.mmmZ <line>\n" to stderr in one fwrite, so lines from several threads do not
// interleave (stdio locks the stream per call).
void stderr_sink(LogLevel, std::string_view line) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  std::tm tm{};
  gmtime_r(&tv.tv_sec, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(tv.tv_usec / 1000));
  std::string out;
  out.reserve(std::char_traits<char>::length(stamp) + line.size() + 1);
  out.append(stamp);
  out.append(line);
  out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stderr);
}

struct LogState {
  LogSink sink = stderr_sink;
  std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};
  std::atomic<std::uint64_t> errors{0};
};

// Function-local static: logging works from other static initializers too.
LogState& state() {
  static LogState s;
  return s;
}

}  // namespace

std::string_view to_string(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

void log_set_sink(LogSink sink) { state().sink = sink ? std::move(sink) : LogSink(stderr_sink); }

void log_set_level(LogLevel min_level) { state().min_level.store(static_cast<int>(min_level)); }

LogLevel log_level() { return static_cast<LogLevel>(state().min_level.load(std::memory_order_relaxed)); }

std::uint64_t log_error_count() { return state().errors.load(); }

void log_write(LogLevel level, std::string_view ctx, const char* fmt, ...) {
  LogState& s = state();
  if (level == LogLevel::kError) s.errors.fetch_add(1);
  // The macros filter before formatting; direct callers are filtered here.
  if (static_cast<int>(level) < s.min_level.load(std::memory_order_relaxed)) return;

  std::string line;
  const std::string_view name = to_string(level);
  line.reserve(name.size() + ctx.size() + 128);
  line.append(name);
  line.push_back(' ');
  if (!ctx.empty()) {
    line.append(ctx);
    line.push_back(' ');
  }
  const std::size_t prefix = line.size();

  char small[256];
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(small, sizeof small, fmt, args);
  va_end(args);
  if (n < 0) {
    line.append("(unformattable log message)");
  } else if (static_cast<std::size_t>(n) < sizeof small) {
    line.append(small, static_cast<std::size_t>(n));
  } else {
    line.resize(prefix + static_cast<std::size_t>(n) + 1);
    std::vsnprintf(line.data() + prefix, static_cast<std::size_t>(n) + 1, fmt, again);
    line.resize(prefix + static_cast<std::size_t>(n));
  }
  va_end(again);
  s.sink(level, line);
}

}  // namespace bftfs
