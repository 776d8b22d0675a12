// comm/local: N ranks as threads of one process. Every collective is two rendezvous on a shared group: each rank
// posts what it sends, waits until all have posted (a timed barrier), reads what it needs from the others' posts,
// and waits again so nobody reuses a buffer another rank still reads. Reductions run in rank order, so every rank
// computes bit-identical results.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/comm_env.h"
#include "comm/host_reduce.h"
#include "comm/timed_communicator.h"
#include "gradcomp/communicator.h"
#include "gradcomp/error.h"

namespace gradcomp {
namespace {

enum class Op { kAllreduce, kAllgather, kAllgatherv, kAlltoallv, kBroadcast, kBarrier, kSplit };

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kAllreduce: return "allreduce";
    case Op::kAllgather: return "allgather";
    case Op::kAllgatherv: return "allgatherv";
    case Op::kAlltoallv: return "alltoallv";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
    case Op::kSplit: return "split";
  }
  return "?";
}

// What one rank posted for the current collective.
struct Post {
  Op op = Op::kBarrier;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::vector<std::size_t> offsets;  // alltoallv: where each destination's block starts in `data`
  std::vector<std::size_t> counts;   // alltoallv: bytes for each destination
  long long a = 0, b = 0;            // op-specific: (dtype, op) for allreduce, root for broadcast, (color, key)
  std::shared_ptr<void> object;      // split: the child group created by the color's lowest rank
};

class LocalGroup {
 public:
  explicit LocalGroup(int size) : size_(size), posts_(size), calls_(size, 0), departed_(size, false) {}

  int size() const { return size_; }
  Post& post(int rank) { return posts_[rank]; }
  const Post& post(int rank) const { return posts_[rank]; }

  // Timed barrier. Throws Timeout naming the ranks that did not arrive, CommError when the group is broken or a
  // rank that has not arrived destroyed its communicator.
  void arrive(int rank, Op op, std::chrono::milliseconds timeout) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_broken(rank, op);
    const std::uint64_t generation = generation_;
    ++calls_[rank];
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == generation) {
      if (broken_) {
        throw CommError(fmt::format("local communicator: {} on rank {} of {} failed: {}", op_name(op), rank, size_,
                                    reason_));
      }
      for (int r = 0; r < size_; ++r) {
        if (departed_[r] && calls_[r] < calls_[rank]) {
          fail_locked(fmt::format("rank {} destroyed its communicator before joining {} #{}", r, op_name(op),
                                  calls_[rank]));
          throw CommError(fmt::format("local communicator: {} on rank {} of {} failed: {}", op_name(op), rank, size_,
                                      reason_));
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation) {
        std::vector<int> missing;
        for (int r = 0; r < size_; ++r) {
          if (calls_[r] < calls_[rank]) missing.push_back(r);
        }
        fail_locked(fmt::format("{} timed out on rank {} after {} ms waiting for rank(s) {}", op_name(op), rank,
                                comm::ms_since(start), fmt::join(missing, ", ")));
        throw Timeout(fmt::format("local communicator: {} on rank {} of {} timed out after {} ms (limit {} ms): "
                                  "rank(s) {} did not arrive",
                                  op_name(op), rank, size_, comm::ms_since(start), timeout.count(),
                                  fmt::join(missing, ", ")));
      }
    }
  }

  // Marks the group broken (others fail fast) with `reason`.
  void fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_locked(reason);
  }

  void depart(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    departed_[rank] = true;
    cv_.notify_all();
  }

 private:
  void throw_if_broken(int rank, Op op) {
    if (broken_) {
      throw CommError(fmt::format("local communicator: {} on rank {} of {} refused: the group is broken ({})",
                                  op_name(op), rank, size_, reason_));
    }
  }
  void fail_locked(const std::string& reason) {
    if (!broken_) {
      broken_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }

  const int size_;
  std::vector<Post> posts_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<std::uint64_t> calls_;
  std::vector<bool> departed_;
  bool broken_ = false;
  std::string reason_;
};

