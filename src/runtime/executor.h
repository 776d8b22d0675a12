// Executes fusion groups: picks the codec (resolving "auto") on the negotiation thread, then, on that thread or on a
// pipeline lane, packs the fusion buffer, runs one compressed_allreduce and scatters the result back.
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
#include "comm/algorithms/memory_space.h"
#include "gradcomp/collectives.h"
#include "gradcomp/communicator.h"
#include "gradcomp/compressor.h"
#include "compressors/framework/state_io.h"
#include "gradcomp/runtime.h"
#include "src/runtime/fusion.h"
#include "src/runtime/timeline.h"

namespace gradcomp::runtime {

// A compressor instance plus what the runtime knows about it (one per canonical spec).
struct Codec {
  std::string spec;  // canonical spec
  std::unique_ptr<Compressor> compressor;
  CompressorTraits traits;
  std::unique_ptr<std::mutex> mutex = std::make_unique<std::mutex>();  // held around every call into `compressor`
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
    std::string name;       // the negotiated key (scope included)
    std::string user_name;  // the name as submitted (an owner's compressor keys its state by it)
    TensorView tensor;
    Compressor* compressor = nullptr;  // the owner's (every member of a group has the same), or null
    std::uint64_t step = kStepOfCall;  // the owner's step, or kStepOfCall: counted per name here
    // A part of a tensor (src/runtime/partition.h): `tensor` holds its elements [start, start + numel) of a tensor of
    // `total` elements (0: the whole tensor).
    std::size_t start = 0;
    std::size_t total = 0;
  };

  // A group ready to run: its codec and every member's step, decided on the negotiation thread in group order on
  // every rank (the "auto" calibration is a collective on the runtime's communicator; the steps count per name).
  struct Prepared {
    FusionGroup group;
    std::vector<Member> members;
    Compressor* compressor = nullptr;  // the codec instance (the runtime's, or the owner's)
    std::mutex* codec_mutex = nullptr;  // held around every call into it (lanes share instances)
    bool on_device = false;             // CUDA tensors: the buffer lives on the first member's device
    // Host members of a codec that encodes parts (GatherCodec: none, fp16, bf16) under the dense algorithm: encoded
    // from and decoded into the members' own memory, with no fusion buffer and no copy.
    bool gather = false;
    BufferRecord record;                // the "auto" decision, filled further by run()
  };
  Prepared prepare(const FusionGroup& group, std::vector<Member> members);
  // Packs, reduces and unpacks a prepared group over `data` (collective: every rank runs the same groups on it in the
  // same order). `pool` serves host fusion buffers and must belong to the calling thread. Safe beside run() of other
  // groups on other threads and communicators, and beside prepare() on the negotiation thread.
  BufferRecord run(Prepared& prepared, Communicator& data, algorithms::BlockPool& pool, int lane);
  // prepare() then run() on the runtime's communicator, on the calling thread (the unpipelined path).
  BufferRecord execute(const FusionGroup& group, std::vector<Member> members);

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
  // A group's fusion buffer on its way through run(): where it lives, its name for the codec and its segments.
  struct Packed {
    std::unique_ptr<algorithms::MemorySpace> device_space;  // CUDA groups: the first member's device and stream
    algorithms::MemorySpace* space = nullptr;              // the host's or device_space
    algorithms::Bytes storage{0};                          // the fusion buffer (empty for a group of one)
    TensorView buffer;                                     // what the collective reduces (unset when gathered)
    std::vector<TensorView> parts;                         // gathered: the members, reduced in place
    std::string name;
    std::vector<TensorSegment> segments;
  };
  // The parts of run(): copy the members in (a group of one, and a gathered group, stay in the caller's memory),
  // reduce the buffer (or the gathered members) with the group's codec (stats and timeline into `record`), copy the
  // result back out.
  Packed pack(const Prepared& prepared, algorithms::BlockPool& pool, BufferRecord& record, int row);
  void reduce(Packed& packed, const Prepared& prepared, Communicator& data, Compressor& compressor,
              BufferRecord& record, int row);
  void unpack(const Packed& packed, const Prepared& prepared, BufferRecord& record, int row);

  Codec& codec_for(const std::string& spec);
  void calibrate();
  std::string choose_auto(std::size_t bytes, BufferRecord& record);

  Communicator& comm_;
  RuntimeOptions options_;
  Timeline* timeline_;
  mutable std::mutex codecs_mutex_;      // the maps below; residual() reads codec state from other threads
  std::map<std::string, Codec> codecs_;  // key: canonical spec
  std::map<const Compressor*, std::unique_ptr<std::mutex>> owner_mutexes_;  // owners' compressors
  std::map<std::string, std::uint64_t> steps_;  // per tensor name: reductions so far (its codec's step)
  algorithms::BlockPool fusion_pool_{algorithms::host_allocator()};  // host fusion buffers of execute()
  AutoModel model_;
};

}  // namespace gradcomp::runtime
