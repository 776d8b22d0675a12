// Fault injection under mpirun (tests/comm/mpi_fault_check.sh runs it and counts the verdicts). Every rank prints one
// line, "PASS rank R of N (role): ..." or "FAIL rank R of N (role): why", with the measured times.
//
//   stop   the last rank is stopped (SIGSTOP) mid-collective by a helper process and resumed (SIGCONT) after the
//          survivors gave up. Survivors: the stalled call ends within timeout + slack; then every call — allreduce on
//          fresh buffers, a child split before the failure, split() itself — throws CommError at once, before and
//          after the resume (the abandoned collective must not complete into freed memory: no crash, no success).
//          The resumed rank: its next calls throw CommError at once.
//   kill   the last rank is killed (SIGKILL) mid-collective; survivors as above.
//   split  the last rank stops before a collective of a two-rank child {0, last}; rank 0 times out there, and rank 1,
//          waiting in a world allreduce with a long timeout, must get CommError as soon as rank 0 fails (the family
//          is broken on every rank), not at its own deadline.
//   mismatch  rank 1 allgathers 16 bytes where the others allgather 8 (ranks that disagree on a collective's size):
//          every rank prints its verdict (Open MPI must not abort the job through MPI_COMM_WORLD's fatal handler), a
//          rank that received too much gets CommError naming MPI_ERR_TRUNCATE, and every rank's next call fails
//          with CommError within the timeout.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gradcomp/communicator.h"
#include "gradcomp/error.h"

namespace {

using namespace gradcomp;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::milliseconds(2000);
constexpr long long kSlackMs = 1500;   // a failing call may take timeout + this
constexpr long long kRefuseMs = 200;   // a refused call must take less than this

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// The outcome of one call: which exception (or "ok") and how long it took.
struct Outcome {
  std::string kind = "ok";
  std::string message;
  long long ms = 0;
};

template <typename Fn>
Outcome run(Fn&& fn) {
  Outcome outcome;
  const auto start = Clock::now();
  try {
    fn();
  } catch (const Timeout& e) {
    outcome = {"Timeout", e.what(), 0};
  } catch (const CommError& e) {
    outcome = {"CommError", e.what(), 0};
  } catch (const std::exception& e) {
    outcome = {"OtherError", e.what(), 0};
  }
  outcome.ms = ms_since(start);
  return outcome;
}

// A child process that sends `first` to this process after `first_ms`, then `second` after `second_ms` more (0: none).
void spawn_helper(int first, long long first_ms, int second, long long second_ms) {
  const pid_t target = getpid();
  if (fork() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(first_ms));
    kill(target, first);
    if (second != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(second_ms));
      kill(target, second);
    }
    _exit(0);
  }
}

struct Verdict {
  int rank, size;
  const char* role;
  std::string failures, facts;
  void require(bool ok, const std::string& what) {
    if (!ok) failures += (failures.empty() ? "" : "; ") + what;
  }
  void note(const std::string& name, const Outcome& o) {
    facts += " " + name + "=" + o.kind + "/" + std::to_string(o.ms) + "ms";
  }
  // Quotes the message of `o` (for the record in docs/comm.md).
  void quote(const std::string& name, const Outcome& o) { facts += " [" + name + ": " + o.message + "]"; }
  [[noreturn]] void finish() {
    std::printf("%s rank %d of %d (%s):%s%s%s\n", failures.empty() ? "PASS" : "FAIL", rank, size, role, facts.c_str(),
                failures.empty() ? "" : " -- ", failures.c_str());
    std::fflush(stdout);
    std::_Exit(0);  // MPI is unusable after a lost peer: no finalize
  }
};

