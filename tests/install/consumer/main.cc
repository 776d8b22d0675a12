// A program outside the gradcomp tree, built against the installed package.
#include <gradcomp/gradcomp.h>

#include <cstdio>
#include <vector>

int main() {
  auto compressor = gradcomp::make_compressor("none");
  std::vector<float> grad{1.0f, 2.0f, 3.0f}, out(3);
  const auto payload = gradcomp::compress_to_vector(*compressor, gradcomp::TensorView::of(std::span<float>(grad)),
                                                    {.name = "w"});
  compressor->decompress(payload, gradcomp::TensorView::of(std::span<float>(out)), gradcomp::DecodeMode::kOverwrite);
  if (out != grad) return 1;
  std::printf("consumer ok: gradcomp %s, %zu payload bytes\n", GRADCOMP_VERSION, payload.size());
  return 0;
}
