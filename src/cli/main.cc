// gradcomp: inspect the compressors of this build and probe them on synthetic gradients.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "src/cli/commands.h"

namespace {

constexpr const char* kUsage = R"(gradcomp — gradient compression for distributed training

usage:
  gradcomp --version              print the version and what this build contains
  gradcomp list [--json]          every registered compressor with its parameters, defaults and traits
  gradcomp probe SPEC [options]   compress + decompress a synthetic gradient and report ratio, error, speed
  gradcomp COMMAND --help         help for one command

examples:
  gradcomp list
  gradcomp probe topk:ratio=0.01 --numel 25000000 --json
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "--version" || command == "version") {
      fmt::print("gradcomp {} (cuda={}, mpi={}, nccl={})\n", GRADCOMP_VERSION, GRADCOMP_WITH_CUDA ? "on" : "off",
                 GRADCOMP_WITH_MPI ? "on" : "off", GRADCOMP_WITH_NCCL ? "on" : "off");
      return 0;
    }
    if (command == "list") return gradcomp::cli::run_list(std::move(args));
    if (command == "probe") return gradcomp::cli::run_probe(std::move(args));
    fmt::print(stderr, "gradcomp: unknown command '{}'\n\n{}", command, kUsage);
    return 2;
  } catch (const gradcomp::Error& error) {
    fmt::print(stderr, "gradcomp {}: error: {}\n", command, error.what());
    return 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "gradcomp {}: unexpected error: {}\n", command, error.what());
    return 1;
  }
}
