// The Communicator API's own definitions: reduce op names, the default deadline, the node color, the memory check,
// alltoall as an alltoallv.
#include <vector>

#include <fmt/format.h>

#include "comm/comm_env.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"
#include "src/core/env.h"

namespace gradcomp {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

std::chrono::milliseconds default_comm_timeout() {
  const auto seconds = env::number("GRADCOMP_TIMEOUT_S", 1e-3, 1e7, "seconds");
  return std::chrono::milliseconds(seconds ? static_cast<long long>(*seconds * 1000.0 + 0.5) : 60000);
}

int Communicator::node_color() {
  if (const auto local = comm::local_size_from_env()) return rank() / *local;
  return 0;
}

void Communicator::alltoall(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) {
  const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), alltoall_block(send, recv));
  alltoallv(send, counts, recv, counts, memory);
}

std::size_t Communicator::alltoall_block(std::span<const std::byte> send, std::span<std::byte> recv) const {
  const auto n = static_cast<std::size_t>(size());
  GRADCOMP_CHECK(send.size() == recv.size() && send.size() % n == 0,
                 "{} communicator (rank {} of {}): alltoall needs send and receive buffers of one equal block per "
                 "rank, got {} and {} bytes",
                 backend(), rank(), size(), send.size(), recv.size());
  return send.size() / n;
}

void Communicator::require_memory(Memory memory, std::string_view op) const {
  if (takes(memory.device)) return;
  throw InvalidArgument(fmt::format("{} communicator (rank {} of {}): {} got buffers on {}, which this backend does "
                                    "not take (it takes {}); stage them through host memory first",
                                    backend(), rank(), size(), op, device_name(memory.device),
                                    takes(Device::cuda(0)) ? "host and CUDA memory" : "host memory"));
}

void Communicator::require_reduce(DType dtype, ReduceOp op) const {
  bool ok = false;
  switch (op) {
    case ReduceOp::kSum: ok = true; break;
    case ReduceOp::kAverage: ok = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16; break;
    case ReduceOp::kMax:
    case ReduceOp::kMin: ok = dtype == DType::kF32 || dtype == DType::kI32 || dtype == DType::kU8; break;
  }
  GRADCOMP_CHECK(ok, "{} communicator (rank {}): allreduce '{}' is not defined for {} tensors", backend(), rank(),
                 reduce_op_name(op), dtype_name(dtype));
}

}  // namespace gradcomp
