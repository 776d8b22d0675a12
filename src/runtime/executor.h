// Executes fusion groups on the background thread: picks the codec (resolving "auto"), applies error feedback per
// tensor name, packs the fusion buffer, runs one compressed_allreduce and scatters the result back.
//
// Error feedback and fusion. A fused buffer is compressed as one tensor, so the codec's own residual (keyed by the
// name it is given) would belong to the buffer's composition, which changes with the threshold and the arrival order.
// Instead, for f32 tensors with a lossy codec whose spec says ef=on, the runtime keeps one residual per tensor name
// and runs the codec with ef=off: it packs v = g + r(name) into the buffer, remembers v in r(name), and after the
// collective subtracts what this rank transmitted, decoded from its own payload (captured as the collective
// compresses it; recomputed if the algorithm compressed only chunks). r(name) = v - transmitted is exact whatever
// the grouping. For f16/bf16 tensors with such a codec the runtime does not fuse: each travels alone under its own
// name, so the codec's native residual is keyed right. Codec state other than the residual (e.g. DGC momentum)
// follows the buffer's composition, which is stable in steady state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "compressors/state_io.h"
#include "gradcomp/runtime.h"
#include "src/runtime/fusion.h"
#include "src/runtime/timeline.h"

namespace gradcomp::runtime {

// A compressor instance plus what the runtime knows about it.
struct Codec {
  std::string spec;  // canonical spec as requested (ef as the user asked)
  std::unique_ptr<Compressor> compressor;
  // With runtime_ef: the codec as requested (own error feedback), for what the collective compresses besides the
  // fusion buffer (scatter-reduce-allgather's re-quantized sums, keyed "<buffer>#sra<rank>").
  std::unique_ptr<Compressor> second;
  CompressorTraits traits;
  bool runtime_ef = false;  // the runtime keeps the residuals (compressor runs with ef=off)
};

// Calibration of the "auto" policy (identical on every rank: rank 0's measurements are broadcast).
struct AutoModel {
  bool ready = false;
  double link_bytes_per_s = 0;
  struct Candidate {
    std::string spec;
    double compress_bytes_per_s = 0;    // input bytes per second
    double decompress_bytes_per_s = 0;  // output bytes per second, one payload
    double payload_ratio = 1;           // payload bytes / input bytes
    CompressorTraits traits;
  };
  std::vector<Candidate> candidates;

  // Predicted seconds to allreduce `bytes` with candidate `c` over `world` ranks ("none" = dense).
  double predict(const Candidate& c, std::size_t bytes, int world) const;
  double predict_dense(std::size_t bytes, int world) const;
};

class Executor {
 public:
  Executor(Communicator& comm, const RuntimeOptions& options, Timeline* timeline);

  // Whether a tensor of this signature may share a buffer with others.
  bool fusible(const Signature& signature);
  // Runs one group (collective: every rank calls it with the same group). `tensors[i]` is the view of member i.
  BufferRecord execute(const FusionGroup& group, const std::vector<const ReadyTensor*>& members,
                       const std::vector<TensorView>& tensors);

  // Copy of the residual of `name` (thread-safe).
  std::vector<float> residual(const std::string& name) const;

  // Everything that determines the results of later execute() calls: every codec instance's state (including the
  // second instance of runtime-EF codecs), the per-name residuals, the per-buffer step counters and the "auto"
  // calibration. Only while no execute() runs (the runtime checks that no work is pending).
  void save_state(ByteWriter& writer) const;
  // Replaces that state with one written by save_state(). All-or-nothing: on any error (CorruptPayload for damaged
  // bytes, InvalidArgument for a codec state that does not fit its spec) nothing changes. Returns the loaded
  // residuals' shapes, so that the runtime can check later submissions against them.
  struct ResidualShape {
    std::size_t numel = 0;
    std::string spec;  // canonical spec (ef=on) of the codec the residual was kept for
  };
  std::map<std::string, ResidualShape> load_state(ByteReader& reader);
  const AutoModel& auto_model() const { return model_; }

 private:
  Codec& codec_for(const std::string& spec, DType dtype);
  void calibrate();
  std::string choose_auto(std::size_t bytes, BufferRecord& record);

  Communicator& comm_;
  RuntimeOptions options_;
  Timeline* timeline_;
  std::map<std::string, Codec> codecs_;  // key: spec + '|' + runtime_ef
  mutable std::mutex residual_mutex_;
  std::map<std::string, std::vector<float>, std::less<>> residuals_;
  std::map<std::string, std::string> residual_specs_;  // name -> spec of the codec its residual belongs to
  std::map<std::string, std::uint64_t> steps_;  // per buffer name
  FusionArena arena_;
  std::vector<float> scratch_;
  std::vector<std::byte> payload_scratch_;
  AutoModel model_;
};

}  // namespace gradcomp::runtime
