// `powersgd`: PowerSGD low-rank compression (Vogels et al., NeurIPS 2019). Each gradient is viewed as a matrix
// (PyTorch's convention: first dimension x the rest; TensorView::rows / TensorSegment::rows) and approximated with
// rank R by one step of subspace iteration shared by all ranks:
//   M = G + residual;  P = M Q;  allreduce(P);  orthonormalize P;  Q = M^T P;  allreduce(Q);
//   result = P Q^T (Q averaged for op average);  residual = M - P Q_avg^T;  Q is kept for the next step (warm start).
// Two summable rounds with computation between them: traits().rounds, reduced by compressed_allreduce's rounds
// algorithm. Vectors, tensors before `start_step`, and matrices that would not shrink by `min_compression_rate`
// travel uncompressed in the first round.
//
// Parameters: rank, warm_start, start_step, min_compression_rate, orth_eps, seed, ef, nonfinite (see the table in
// README.md). A matrix (both dimensions >= 2) needs rank < min(rows, cols): otherwise InvalidArgument names it.
//
// compress()/decompress() (host tensors) give the one-rank reduction as a self-describing payload, for the
// allgather algorithm, probes and tests: header param0 = rank, param1 = compressed blocks; section 0 = per block
// {u64 offset, u64 numel, u32 rows, u32 rank}; section 1 = per block P^T (rank x rows) then Q^T (rank x cols), f32;
// section 2 = the uncompressed elements in order, f32.
#pragma once

#include "gradcomp/registry.h"

namespace gradcomp {

CompressorInfo powersgd_compressor_info();

}  // namespace gradcomp
