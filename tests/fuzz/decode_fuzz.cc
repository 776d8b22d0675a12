// libFuzzer target over the decoder of every registered codec (see decode_harness.h for the input format). Built only
// with -DGRADCOMP_FUZZ=ON and clang; run by scripts/fuzz.sh. A contract violation aborts, which libFuzzer reports as
// a crash and saves the input (replay: build-fuzz/tests/fuzz/decode_fuzz crash-<hash>).
#include <cstdio>
#include <cstdlib>

#include "decode_harness.h"

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
