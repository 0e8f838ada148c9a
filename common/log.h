// Structured, levelled logging. Lines look like
//   2026-11-22T13:31:51.123Z INFO r1 v3 s1280 view change complete primary=3
// The `r<id> v<view> s<seq>` prefix is passed by the caller (log_ctx). The sink is process-wide and
// replaceable: daemons write to stderr, the simulator and tests capture lines and fail on an unexpected ERROR.
// The pure core may log (the sink is injected); it never formats time itself: the sink adds it.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace bftfs {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
std::string_view to_string(LogLevel l);

// The sink receives the level and the line "LEVEL ctx message" (no timestamp, no newline; "LEVEL message" when
// ctx is empty). The default sink prefixes a UTC timestamp "YYYY-MM-DDTHH:MM:SS.mmmZ " and writes it to stderr.
using LogSink = std::function<void(LogLevel, std::string_view line)>;
// Installs the sink (default: stderr with a UTC timestamp). Not thread-safe against concurrent logging; call
// at start-up.
void log_set_sink(LogSink sink);
void log_set_level(LogLevel min_level);
LogLevel log_level();
std::uint64_t log_error_count();  // ERROR lines since start (tests assert it stays 0 unless expected)

// printf-style; `ctx` is the "r1 v3 s1280" prefix (may be empty).
void log_write(LogLevel level, std::string_view ctx, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace bftfs

#define BFT_LOG(level, ctx, ...)                                                          \
  do {                                                                                    \
    if (static_cast<int>(level) >= static_cast<int>(::bftfs::log_level()))                \
      ::bftfs::log_write(level, ctx, __VA_ARGS__);                                        \
  } while (0)
#define LOG_DEBUG(ctx, ...) BFT_LOG(::bftfs::LogLevel::kDebug, ctx, __VA_ARGS__)
#define LOG_INFO(ctx, ...) BFT_LOG(::bftfs::LogLevel::kInfo, ctx, __VA_ARGS__)
#define LOG_WARN(ctx, ...) BFT_LOG(::bftfs::LogLevel::kWarn, ctx, __VA_ARGS__)
#define LOG_ERROR(ctx, ...) BFT_LOG(::bftfs::LogLevel::kError, ctx, __VA_ARGS__)
