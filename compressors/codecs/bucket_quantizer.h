// The CPU skeleton of the bucketed quantizers (qsgd, terngrad, onebit): one class template, BucketQuantizer<Policy>,
// owns what the three share (payload layout and header, the fused encode pass with its non-finite tally, validated
// parallel decode, the registry entry); a codec file supplies only its rules as a policy:
//
//   struct Policy {
//     static constexpr std::string_view kName;      // registry name
//     static constexpr bool kWholeTensor;           // bucket=0 (one scale for the whole tensor) is allowed
//     static BucketLayout layout(const Params&);    // code width, bucket, header params (also used by CUDA)
//     explicit Policy(const Params&);
//     // Statistics rule: what the scale needs of v = g + r over n values (kernels::bucket_stats).
//     kernels::BucketStats stats(const float* g, const float* r, std::size_t n) const;
//     // Scale rule: the bucket's scale from its (finite) statistics; g, r as for stats().
//     float scale(const kernels::BucketStats& s, const float* g, const float* r, std::size_t n) const;
//     // Level rule, per call: an object whose quantize(g, r, r_out, begin, end, scale, packed, stream_out) codes
//     // values [begin, end) (absolute indices; begin on a byte of codes) and writes their new residual.
//     Coder coder(const EncodeArgs& args) const;
//     // Decodes codes [begin, end) with `scale` into out (= or +=; stream: non-temporal stores, caller fences).
//     void decode(const std::uint8_t* packed, std::size_t begin, std::size_t end, float scale, float* out,
//                 bool accumulate, bool stream) const;
//   };
//
// and registers it with bucket_quantizer_info<Policy>(summary, its own parameters).
//
// A bucket whose v holds NaN/Inf is the same for every codec: NaN scale, zero codes, the finite part of v kept in
// the residual (kernels::signmag_nonfinite_range, which is also 1-bit's all-zero sign bits). The CUDA backend of the
// three is compressors/cuda/quantize_cuda_backend.cc (one kernel family, the same BucketLayout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compressors/framework/error_feedback.h"
#include "compressors/codecs/quantize_common.h"
#include "gradcomp/error.h"
#include "kernels/bucket_reduce.h"
#include "kernels/cpu_parallel.h"
#include "compressors/codecs/signmag_cpu.h"
#include "kernels/stream_store.h"

namespace gradcomp::quantize {

// Traits of every bucketed quantizer: requantizable, lossy, u8 wire.
inline CompressorTraits bucket_quantizer_traits() {
  CompressorTraits traits;
  traits.requantizable = true;
  traits.lossy = true;
  traits.wire_dtype = DType::kU8;
  return traits;
}

// The level rule of qsgd and terngrad: stochastic rounding of |v| / scale to sign + level codes of `bits` bits
// (Philox keyed by seed, tensor and step; compressors/codecs/signmag_cpu.h). A policy base providing coder() and decode().
// kFixedBits: the code width when the codec fixes it (terngrad: 2; the decode loop is then specialized for it, as
// before the skeleton existed), or 0 when it is a parameter (qsgd: `bits`).
template <unsigned kFixedBits = 0>
struct SignMagCodes {
  unsigned bits = kFixedBits;
  std::uint64_t seed = 0;

  kernels::SignMagQuantizer coder(const EncodeArgs& args) const {
    return kernels::SignMagQuantizer(width(), kernels::PhiloxStream::make(seed, args.tensor_key, args.ctx->step));
  }
  void decode(const std::uint8_t* packed, std::size_t begin, std::size_t end, float scale, float* out, bool accumulate,
              bool stream) const {
    kernels::signmag_decode_range(packed, begin, end, scale, width(), out, accumulate, stream);
  }
  unsigned width() const { return kFixedBits ? kFixedBits : bits; }
};

template <class Policy>
class BucketQuantizer final : public ErrorFeedbackCompressor {
 public:
  // `specs`: the registry entry's parameter declarations; `params` as validated against them.
  BucketQuantizer(const Params& params, std::vector<ParamSpec> specs)
      : ErrorFeedbackCompressor(std::string(Policy::kName), Policy::layout(params).codec, bucket_quantizer_traits(),
                                std::move(specs), params),
        layout_(Policy::layout(params)),
        policy_(params) {}

