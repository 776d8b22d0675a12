// The fusion runtime's Chrome-trace timeline on comm/local ranks (threads): written from construction
// (RuntimeOptions::timeline_path) with every phase, and started / stopped while the runtime runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gradcomp/runtime.h"
#include "tests/comm/local_harness.h"
#include "tests/runtime/json_check.h"

namespace gradcomp {
namespace {

using testing::run_ranks;

RuntimeOptions quiet_options() {
  RuntimeOptions options;
  options.timeline_path = "";
  options.cycle_time_ms = 1;
  return options;
}

// `pattern` with "{rank}" replaced by `rank`.
std::string path_of(const std::string& pattern, int rank) {
  const std::size_t at = pattern.find("{rank}");
  return pattern.substr(0, at) + std::to_string(rank) + pattern.substr(at + 6);
}

// The event names of the Chrome trace at `path` (which must exist and parse), checking every complete event's
// duration and process row (the rank).
std::set<std::string> timeline_event_names(const std::string& path, int rank) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::stringstream text;
  text << in.rdbuf();
  testing::Json json = testing::JsonParser(text.str()).parse();
  std::set<std::string> names;
  for (const auto& event : json.at("traceEvents").array) {
    names.insert(event.at("name").string);
    if (event.at("ph").string == "X") {
      EXPECT_GE(event.at("dur").number, 0);
      EXPECT_EQ(event.at("pid").number, rank);
    }
  }
  return names;
}

TEST(Runtime, TimelineIsValidJsonWithEveryPhase) {
  const std::string pattern = ::testing::TempDir() + "/gradcomp_rt_timeline_{rank}.json";
  run_ranks(2, [&](Communicator& comm) {
    RuntimeOptions options = quiet_options();
    options.timeline_path = pattern;
    Runtime rt(comm, options);
    std::vector<std::vector<float>> data(6, std::vector<float>(5000, 1.0f));
    for (int t = 0; t < 6; ++t) {
      rt.allreduce_async(fmt::format("w{}", t), TensorView::of(std::span<float>(data[t])),
                         t % 2 ? "topk:ratio=0.1" : "none");
    }
    rt.synchronize();
  });
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = path_of(pattern, rank);
    const std::set<std::string> names = timeline_event_names(path, rank);
    for (const char* phase : {"negotiate", "copy_in", "compress", "communicate", "decompress", "copy_out", "w0"}) {
      EXPECT_TRUE(names.count(phase)) << "missing phase " << phase << " on rank " << rank;
    }
    std::remove(path.c_str());
  }
}

TEST(Runtime, TimelineStartsAndStopsWhileRunning) {
  // No timeline at construction; start_timeline() opens one for the work that follows, stop_timeline() closes it
  // (valid JSON), and work after the stop is not in it.
  const std::string pattern = ::testing::TempDir() + "/gradcomp_rt_started_{rank}.json";
  run_ranks(2, [&](Communicator& comm) {
    Runtime rt(comm, quiet_options());
    std::vector<float> before(100, 1.0f), during(100, 1.0f), after(100, 1.0f);
    rt.wait(rt.allreduce_async("before", TensorView::of(std::span<float>(before))));
    rt.start_timeline(pattern);
    rt.wait(rt.allreduce_async("during", TensorView::of(std::span<float>(during))));
    rt.stop_timeline();
    rt.wait(rt.allreduce_async("after", TensorView::of(std::span<float>(after))));
  });
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = path_of(pattern, rank);
    const std::set<std::string> names = timeline_event_names(path, rank);
    EXPECT_TRUE(names.count("during")) << "rank " << rank;
    EXPECT_FALSE(names.count("before")) << "rank " << rank;
    EXPECT_FALSE(names.count("after")) << "rank " << rank;
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace gradcomp
