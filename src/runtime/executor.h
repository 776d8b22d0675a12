// Executes fusion groups on the background thread: picks the codec (resolving "auto"), packs the fusion buffer, runs
// one compressed_allreduce and scatters the result back.
//
// Error feedback and fusion. The buffer is passed to compressed_allreduce with one TensorSegment per member, so the
// codec keeps each member's error-feedback state (residual, DGC momentum) under the member's own name, whatever
// buffer it rides in, whatever its neighbours, and under every algorithm (scatter-reduce-allgather cuts segments at
// chunk boundaries). The non-finite policy applies per member: raise names the member, skip sends zeros for that
// member only. The runtime keeps no residual of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/algorithms/buffer_pool.h"
#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "compressors/state_io.h"
#include "gradcomp/runtime.h"
#include "src/runtime/fusion.h"
#include "src/runtime/timeline.h"

namespace gradcomp::runtime {

// A compressor instance plus what the runtime knows about it (one per canonical spec).
struct Codec {
  std::string spec;  // canonical spec
  std::unique_ptr<Compressor> compressor;
  CompressorTraits traits;
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

  // One member of a group: what negotiation decided, and what this rank's request brought.
  struct Member {
    const ReadyTensor* ready = nullptr;
    TensorView tensor;
    Compressor* compressor = nullptr;  // the owner's (every member of a group has the same), or null
    std::string_view user_name;        // the name as submitted (an owner's compressor keys its state by it)
    std::uint64_t step = kStepOfCall;  // the owner's step, or kStepOfCall: counted per name here
  };
  // Runs one group (collective: every rank calls it with the same group).
  BufferRecord execute(const FusionGroup& group, const std::vector<Member>& members);

  // Copy of the error-feedback residual of `name` kept by any codec instance (empty when none).
  std::vector<float> residual(const std::string& name) const;

  // Everything that determines the results of later execute() calls: every codec instance's state (per-name
  // residuals and momenta), the per-buffer step counters and the "auto" calibration. Only while no execute() runs
  // (the runtime checks that no work is pending).
  void save_state(ByteWriter& writer) const;
  // Replaces that state with one written by save_state(). All-or-nothing: on any error (CorruptPayload for damaged
  // bytes, InvalidArgument for a codec state that does not fit its spec) nothing changes. Returns the loaded
  // residuals' shapes, so that the runtime can check later submissions against them.
  struct ResidualShape {
    std::size_t numel = 0;
    std::string spec;  // canonical spec of the codec the residual was kept for
  };
  std::map<std::string, ResidualShape> load_state(ByteReader& reader);
  const AutoModel& auto_model() const { return model_; }

 private:
  Codec& codec_for(const std::string& spec);
  void calibrate();
  std::string choose_auto(std::size_t bytes, BufferRecord& record);

  Communicator& comm_;
  RuntimeOptions options_;
  Timeline* timeline_;
  mutable std::mutex codecs_mutex_;      // residual() reads codec state from other threads
  std::map<std::string, Codec> codecs_;  // key: canonical spec
  std::map<std::string, std::uint64_t> steps_;  // per tensor name: reductions so far (its codec's step)
  std::vector<TensorSegment> segments_;
  algorithms::BlockPool fusion_pool_{algorithms::host_allocator()};  // host fusion buffers (used by the cycle thread)
  AutoModel model_;
};

}  // namespace gradcomp::runtime
