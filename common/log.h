// One logger for the whole process. The prefix is set once from the rank's place (e.g. "[r3 pp1 tp1]").
// Rank 0 prints INFO by default; every rank prints WARN and above. Everything goes to stderr so stdout
// carries only the product's output (generated text or JSON).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::log {

enum class Level : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

struct State {
  Level level = Level::kInfo;
  bool is_root = true;  // only the root rank prints below WARN
};
inline State& state() {
  static State s;
  return s;
}

inline void set_level(Level level) { state().level = level; }
inline void set_place(const std::string& tag, bool is_root) {
  detail::rank_tag() = tag;
  state().is_root = is_root;
}
inline Level parse_level(std::string_view name) {
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn") return Level::kWarn;
  if (name == "error") return Level::kError;
  if (name == "off") return Level::kOff;
  throw ConfigError(fmt::format("unknown log level '{}' (use debug|info|warn|error|off)", name));
}
inline bool enabled(Level level) {
  const State& s = state();
  if (level < s.level) return false;
  return level >= Level::kWarn || s.is_root;
}

template <typename... Args>
void write(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(level)) return;
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  std::string line = fmt::format("{} {}: ", detail::rank_tag(), kNames[static_cast<int>(level)]);
  line += fmt::format(format, std::forward<Args>(args)...);
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

// Printed by every rank that calls it, whatever the level (per-rank reports asked for with --verbose).
template <typename... Args>
void note(fmt::format_string<Args...> format, Args&&... args) {
  std::string line = fmt::format("{} ", detail::rank_tag());
  line += fmt::format(format, std::forward<Args>(args)...);
  line += '\n';
  std::fputs(line.c_str(), stderr);
}

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) { write(Level::kDebug, f, std::forward<Args>(a)...); }
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) { write(Level::kInfo, f, std::forward<Args>(a)...); }
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) { write(Level::kWarn, f, std::forward<Args>(a)...); }
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... a) { write(Level::kError, f, std::forward<Args>(a)...); }

}  // namespace shardline::log
