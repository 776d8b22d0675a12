// Internals of compressed_allreduce: one function per algorithm over a host tensor, and the helpers they share.
// The public entry point (comm/algorithms/compressed_allreduce.cc) verifies cross-rank agreement, stages device
// tensors, handles the hierarchical mode and dispatches here.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "comm/algorithms/buffer_pool.h"
#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "gradcomp/tensor.h"

namespace gradcomp::algorithms {

// One compressed allreduce in progress. `tensor` is a host tensor.
struct Call {
  Communicator& comm;
  Compressor& compressor;
  TensorView tensor;
  std::string_view name;
  const AllreduceOptions& options;
  AllreduceStats& stats;
};

// summable codecs only: compress with prescale 1/n (kAverage), sum the payload bodies as the wire dtype, decompress.
void run_dense(Call& call);
// allgatherv of every rank's payload, then decompress-and-add in rank order.
void run_allgather(Call& call);
// allgatherv of the payloads and decode-and-add in rank order while the summed payload bytes stay below
// options.sparse_switch_density * 8 * numel; past that, every rank decodes its own and a dense f32 allreduce sums them
// (SparCML's switch).
void run_sparse(Call& call);
// scatter-reduce-allgather over `size` chunks with requantization by the chunk owner.
void run_scatter_reduce_allgather(Call& call);

// Throws InvalidArgument on every rank unless all ranks call with the same (name, numel, dtype, spec, algorithm, op,
// hierarchical). One allgather of a 24-byte fingerprint; a second exchange of the descriptions on mismatch.
void verify_agreement(Communicator& comm, const Compressor& compressor, const TensorView& tensor, std::string_view name,
                      const AllreduceOptions& options);

// ---- helpers ----

// A byte buffer that is not zero-filled on allocation (payload buffers are large and written by the codec). Large
// blocks come from and return to the per-thread pool of buffer_pool.h.
class Bytes {
 public:
  explicit Bytes(std::size_t capacity) : block_(acquire_block(capacity)), size_(capacity) {}
  Bytes(Bytes&&) noexcept = default;
  Bytes& operator=(Bytes&& other) noexcept {
    release_block(std::move(block_));
    block_ = std::move(other.block_);
    size_ = other.size_;
    return *this;
  }
  ~Bytes() { release_block(std::move(block_)); }
  std::byte* data() const { return block_.data.get(); }
  std::size_t size() const { return size_; }
  void shrink(std::size_t size) { size_ = size; }
  std::byte* begin() const { return data(); }
  std::byte* end() const { return data() + size_; }
  operator std::span<const std::byte>() const { return {data(), size_}; }
  operator std::span<std::byte>() { return {data(), size_}; }

 private:
  PooledBlock block_;
  std::size_t size_;
};

// Compresses `part` under `name` (ctx.step from options, rank/size from comm) into a buffer of exactly the payload
// size; adds the time to stats.compress_s. `segments` (see TensorSegment) key its error-feedback state; empty: `name`.
Bytes compress_part(Call& call, const TensorView& part, std::string_view name, float prescale,
                    std::span<const TensorSegment> segments = {});

// The segments of elements [begin, begin + count) of the call's tensor, offsets relative to `begin`: the options'
// segments cut to that range, or one segment of call.name when the options have none.
std::vector<TensorSegment> segments_in(const Call& call, std::size_t begin, std::size_t count);

// Reads `in` (f32, f16 or bf16) into f32 `out` (same numel).
void load_f32(const TensorView& in, std::span<float> out);

// Writes f32 `values` into `out` (f32 copy, or rounding to f16/bf16). No-op when out aliases values.
void store_f32(std::span<const float> values, const TensorView& out);

// Bytes one rank sends in a ring allreduce of `bytes` over n ranks: 2(n-1)/n * bytes.
std::size_t ring_allreduce_bytes(std::size_t bytes, int n);
// Bytes one rank sends in a ring allgather of blocks totalling `total` over n ranks: (n-1)/n * total.
std::size_t ring_allgather_bytes(std::size_t total, int n);

// Allgather of one u64 per rank.
std::vector<std::uint64_t> allgather_u64(Communicator& comm, std::uint64_t value);

// Seconds since construction, added to a stats field on stop().
class Stopwatch {
 public:
  explicit Stopwatch(double& sink) : sink_(sink), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { stop(); }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    sink_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& sink_;
  std::chrono::steady_clock::time_point start_;
  bool stopped_ = false;
};

}  // namespace gradcomp::algorithms