class LocalCommunicator final : public comm::TimedCommunicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank, std::chrono::milliseconds timeout)
      : TimedCommunicator(timeout), group_(std::move(group)), rank_(rank) {}
  ~LocalCommunicator() override { group_->depart(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "local"; }

  void allreduce(const TensorView& inout, ReduceOp op) override {
    require_memory(Memory::of(inout), "allreduce");
    require_reduce(inout.dtype(), op);
    const auto* bytes = static_cast<const std::byte*>(inout.data());
    scratch_.assign(bytes, bytes + inout.bytes());
    Post& mine = begin(Op::kAllreduce, scratch_.data(), scratch_.size());
    mine.a = static_cast<long long>(inout.dtype());
    mine.b = static_cast<long long>(op);
    sync(Op::kAllreduce);
    expect_same_bytes(Op::kAllreduce);
    for (int r = 0; r < size(); ++r) {
      const Post& other = group_->post(r);
      if (other.a != mine.a || other.b != mine.b) {
        fail_protocol(fmt::format("allreduce: rank {} reduces {} with '{}' but rank {} reduces {} with '{}'", rank_,
                                  dtype_name(inout.dtype()), reduce_op_name(op), r,
                                  dtype_name(static_cast<DType>(other.a)),
                                  reduce_op_name(static_cast<ReduceOp>(other.b))));
      }
    }
    if (inout.bytes() > 0) {
      std::memcpy(inout.data(), group_->post(0).data, inout.bytes());
      for (int r = 1; r < size(); ++r) reduce_into(inout, group_->post(r).data, op);
      if (op == ReduceOp::kAverage) comm::divide_by(inout.data(), inout.numel(), inout.dtype(), size());
    }
    sync_end(Op::kAllreduce);
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgather");
    GRADCOMP_CHECK(recv.size() == send.size() * static_cast<std::size_t>(size()),
                   "local communicator: allgather on rank {} needs a receive buffer of {} x {} bytes, got {}", rank_,
                   size(), send.size(), recv.size());
    begin(Op::kAllgather, send.data(), send.size());
    sync(Op::kAllgather);
    expect_same_bytes(Op::kAllgather);
    for (int r = 0; r < size(); ++r) copy(group_->post(r).data, recv.data() + r * send.size(), send.size());
    sync_end(Op::kAllgather);
  }

  void allgatherv(std::span<const std::byte> send, std::span<const std::size_t> recv_counts,
                  std::span<std::byte> recv, Memory memory) override {
    require_memory(memory, "allgatherv");
    check_counts(recv_counts, recv.size(), "allgatherv");
    begin(Op::kAllgatherv, send.data(), send.size());
    sync(Op::kAllgatherv);
    std::size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      const Post& other = group_->post(r);
      if (other.bytes != recv_counts[r]) {
        fail_protocol(fmt::format("allgatherv: rank {} expects {} bytes from rank {}, which sends {}", rank_,
                                  recv_counts[r], r, other.bytes));
      }
      copy(other.data, recv.data() + offset, other.bytes);
      offset += other.bytes;
    }
    sync_end(Op::kAllgatherv);
  }

  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts, Memory memory) override {
    require_memory(memory, "alltoallv");
    check_counts(recv_counts, recv.size(), "alltoallv (receive)");
    check_counts(send_counts, send.size(), "alltoallv (send)");
    Post& mine = begin(Op::kAlltoallv, send.data(), send.size());
    mine.counts.assign(send_counts.begin(), send_counts.end());
    mine.offsets.assign(size(), 0);
    for (int d = 1; d < size(); ++d) mine.offsets[d] = mine.offsets[d - 1] + send_counts[d - 1];
    sync(Op::kAlltoallv);
    std::size_t offset = 0;
    for (int s = 0; s < size(); ++s) {
      const Post& other = group_->post(s);
      if (other.counts[rank_] != recv_counts[s]) {
        fail_protocol(fmt::format("alltoallv: rank {} expects {} bytes from rank {}, which sends {}", rank_,
                                  recv_counts[s], s, other.counts[rank_]));
      }
      copy(other.data + other.offsets[rank_], recv.data() + offset, recv_counts[s]);
      offset += recv_counts[s];
    }
    sync_end(Op::kAlltoallv);
  }

  void broadcast(std::span<std::byte> buffer, int root, Memory memory) override {
    require_memory(memory, "broadcast");
    GRADCOMP_CHECK(root >= 0 && root < size(), "local communicator: broadcast root {} out of range [0, {})", root,
                   size());
    Post& mine = begin(Op::kBroadcast, buffer.data(), buffer.size());
    mine.a = root;
    sync(Op::kBroadcast);
    expect_same_bytes(Op::kBroadcast);
    for (int r = 0; r < size(); ++r) {
      if (group_->post(r).a != root) {
        fail_protocol(fmt::format("broadcast: rank {} uses root {} but rank {} uses root {}", rank_, root, r,
                                  group_->post(r).a));
      }
    }
    if (rank_ != root) copy(group_->post(root).data, buffer.data(), buffer.size());
    sync_end(Op::kBroadcast);
  }

  void barrier() override {
    begin(Op::kBarrier, nullptr, 0);
    sync(Op::kBarrier);
    sync_end(Op::kBarrier);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    Post& mine = begin(Op::kSplit, nullptr, 0);
    mine.a = color;
    mine.b = key;
    mine.object.reset();
    sync(Op::kSplit);
    // Members of my color ordered by (key, old rank).
    std::vector<int> members;
    for (int r = 0; r < size(); ++r) {
      if (color >= 0 && group_->post(r).a == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int x, int y) { return group_->post(x).b < group_->post(y).b; });
    const bool creator = !members.empty() && *std::min_element(members.begin(), members.end()) == rank_;
    if (creator) mine.object = std::make_shared<LocalGroup>(static_cast<int>(members.size()));
    sync(Op::kSplit);
    std::unique_ptr<Communicator> child;
    if (!members.empty()) {
      const int creator_rank = *std::min_element(members.begin(), members.end());
      auto group = std::static_pointer_cast<LocalGroup>(group_->post(creator_rank).object);
      const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
      child = std::make_unique<LocalCommunicator>(std::move(group), new_rank, timeout_);
    }
    sync_end(Op::kSplit);
    mine.object.reset();
    return child;
  }

 private:
  Post& begin(Op op, const std::byte* data, std::size_t bytes) {
    Post& mine = group_->post(rank_);
    mine.op = op;
    mine.data = data;
    mine.bytes = bytes;
    return mine;
  }

  // A timed barrier, then a check that every rank is in the same collective.
  void sync(Op op) {
    group_->arrive(rank_, op, timeout_);
    for (int r = 0; r < size(); ++r) {
      if (group_->post(r).op != op) {
        fail_protocol(fmt::format("rank {} called {} while rank {} called {}", rank_, op_name(op), r,
                                  op_name(group_->post(r).op)));
      }
    }
  }

  // The closing barrier of a collective: after it, a fast rank may already post its next call, so no checks.
  void sync_end(Op op) { group_->arrive(rank_, op, timeout_); }

  void expect_same_bytes(Op op) {
    for (int r = 0; r < size(); ++r) {
      if (group_->post(r).bytes != group_->post(rank_).bytes) {
        fail_protocol(fmt::format("{}: rank {} contributes {} bytes but rank {} contributes {}", op_name(op), rank_,
                                  group_->post(rank_).bytes, r, group_->post(r).bytes));
      }
    }
  }

  [[noreturn]] void fail_protocol(const std::string& what) {
    group_->fail(what);
    throw CommError(fmt::format("local communicator (rank {} of {}): collective mismatch: {}", rank_, size(), what));
  }

  void check_counts(std::span<const std::size_t> counts, std::size_t total, std::string_view what) const {
    GRADCOMP_CHECK(counts.size() == static_cast<std::size_t>(size()),
                   "local communicator: {} on rank {} needs {} counts, got {}", what, rank_, size(), counts.size());
    const std::size_t sum = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    GRADCOMP_CHECK(sum == total, "local communicator: {} on rank {}: counts add up to {} bytes, buffer has {}", what,
                   rank_, sum, total);
  }

  static void copy(const std::byte* from, std::byte* to, std::size_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);
  }

  static void reduce_into(const TensorView& acc, const std::byte* in, ReduceOp op) {
    comm::reduce_into(acc.data(), in, acc.numel(), acc.dtype(), op);
  }

  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::vector<std::byte> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_communicators(int world_size,
                                                                    std::chrono::milliseconds timeout) {
  GRADCOMP_CHECK(world_size >= 1, "make_local_communicators: world size must be >= 1, got {}", world_size);
  GRADCOMP_CHECK(timeout.count() > 0, "make_local_communicators: timeout must be positive, got {} ms",
                 timeout.count());
  auto group = std::make_shared<LocalGroup>(world_size);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(world_size);
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_unique<LocalCommunicator>(group, r, timeout));
  return comms;
}

}  // namespace gradcomp
