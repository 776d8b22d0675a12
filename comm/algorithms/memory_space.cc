// The host memory space: pooled buffers, memcpy, scalar dtype conversions and a division pass that counts nonzeros.
#include "comm/algorithms/memory_space.h"

#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "gradcomp/error.h"
#include "kernels/half_ops.cuh"
#include "kernels/usage_counters.h"

#ifdef GRADCOMP_SIMGRID
namespace gradcomp::sim {
// The simulated build (bench/sim/sim_shims.cc): whether `bytes` at `p` lie in folded memory, one block shared by every
// simulated rank whose values are garbage by design; host arithmetic on it is skipped as copies into it are.
bool folded(const void* p, std::size_t bytes);
}  // namespace gradcomp::sim
#endif

namespace gradcomp::algorithms {
namespace {

// sum[i] /= divisor for every i, and the count of nonzero results, in one pass that writes only the 8-value groups
// holding a nonzero: zeros divide to themselves (with their sign), so skipping them changes no bit, and a sparse sum
// leaves most cache lines clean instead of writing the whole tensor back.
std::size_t divide_and_count_nonzero(float* sum, std::size_t numel, float divisor) {
  std::size_t nonzero = 0, i = 0;
  const bool divide = divisor != 1.0f;
#if defined(__AVX2__)
  const __m256 zero = _mm256_setzero_ps(), by = _mm256_set1_ps(divisor);
  for (; i + 8 <= numel; i += 8) {
    const __m256 x = _mm256_loadu_ps(sum + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, zero, _CMP_NEQ_UQ)) == 0) continue;  // NaN is nonzero, as below
    const __m256 y = divide ? _mm256_div_ps(x, by) : x;
    if (divide) _mm256_storeu_ps(sum + i, y);
    // Counted after the division, like the scalar tail (a subnormal may divide to zero).
    nonzero += static_cast<std::size_t>(
        __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(y, zero, _CMP_NEQ_UQ)))));
  }
#endif
  for (; i < numel; ++i) {
    if (divide) sum[i] /= divisor;
    nonzero += sum[i] != 0.0f;
  }
  return nonzero;
}

class HostSpace final : public MemorySpace {
 public:
  bool is_device() const override { return false; }
  Memory memory() const override { return Memory::host(); }
  TensorView view(void* data, std::size_t numel, DType dtype) const override {
    return TensorView(numel ? data : nullptr, numel, dtype);
  }
  Bytes allocate(std::size_t bytes) override { return Bytes(bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, std::size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void read(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    kernels::note_synchronization();  // as the device space (see MemorySpace::synchronize)
    copy(host, src, bytes);
  }
  void load_f32(const TensorView& in, float* out) override {
    const std::size_t n = in.numel();
    if (n == 0) return;
    const auto* bits = static_cast<const std::uint16_t*>(in.data());
    switch (in.dtype()) {
      case DType::kF32: std::memcpy(out, in.data(), n * sizeof(float)); return;
      case DType::kF16:
        for (std::size_t i = 0; i < n; ++i) out[i] = kernels::half_bits_to_float(bits[i]);
        return;
      case DType::kBF16:
        for (std::size_t i = 0; i < n; ++i) out[i] = kernels::bf16_bits_to_float(bits[i]);
        return;
      default: throw InvalidArgument(fmt::format("compressed_allreduce: cannot read {}", in.describe()));
    }
  }
  void store_f32(const float* values, const TensorView& out) override {
    const std::size_t n = out.numel();
    if (n == 0) return;
    auto* bits = static_cast<std::uint16_t*>(out.data());
    switch (out.dtype()) {
      case DType::kF32:
        if (out.data() != values) std::memcpy(out.data(), values, n * sizeof(float));
        return;
      case DType::kF16:
        for (std::size_t i = 0; i < n; ++i) bits[i] = kernels::float_to_half_bits(values[i]);
        return;
      case DType::kBF16:
        for (std::size_t i = 0; i < n; ++i) bits[i] = kernels::float_to_bf16_bits(values[i]);
        return;
      default: throw InvalidArgument(fmt::format("compressed_allreduce: cannot store into {}", out.describe()));
    }
  }
  std::size_t divide(float* values, std::size_t n, float divisor, bool count_nonzero) override {
    if (count_nonzero) {
      kernels::note_synchronization();  // the device space reads the count back
      return divide_and_count_nonzero(values, n, divisor);
    }
#ifdef GRADCOMP_SIMGRID
    if (sim::folded(values, n * sizeof(float))) return 0;  // 100 MB a rank was a third of a simulated run's CPU
#endif
    if (divisor != 1.0f) {
      for (std::size_t i = 0; i < n; ++i) values[i] /= divisor;
    }
    return 0;
  }
  void add(float* acc, const float* x, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  }
  void synchronize() override { kernels::note_synchronization(); }
};

}  // namespace

MemorySpace& host_space() {
  static HostSpace space;
  return space;
}

}  // namespace gradcomp::algorithms
