// A Compressor seen through a mutex. The runtime's pipeline lanes run several buffers at once, and two of them may
// use one codec instance (the runtime's codec of a spec, or an owner's compressor): each call into the codec takes
// the instance's mutex, so the encode of buffer i+1 and the decode of buffer i-1 never touch its state (residuals,
// scratch) together, while the communication between them runs unlocked. Private to src/runtime.
#pragma once

#include <memory>
#include <mutex>

#include "compressors/framework/gather_codec.h"
#include "gradcomp/compressor.h"
#include "gradcomp/error.h"

namespace gradcomp::runtime {

class LockedCompressor final : public Compressor, public GatherCodec {
 public:
  // `inner` and `mutex` must outlive this object; every call on `inner` made through it holds `mutex`.
  LockedCompressor(Compressor& inner, std::mutex& mutex)
      : inner_(inner), gather_(dynamic_cast<GatherCodec*>(&inner)), mutex_(mutex) {}

  std::string_view name() const override { return inner_.name(); }
  std::string spec() const override { return inner_.spec(); }
  CompressorTraits traits() const override { return inner_.traits(); }
  std::size_t max_payload_bytes(std::size_t numel) const override { return inner_.max_payload_bytes(numel); }
  std::size_t payload_bound(std::size_t numel, std::span<const TensorSegment> segments) const override {
    return inner_.payload_bound(numel, segments);
  }
  std::size_t expected_payload_bytes(std::size_t numel, std::size_t rows) const override {
    return inner_.expected_payload_bytes(numel, rows);
  }
  std::size_t compress(const TensorView& grad, std::span<std::byte> out, const CompressContext& ctx) override {
    std::lock_guard lock(mutex_);
    return inner_.compress(grad, out, ctx);
  }
  void decompress(PayloadBytes payload, const TensorView& out, DecodeMode mode) override {
    std::lock_guard lock(mutex_);
    inner_.decompress(payload, out, mode);
  }
  // Forwarded whole, so the inner codec's batched decode (one check of every payload, two device waits) is kept.
  void decompress_sum(std::span<const PayloadBytes> payloads, const TensorView& out, DecodeMode first) override {
    std::lock_guard lock(mutex_);
    inner_.decompress_sum(payloads, out, first);
  }
  std::vector<std::byte> save_state() const override {
    std::lock_guard lock(mutex_);
    return inner_.save_state();
  }
  void load_state(std::span<const std::byte> state) override {
    std::lock_guard lock(mutex_);
    inner_.load_state(state);
  }
  void reset_state() override {
    std::lock_guard lock(mutex_);
    inner_.reset_state();
  }
  void set_threads(int threads) override {
    std::lock_guard lock(mutex_);
    inner_.set_threads(threads);
  }
  CompressStats last_stats() const override {
    std::lock_guard lock(mutex_);
    return inner_.last_stats();
  }
  // Rounds codecs (PowerSGD) keep state in the reduction between calls: the runtime runs all their buffers on one
  // lane, so no second reduction of the same instance is ever in progress.
  std::unique_ptr<RoundReduction> begin_rounds(const TensorView& tensor, const CompressContext& ctx) override {
    std::lock_guard lock(mutex_);
    return inner_.begin_rounds(tensor, ctx);
  }

  // The inner codec's GatherCodec, when it has one (a fused buffer of none/fp16/bf16 then needs no fusion buffer).
  bool gathers() const override { return gather_ != nullptr && gather_->gathers(); }
  std::size_t compress_parts(std::span<const TensorView> parts, std::span<std::byte> out,
                             const CompressContext& ctx) override {
    std::lock_guard lock(mutex_);
    return inner_gather().compress_parts(parts, out, ctx);
  }
  void decompress_parts(std::span<const std::byte> payload, std::span<const TensorView> parts,
                        DecodeMode mode) override {
    std::lock_guard lock(mutex_);
    inner_gather().decompress_parts(payload, parts, mode);
  }

 private:
  GatherCodec& inner_gather() const;

  Compressor& inner_;
  GatherCodec* gather_;  // null: the inner codec cannot encode parts
  std::mutex& mutex_;
};

inline GatherCodec& LockedCompressor::inner_gather() const {
  GRADCOMP_CHECK(gather_ != nullptr, "compressor '{}' cannot encode parts", inner_.spec());
  return *gather_;
}

}  // namespace gradcomp::runtime
