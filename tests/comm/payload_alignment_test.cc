// Payloads at any byte offset. The device decoders load int32 indices and float4 groups straight from a payload's
// sections, so the collectives place every payload of a packed buffer (allgatherv, alltoallv) at a multiple of
// algorithms::kPayloadAlign: top-k with f16 values and odd k writes 64 + align16(4k) + 2k bytes, which used to put the
// next rank's payload at 2 mod 4 (cudaErrorMisalignedAddress, a dead context, on the first multi-rank GPU run). The
// host decoders must not assume alignment at all: every codec decodes a payload copied to every offset 0..15 to the
// same bits (under scripts/test.sh --sanitize, UBSan's alignment check watches the loads).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/algorithms/algorithms.h"
#include "gradcomp/collectives.h"
#include "gradcomp/registry.h"
#include "tests/comm/local_harness.h"
#include "tests/gpu/parity_data.h"

namespace gradcomp {
namespace {

std::vector<float> gradient(std::size_t n, unsigned seed) { return parity::random_values(n, seed, 1.0f, 30.0f); }

// Decodes `payload` placed at byte `offset` of a fresh buffer (overwrite, then accumulate onto it).
std::vector<float> decode_at(Compressor& codec, const std::vector<std::byte>& payload, std::size_t offset,
                             std::size_t numel) {
  std::vector<std::byte> buffer(payload.size() + 32);
  auto* base = buffer.data() + (16 - reinterpret_cast<std::uintptr_t>(buffer.data()) % 16) % 16;
  std::memcpy(base + offset, payload.data(), payload.size());
  const std::span<const std::byte> placed(base + offset, payload.size());
  std::vector<float> out(numel, -7.0f);
  codec.decompress(placed, TensorView::of(std::span(out)), DecodeMode::kOverwrite);
  codec.decompress(placed, TensorView::of(std::span(out)), DecodeMode::kAccumulate);
  return out;
}

TEST(PayloadAlignment, EveryCodecDecodesAtEveryOffset) {
  const std::size_t numel = 1001;
  const std::vector<TensorSegment> segments = {{"a", 0, 3, 0, 3}, {"b", 3, 501, 0, 501}, {"c", 504, 497, 0, 497}};
  for (const std::string& spec : parity::specs()) {
    for (const bool segmented : {false, true}) {
      SCOPED_TRACE(fmt::format("spec {}, {}", spec, segmented ? "segmented (3 parts)" : "one tensor"));
      auto codec = make_compressor(spec);
      std::vector<float> grad = gradient(numel, 11);
      std::vector<std::byte> payload(codec->payload_bound(numel, segmented ? std::span(segments)
                                                                           : std::span<const TensorSegment>()));
      CompressContext ctx;
      ctx.name = "t";
      ctx.step = 3;
      if (segmented) ctx.segments = segments;
      payload.resize(codec->compress(TensorView::of(std::span(grad)), payload, ctx));
      const std::vector<float> aligned = decode_at(*codec, payload, 0, numel);
      for (std::size_t offset = 1; offset < 16; ++offset) {
        const std::vector<float> moved = decode_at(*codec, payload, offset, numel);
        ASSERT_EQ(std::memcmp(moved.data(), aligned.data(), numel * sizeof(float)), 0) << "offset " << offset;
      }
    }
  }
}

// A codec that records where each payload it decodes starts (relative to 16 bytes), then decodes it.
class AlignmentProbe final : public Compressor {
 public:
  explicit AlignmentProbe(std::string_view spec) : inner_(make_compressor(spec)) {}
  std::string_view name() const override { return inner_->name(); }
  std::string spec() const override { return inner_->spec(); }
  CompressorTraits traits() const override { return inner_->traits(); }
  std::size_t max_payload_bytes(std::size_t numel) const override { return inner_->max_payload_bytes(numel); }
  std::size_t payload_bound(std::size_t numel, std::span<const TensorSegment> segments) const override {
    return inner_->payload_bound(numel, segments);
  }
  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) override {
    return inner_->compress(grad, out, ctx);
  }
  void decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) override {
    misalignments.push_back(reinterpret_cast<std::uintptr_t>(payload.bytes.data()) % algorithms::kPayloadAlign);
    inner_->decompress(payload, out, mode);
  }
  std::vector<std::byte> save_state() const override { return inner_->save_state(); }
  void load_state(std::span<const std::byte> state) override { inner_->load_state(state); }
  void reset_state() override { inner_->reset_state(); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  CompressStats last_stats() const override { return inner_->last_stats(); }

  std::vector<std::uintptr_t> misalignments;  // payload address mod 16 of every decode

 private:
  std::unique_ptr<Compressor> inner_;
};

struct Case {
  std::string spec;
  AllreduceAlgorithm algorithm;
  std::size_t numel;
  bool segmented;
};

TEST(PayloadAlignment, PackedPayloadsStartAtMultiplesOf16) {
  // Odd payload lengths: f16 values with odd k (64 + 16 + 6 and 64 + 32 + 10 bytes), random-k's 4k-byte values
  // after a 32-byte stream section with k odd, 2-bit buckets of an odd count; alone and segmented; every packing
  // algorithm.
  const std::vector<Case> cases = {
      {"topk:k=3,values=f16", AllreduceAlgorithm::kAllgather, 1001, false},
      {"topk:k=5,values=f16", AllreduceAlgorithm::kSparseAllreduce, 1001, false},
      {"topk:k=3,values=f16", AllreduceAlgorithm::kSparseAllreduce, 1001, true},
      {"randomk:ratio=0.003", AllreduceAlgorithm::kAllgather, 1001, true},
      {"qsgd:bits=2,bucket=128", AllreduceAlgorithm::kScatterReduceAllgather, 1003, false},
      {"topk:k=5,values=f16", AllreduceAlgorithm::kScatterReduceAllgather, 3001, true},
      {"blocktopk:ratio=0.1,block=7", AllreduceAlgorithm::kAllgather, 1001, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} over {}{}", c.spec, algorithm_name(c.algorithm), c.segmented ? ", segmented" : ""));
    std::mutex mutex;
    std::vector<std::vector<float>> results(3);
    testing::run_ranks(3, [&](Communicator& comm) {
      AlignmentProbe probe(c.spec);
      const std::vector<TensorSegment> segments = {{"x", 0, 400, 0, 400}, {"y", 400, c.numel - 400, 0, c.numel - 400}};
      for (std::uint64_t step = 0; step < 2; ++step) {
        std::vector<float> tensor = gradient(c.numel, static_cast<unsigned>(comm.rank() * 7 + step));
        AllreduceOptions options;
        options.algorithm = c.algorithm;
        options.step = step;
        if (c.segmented) options.segments = segments;
        compressed_allreduce(comm, probe, TensorView::of(std::span(tensor)), "t", options);
        std::lock_guard lock(mutex);
        results[static_cast<std::size_t>(comm.rank())] = tensor;
      }
      std::lock_guard lock(mutex);
      ASSERT_FALSE(probe.misalignments.empty());
      for (const std::uintptr_t m : probe.misalignments) EXPECT_EQ(m, 0u) << "rank " << comm.rank();
    });
    for (std::size_t r = 1; r < results.size(); ++r) {
      EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), c.numel * sizeof(float)), 0) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace gradcomp
