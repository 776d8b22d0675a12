// The shared harness of the allreduce perf tools, as nccl-tests has one per collective over one common harness: each
// tool (bench/comm/perf/<algorithm>_perf.cc) names its Suite and calls perf_main. For every size: the plain dense
// allreduce, then each spec under the suite's algorithm: time per call (max over ranks, mean over iterations), algbw
// on the uncompressed bytes, wire bytes per rank, speedup over the dense row of the same size, and the max error /
// #wrong of the first call against perf_reference.h. One table per algorithm.
#pragma once

#include "bench/comm/perf/perf_options.h"

namespace gradcomp::perf {

// Parses argv, runs the sweep on MPI (under mpirun) or in-process ranks (--backend local), prints the tables on rank
// 0. Returns the process exit status: 0, 1 when a row had wrong elements or ranks that disagree, 2 on an error.
int perf_main(const Suite& suite, int argc, char** argv);

}  // namespace gradcomp::perf
