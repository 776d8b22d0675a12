// Chrome-trace (Perfetto / chrome://tracing) writer: complete events ("ph":"X") streamed to a file that is valid
// JSON once close() ran. Thread-safe.
#pragma once

#include "src/core/json.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace gradcomp::runtime {

using Clock = std::chrono::steady_clock;

class Timeline {
 public:

  Timeline() = default;
  ~Timeline() { close(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Opens `path` for writing (throws InvalidArgument if it cannot). `pid` labels the process row (the rank).
  void open(const std::string& path, int pid);
  bool active() const { return active_.load(std::memory_order_acquire); }
  // One event [begin, end) named `name` in category `category` on row `tid`; `args_json` is "" or a JSON object.
  void event(std::string_view name, std::string_view category, int tid, Clock::time_point begin,
             Clock::time_point end, std::string_view args_json = {});
  // Writes the closing brackets; further events are dropped.
  void close();

 private:
  std::mutex mutex_;
  std::FILE* file_ = nullptr;
  std::atomic<bool> active_{false};
  int pid_ = 0;
  bool first_ = true;
  Clock::time_point origin_{};
};

using gradcomp::json_string;  // src/core/json.h

}  // namespace gradcomp::runtime
