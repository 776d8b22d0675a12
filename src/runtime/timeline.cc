#include "src/runtime/timeline.h"

#include <fmt/format.h>

#include "gradcomp/error.h"

namespace gradcomp::runtime {


void Timeline::open(const std::string& path, int pid) {
  std::lock_guard lock(mutex_);
  GRADCOMP_CHECK(file_ == nullptr, "timeline already open");
  file_ = std::fopen(path.c_str(), "w");
  GRADCOMP_CHECK(file_ != nullptr, "cannot open timeline file '{}' for writing", path);
  pid_ = pid;
  first_ = true;
  origin_ = Clock::now();
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", file_);
  fmt::print(file_,
             "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"gradcomp rank {0}\"}}}}",
             pid_);
  first_ = false;
  active_.store(true, std::memory_order_release);
}

void Timeline::event(std::string_view name, std::string_view category, int tid, Clock::time_point begin,
                     Clock::time_point end, std::string_view args_json) {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
  const double ts = std::chrono::duration<double, std::micro>(begin - origin_).count();
  const double dur = std::chrono::duration<double, std::micro>(end - begin).count();
  fmt::print(file_, "{}{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}",
             first_ ? "" : ",\n", json_string(name), json_string(category), pid_, tid, ts, dur < 0 ? 0.0 : dur);
  if (!args_json.empty()) fmt::print(file_, ",\"args\":{}", args_json);
  std::fputs("}", file_);
  first_ = false;
}

void Timeline::close() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return;
  active_.store(false, std::memory_order_release);
  std::fputs("\n]}\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace gradcomp::runtime
