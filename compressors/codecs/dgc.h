// `dgc`: Deep Gradient Compression (Lin et al., ICLR 2018). Per tensor, with momentum buffer u and accumulator v
// (v is DGC's error feedback, the residual buffer; u is an extra state buffer):
//   g <- g * min(1, clip / ||g||)                     local gradient clipping (clip = 0: off)
//   u <- m*u + g;  v <- v + u                         momentum correction (nesterov: u <- m*(u+g); v <- v + u + g)
//   threshold <- k_s-th largest |v| of a Philox sample of ~sample*n positions; select |v| >= threshold, then refine:
//   more than 1.3k selected -> exact top-k among them; fewer than 0.7k -> exact top-k of v
//   send (int32 index, v) of the selection; zero u and v there (momentum-factor masking)
// Density follows the warm-up schedule 25%, 6.25%, 1.5625%, 0.390625% (warmup_steps steps each), then `ratio`.
// Gatherable, lossy. Payload as topk's (compressors/codecs/sparse_payload.h) with f32 values. See docs/sparsifiers.md.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo dgc_compressor_info();

// Indices of TensorState::scalars that dgc fills after each compress, for diagnostics and tests.
enum DgcScalar : std::size_t {
  kDgcThreshold = 0,      // magnitude threshold from the sample (0 when selection was exact from the start)
  kDgcSampledCount = 1,   // elements at or above the sampled threshold
  kDgcTargetK = 2,        // k of this step's density
  kDgcPath = 3,           // 0 = sampled threshold accepted, 1 = refined among candidates, 2 = exact top-k
  kDgcScalarCount = 4,
};

}  // namespace gradcomp
