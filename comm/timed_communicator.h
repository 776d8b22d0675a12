// The deadline every backend keeps the same way (local, mpi, nccl): one value, read by timeout(), changed by
// set_timeout() after a check that it is positive.
#pragma once

#include <chrono>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"

namespace gradcomp::comm {

// A Communicator whose timeout() is the stored `timeout_`; a backend derives from it and reads `timeout_` in its
// waits. set_timeout() throws InvalidArgument ("<backend> communicator: timeout must be positive") on a value <= 0.
class TimedCommunicator : public Communicator {
 public:
  std::chrono::milliseconds timeout() const final { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) final {
    GRADCOMP_CHECK(timeout.count() > 0, "{} communicator: timeout must be positive, got {} ms", backend(),
                   timeout.count());
    timeout_ = timeout;
  }

 protected:
  explicit TimedCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  std::chrono::milliseconds timeout_;
};

}  // namespace gradcomp::comm
