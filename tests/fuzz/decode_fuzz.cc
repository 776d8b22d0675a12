// libFuzzer target over the decoder of every registered codec (see decode_harness.h for the input format). Built only
// with -DGRADCOMP_FUZZ=ON and clang; run by scripts/fuzz.sh. A contract violation aborts, which libFuzzer reports as
// a crash and saves the input (replay: build-fuzz/tests/fuzz/decode_fuzz crash-<hash>).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "decode_harness.h"

// With GRADCOMP_FUZZ_WRITE_SEEDS=DIR set, writes raw-mode seed inputs (a valid payload of every codec for a few
// sizes) into DIR and exits, so the fuzzer starts past the header checks (scripts/fuzz.sh does this first).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("GRADCOMP_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
  gradcomp::fuzz::DecodeHarness harness;
  for (std::size_t c = 0; c < harness.size(); ++c) {
    for (const std::size_t numel : {1u, 5u, 64u}) {
      const auto payload = harness.valid_payload(c, numel, numel);
      if (payload.empty()) continue;
      const std::string path = std::string(dir) + "/raw-" + std::to_string(c) + "-" + std::to_string(numel);
      std::FILE* file = std::fopen(path.c_str(), "wb");
      if (file == nullptr) {
        std::perror(path.c_str());
        std::exit(1);
      }
      const unsigned char prefix[2] = {static_cast<unsigned char>(c), 0};
      std::fwrite(prefix, 1, 2, file);
      std::fwrite(payload.data(), 1, payload.size(), file);
      std::fclose(file);
    }
  }
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gradcomp::fuzz::DecodeHarness harness;
  try {
    gradcomp::fuzz::run_one_input(harness, data, size);
  } catch (const gradcomp::fuzz::Violation& violation) {
    std::fprintf(stderr, "decode_fuzz: %s\n", violation.what());
    std::abort();
  }
  return 0;
}