  std::size_t max_payload_bytes(std::size_t numel) const override {
    return payload::total_bytes(layout_.header(numel, DType::kF32));
  }

 protected:
  // The bucket statistics already flag non-finite values, so the base's separate scan is folded into encode().
  bool fuses_nonfinite_scan() const override { return true; }

  std::size_t encode(const EncodeArgs& args, std::span<std::byte> out, CompressStats& stats) override {
    const std::size_t n = args.numel;
    payload::Header header = layout_.header(n, args.original_dtype);
    GRADCOMP_CHECK(out.size() >= payload::total_bytes(header), "{}: output buffer of {} bytes is too small ({})",
                   Policy::kName, out.size(), payload::total_bytes(header));
    float* r_out = args.residual_out ? args.residual_out : args.residual;
    // Non-finite findings per parallel chunk (gradient values counted only where v = g + r was flagged), combined
    // in chunk order so the result does not depend on the thread count.
    const std::size_t chunks = (n + layout_.chunk() - 1) / layout_.chunk();
    Pass pass{args,
              out.data() + payload::section_offset(header, 0),
              reinterpret_cast<std::uint8_t*>(out.data() + payload::section_offset(header, 1)),
              r_out,
              args.residual_out && kernels::use_stream_stores(r_out, n, false),
              std::vector<std::uint8_t>(chunks, 0),
              std::vector<std::size_t>(chunks, 0),
              std::vector<std::size_t>(chunks, n)};
    if (n == 0) {
      // nothing to encode
    } else if (layout_.bucket == 0) {
      if constexpr (Policy::kWholeTensor) encode_whole(pass);  // else rejected by the factory
    } else {
      encode_buckets(pass);
    }
    for (const auto flag : pass.bad) header.flags |= flag ? kFlagNonFinite : 0;
    report_nonfinite(pass.bad_count, pass.bad_first, n, stats, args.first_nonfinite);
    stats.selected = n;
    return payload::write_header(header, out);
  }

  void validate(const payload::View& view, std::size_t numel) const override {
    const std::size_t buckets = layout_.check(view, numel);
    std::vector<float> scales(buckets);
    read_scales(view, layout_.name, 0, buckets, scales.data());
  }

  void decode(const payload::View& view, float* out, std::size_t numel, bool accumulate) override {
    const std::size_t buckets = layout_.check(view, numel);
    scales_.resize(buckets);
    read_scales(view, layout_.name, 0, buckets, scales_.data());
    const std::size_t bucket = layout_.effective_bucket(numel);
    const auto* packed = reinterpret_cast<const std::uint8_t*>(view.sections[1].data());
    const bool stream = kernels::use_stream_stores(out, numel, accumulate);
    kernels::parallel_chunks(numel, layout_.chunk(), threads(), [&](std::size_t, std::size_t begin, std::size_t end) {
      for (std::size_t b0 = begin; b0 < end;) {
        const std::size_t b1 = std::min(end, (b0 / bucket + 1) * bucket);
        policy_.decode(packed, b0, b1, scales_[b0 / bucket], out, accumulate, stream);
        b0 = b1;
      }
      kernels::stream_fence(stream);
    });
  }

 private:
  // One encode call: its inputs, payload sections, residual output and per-chunk non-finite findings.
  struct Pass {
    const EncodeArgs& args;
    std::byte* scales;
    std::uint8_t* packed;
    float* r_out;
    bool stream_out;
    std::vector<std::uint8_t> bad;
    std::vector<std::size_t> bad_count, bad_first;
  };

  // A bucket (or the whole tensor) of [b0, b1) held NaN/Inf in v: count the gradient's own, send zero codes.
  void encode_nonfinite(Pass& pass, std::size_t k, std::size_t b0, std::size_t b1, bool count) const {
    const EncodeArgs& args = pass.args;
    pass.bad[k] = 1;
    if (count) kernels::count_nonfinite_range(args.grad, b0, b1, pass.bad_count[k], pass.bad_first[k]);
    kernels::signmag_nonfinite_range(args.grad, args.residual, pass.r_out, b0, b1, layout_.bits, pass.packed);
  }

