// Modeled codecs for GPU-class predictions in the simulated build (bench/sim). "sim_<codec>:<params>,gbps=G" is the
// real codec's traits, payload sizes and algorithm choice, with its work replaced by simulated time: each pass over
// the tensor (compress reads it, decompress writes it) costs bytes / G GB/s, charged with smpi_execute_benched(), and
// nothing reads or writes tensor data. That is what lets 1,024 ranks of 100 MB run on two cores, with every large
// buffer folded into one shared block (GRADCOMP_SIM_SHARED_BYTES): the data are garbage, the schedule is real.
#pragma once

namespace gradcomp::sim {

// Registers sim_none, sim_fp16, sim_qsgd, sim_topk, sim_dgc and sim_powersgd in default_registry(): each takes its
// real codec's parameters plus gbps (codec throughput per pass, GB/s of f32 input; default 1000).
void register_modeled_codecs();

}  // namespace gradcomp::sim
