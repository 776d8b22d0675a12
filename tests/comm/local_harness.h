// Runs a function on N in-process ranks (threads over comm/local) and rethrows the first failure.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gradcomp/communicator.h"

namespace gradcomp::testing {

// Calls fn(comm) on `ranks` threads; exceptions are collected per rank and returned (empty = none).
inline std::vector<std::exception_ptr> run_ranks_collect(int ranks, const std::function<void(Communicator&)>& fn,
                                                         std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto comms = make_local_communicators(ranks, timeout);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Like run_ranks_collect, but rethrows the first rank's exception.
inline void run_ranks(int ranks, const std::function<void(Communicator&)>& fn,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  for (auto& error : run_ranks_collect(ranks, fn, timeout)) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace gradcomp::testing