  // One fused pass: per bucket, statistics, then scale and codes (or the non-finite path).
  void encode_buckets(Pass& pass) const {
    const EncodeArgs& args = pass.args;
    const auto coder = policy_.coder(args);
    const float prescale = args.ctx->prescale;
    const std::size_t bucket = layout_.bucket;
    kernels::parallel_chunks(args.numel, layout_.chunk(), args.threads,
                             [&](std::size_t k, std::size_t begin, std::size_t end) {
      for (std::size_t b0 = begin; b0 < end; b0 += bucket) {
        const std::size_t b1 = std::min(end, b0 + bucket);
        const float* g = args.grad + b0;
        const float* r = args.residual ? args.residual + b0 : nullptr;
        const kernels::BucketStats s = policy_.stats(g, r, b1 - b0);
        float wire = std::numeric_limits<float>::quiet_NaN();
        if (s.nonfinite) {
          encode_nonfinite(pass, k, b0, b1, true);
        } else {
          const float scale = policy_.scale(s, g, r, b1 - b0);
          wire = scale * prescale;
          coder.quantize(args.grad, args.residual, pass.r_out, b0, b1, scale, pass.packed, pass.stream_out);
        }
        std::memcpy(pass.scales + (b0 / bucket) * sizeof(float), &wire, sizeof(float));
      }
      kernels::stream_fence(pass.stream_out);
    });
  }

  // bucket=0: one scale for the whole tensor. A statistics pass over the fixed chunks (partials combined in chunk
  // order), then a quantization pass.
  void encode_whole(Pass& pass) const {
    const EncodeArgs& args = pass.args;
    const std::size_t n = args.numel;
    std::vector<kernels::BucketStats> partial(pass.bad.size());
    kernels::parallel_chunks(n, layout_.chunk(), args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
      partial[k] = policy_.stats(args.grad + begin, args.residual ? args.residual + begin : nullptr, end - begin);
    });
    kernels::BucketStats total;
    for (const auto& p : partial) {
      total.max_abs = total.max_abs > p.max_abs ? total.max_abs : p.max_abs;
      total.sum += p.sum;
      total.sum_abs += p.sum_abs;
      total.sum_sq += p.sum_sq;
      total.nonfinite = total.nonfinite || p.nonfinite;
    }
    const float scale = total.nonfinite ? 0.0f : policy_.scale(total, args.grad, args.residual, n);
    const auto coder = policy_.coder(args);
    kernels::parallel_chunks(n, layout_.chunk(), args.threads, [&](std::size_t k, std::size_t begin, std::size_t end) {
      if (total.nonfinite) {
        encode_nonfinite(pass, k, begin, end, partial[k].nonfinite);
      } else {
        coder.quantize(args.grad, args.residual, pass.r_out, begin, end, scale, pass.packed, pass.stream_out);
        kernels::stream_fence(pass.stream_out);
      }
    });
    const float wire = total.nonfinite ? std::numeric_limits<float>::quiet_NaN() : scale * args.ctx->prescale;
    std::memcpy(pass.scales, &wire, sizeof(float));
  }

  BucketLayout layout_;
  Policy policy_;
  std::vector<float> scales_;  // decode scratch
};

// The registry entry of a bucketed quantizer: `params` (the codec's own; lossy_common_params() are appended), the
// traits, and a factory that checks the bucket: a multiple of 8, or also 0 where Policy::kWholeTensor.
template <class Policy>
CompressorInfo bucket_quantizer_info(std::string summary, std::vector<ParamSpec> params) {
  CompressorInfo info;
  info.name = std::string(Policy::kName);
  info.summary = std::move(summary);
  info.traits = bucket_quantizer_traits();
  for (auto& common : lossy_common_params()) params.push_back(std::move(common));
  info.params = params;
  info.factory = [specs = std::move(params)](const Params& values) -> std::unique_ptr<Compressor> {
    check_bucket_multiple(Policy::kName, values.get_int("bucket"), Policy::kWholeTensor);
    return std::make_unique<BucketQuantizer<Policy>>(values, specs);
  };
  return info;
}

}  // namespace gradcomp::quantize