// A call on a broken communicator: CommError, at once, naming the first failure.
void require_refused(Verdict& v, const std::string& name, const Outcome& o, bool record = true) {
  if (record) v.note(name, o);
  v.require(o.kind == "CommError", name + " gave " + o.kind + ": " + o.message);
  v.require(o.ms < kRefuseMs, name + " took " + std::to_string(o.ms) + " ms");
  v.require(o.kind != "CommError" || o.message.find("broken") != std::string::npos ||
                o.message.find("failed first") != std::string::npos,
            name + " does not name the first failure: " + o.message);
}

// Allreduce steps of 1 MiB until one fails; the failing step's outcome.
Outcome allreduce_until_failure(Communicator& comm, int max_steps) {
  for (int step = 0; step < max_steps; ++step) {
    std::vector<float> x(1 << 18, 1.0f);
    const Outcome o = run([&] { comm.allreduce(TensorView::of(std::span(x)), ReduceOp::kSum); });
    if (o.kind != "ok") return o;
  }
  return Outcome{};
}

// Every later call of a survivor: fresh buffers, the child, split(). `record`: print the outcomes.
void check_refusals(Verdict& v, Communicator& world, Communicator& child, const std::string& when,
                    bool record = true) {
  std::vector<float> fresh(1 << 16, 2.0f);
  const TensorView view = TensorView::of(std::span(fresh));
  const Outcome refused = run([&] { world.allreduce(view, ReduceOp::kSum); });
  require_refused(v, when + "allreduce", refused, record);
  if (record && when.empty()) v.quote("refused", refused);
  std::vector<std::byte> gathered(static_cast<std::size_t>(child.size()) * 8);
  std::byte mine[8] = {};
  require_refused(v, when + "child", run([&] { child.allgather(mine, gathered); }), record);
  require_refused(v, when + "split", run([&] { (void)world.split(0, world.rank()); }), record);
}

void stop_or_kill(Verdict& v, Communicator& world, bool kill_victim) {
  auto child = world.split(0, world.size() - 1 - world.rank());  // every rank, reversed: a member of the family
  std::vector<float> warm(1 << 18, 1.0f);
  world.allreduce(TensorView::of(std::span(warm)), ReduceOp::kSum);
  const bool victim = v.rank == v.size - 1;
  const long long resume_ms = 300 + kTimeout.count() + 2500;
  if (victim) {
    v.role = "victim";
    if (kill_victim) {
      spawn_helper(SIGKILL, 300, 0, 0);
    } else {
      spawn_helper(SIGSTOP, 300, SIGCONT, resume_ms - 300);
    }
  }
  const auto start = Clock::now();
  const Outcome first = allreduce_until_failure(world, 100000);
  v.note("first", first);
  v.quote("first", first);
  if (victim) {  // only a stopped victim gets here: resumed with its deadline long past, or told by a survivor
    v.require(first.kind == "Timeout" || first.kind == "CommError", "victim's first failure: " + first.kind);
    check_refusals(v, world, *child, "resumed-");
    v.finish();
  }
  v.require(first.kind == "Timeout" || first.kind == "CommError", "first failure was " + first.kind);
  v.require(first.ms <= kTimeout.count() + kSlackMs, "first failure took " + std::to_string(first.ms) + " ms");
  check_refusals(v, world, *child, "");
  if (!kill_victim) {
    // Past the resume: the victim's late contributions arrive while refused calls poll MPI; nothing may complete
    // into the buffers freed above, and every call still refuses.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0LL, resume_ms + 700 - ms_since(start) - 300)));
    for (int round = 0; round < 20 && v.failures.empty(); ++round) {
      check_refusals(v, world, *child, "after-resume-", round == 0);
    }
    v.facts += " (20 rounds after resume)";
  }
  v.finish();
}

void split_family(Verdict& v, Communicator& world) {
  const int last = v.size - 1;
  auto pair = world.split(v.rank == 0 || v.rank == last ? 0 : -1, v.rank);
  std::vector<float> warm(1 << 10, 1.0f);
  world.allreduce(TensorView::of(std::span(warm)), ReduceOp::kSum);
  if (v.rank == last) {
    v.role = "victim";
    spawn_helper(SIGCONT, kTimeout.count() + 2000, 0, 0);
    raise(SIGSTOP);
    const Outcome later = run([&] { world.barrier(); });
    require_refused(v, "resumed-barrier", later);
    v.finish();
  }
  std::vector<float> x(1 << 10, 1.0f);
  if (v.rank == 0) {
    v.role = "pair";
    const Outcome first = run([&] { pair->allreduce(TensorView::of(std::span(x)), ReduceOp::kSum); });
    v.note("pair-allreduce", first);
    v.quote("pair-allreduce", first);
    v.require(first.kind == "Timeout", "pair allreduce gave " + first.kind + ": " + first.message);
    v.require(first.ms <= kTimeout.count() + kSlackMs, "pair allreduce took " + std::to_string(first.ms) + " ms");
    require_refused(v, "world-allreduce", run([&] { world.allreduce(TensorView::of(std::span(x)), ReduceOp::kSum); }));
    v.finish();
  }
  v.role = "bystander";
  world.set_timeout(std::chrono::milliseconds(4 * kTimeout.count()));
  const Outcome first = run([&] { world.allreduce(TensorView::of(std::span(x)), ReduceOp::kSum); });
  v.note("world-allreduce", first);
  v.quote("world-allreduce", first);
  v.require(first.kind == "CommError", "world allreduce gave " + first.kind + ": " + first.message);
  v.require(first.ms <= kTimeout.count() + kSlackMs,
            "world allreduce took " + std::to_string(first.ms) + " ms (should end when rank 0 fails, not at 8 s)");
  v.require(first.message.find("rank 0") != std::string::npos, "message does not name rank 0: " + first.message);
  require_refused(v, "next-allreduce", run([&] { world.allreduce(TensorView::of(std::span(x)), ReduceOp::kSum); }));
  v.finish();
}

void mismatched_sizes(Verdict& v, Communicator& world) {
  v.role = v.rank == 1 ? "oversender" : "receiver";
  const std::size_t mine = v.rank == 1 ? 16 : 8;
  std::vector<std::byte> in(mine), out(mine * static_cast<std::size_t>(v.size));
  const Outcome first = run([&] { world.allgather(in, out); });
  v.note("allgather", first);
  if (first.kind != "ok") v.quote("allgather", first);
  v.require(first.kind == "ok" || first.kind == "CommError" || first.kind == "Timeout",
            "allgather gave " + first.kind + ": " + first.message);
  v.require(first.kind != "CommError" || first.message.find("MPI_ERR_TRUNCATE") != std::string::npos ||
                first.message.find("failed first") != std::string::npos,
            "allgather's CommError names neither the truncation nor the first failure: " + first.message);
  v.require(first.ms <= kTimeout.count() + kSlackMs, "allgather took " + std::to_string(first.ms) + " ms");
  const Outcome next = run([&] { world.barrier(); });
  v.note("next-barrier", next);
  v.require(next.kind == "CommError", "the next barrier gave " + next.kind + ": " + next.message);
  v.require(next.ms <= kTimeout.count() + kSlackMs, "the next barrier took " + std::to_string(next.ms) + " ms");
  v.finish();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  MpiOptions options;
  options.timeout = kTimeout;
  auto world = make_mpi_world_communicator(options);
  Verdict v{world->rank(), world->size(), "survivor", "", ""};
  if (world->size() < 3) {
    std::printf("FAIL rank %d: needs at least 3 ranks\n", world->rank());
    return 1;
  }
  if (scenario == "stop" || scenario == "kill") stop_or_kill(v, *world, scenario == "kill");
  if (scenario == "split") split_family(v, *world);
  if (scenario == "mismatch") mismatched_sizes(v, *world);
  std::printf("FAIL rank %d: unknown scenario '%s' (stop, kill, split, mismatch)\n", world->rank(), scenario.c_str());
  return 1;
}
