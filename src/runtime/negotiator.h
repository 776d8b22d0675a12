// Negotiation state of one rank, without any communication: the runtime exchanges the bytes this class produces
// (one fixed-size message per rank per cycle via allgather, plus announcement blobs via allgatherv when some rank has
// new names) and feeds everyone's bytes back in. Every rank then computes the same decisions in the same order.
//
// Protocol (Horovod's response cache, made symmetric):
// - A name that every rank has executed before with the same signature owns a slot of the response cache (slots
//   are assigned identically everywhere, in execution order). In steady state a rank only sets the slot's bit; the
//   allgathered bit vectors are ANDed and full slots run, in slot order. One small collective per cycle.
// - A name that is not cached (new, or submitted with another signature) is announced once with its signature.
//   When every rank has announced it, it runs (equal signatures; it then gets a slot) or fails on every rank with
//   InvalidArgument naming both sides (different signatures).
// - Rank 0's clock bounds waiting: its message carries the oldest cycle still allowed; names that some ranks
//   submitted before it but not all ranks fail with Timeout on the ranks that have them.
// - Rank 0's message also carries the fusion threshold of the cycle, so a threshold changed at run time (on rank 0)
//   changes every rank's grouping at the same cycle.
// - Shutdown: each message carries the rank's shutdown request; when all ranks request it the runtime stops.
// - Join (Horovod's): a rank with no more tensors sets the joined flag of its message. A joined rank counts as
//   having marked every cache slot and announced every name with the others' signature, so the others' tensors run
//   without it submitting them (the runtime fills zeros of the negotiated size on its side). When every rank's
//   message carries the flag, the decision says so and names the rank that joined last. Until a rank joins, this
//   costs nothing: the flag is a bit of the header every cycle already sends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gradcomp/communicator.h"
#include "gradcomp/tensor.h"

namespace gradcomp::runtime {

// What every rank must agree on for one tensor name.
struct Signature {
  std::uint64_t numel = 0;
  DType dtype = DType::kF32;
  Device device{};
  std::string spec;  // canonical spec or "auto"
  ReduceOp op = ReduceOp::kAverage;  // kSum or kAverage, per request
  std::string scope = {};  // the submitter's namespace (SubmitOptions::scope); "" = the runtime's own codecs
  // The tensor's first dimension when it has two or more (TensorView::rows(), 0 for a vector): shape-aware codecs
  // (PowerSGD) size their rounds by it, so a joined rank's zeros must carry it too.
  std::uint64_t rows = 0;

  friend bool operator==(const Signature&, const Signature&) = default;
  // "f32[2560] on cpu, spec none, op average".
  std::string describe() const;
};

struct ReadyTensor {
  std::string name;
  Signature signature;
};

struct FailedTensor {
  std::string name;
  bool timeout = false;  // Timeout (not submitted by every rank in time) vs InvalidArgument (mismatch)
  std::string message;
};

struct CycleDecision {
  std::vector<ReadyTensor> ready;    // execute in this order on every rank
  std::vector<FailedTensor> failed;  // complete these (where pending locally) with an error
  bool shutdown = false;             // every rank asked to stop
  bool all_joined = false;           // every rank's message carried the joined flag (join() completes)
  int last_joined = -1;              // when all_joined: the rank that joined last (of several in a cycle, the highest)
};

// Flags gathered from every rank's message. Cache bits are packed 64 slots to a word (slot s: bit s % 64 of word
// s / 64), so a cycle costs a few word operations per 64 cached names whatever their count.
struct CycleSummary {
  bool any_announcements = false;
  bool all_shutdown = false;
  std::vector<bool> joined;             // per rank: its message carried the joined flag
  std::uint64_t expire_before = 0;      // rank 0's
  std::uint64_t fusion_threshold = 0;   // rank 0's: every rank fuses with the same threshold in a cycle
  std::vector<std::vector<std::uint64_t>> bits;  // per rank: its cache bits
  std::vector<std::uint64_t> all, any;  // the bits of the ranks not joined ANDed (ready everywhere; 0 when every
                                        // rank is joined) and every rank's ORed
};

class Negotiator {
 public:
  Negotiator(int rank, int size, std::size_t cache_capacity);

  // Local bookkeeping: a tensor was enqueued / completed on this rank.
  void add_pending(const std::string& name, const Signature& signature);
  void remove_pending(const std::string& name);
  bool is_pending(const std::string& name) const { return pending_.count(name) != 0; }

  // Bytes of this cycle's fixed-size message (equal size on every rank). `expire_before` and `fusion_threshold` are
  // only read from rank 0; `joined`: this rank is in join().
  std::vector<std::byte> make_message(bool shutdown, std::uint64_t expire_before, std::uint64_t fusion_threshold = 0,
                                      bool joined = false) const;
  // Parses the allgathered messages (size() blocks of message_bytes()).
  CycleSummary summarize(std::span<const std::byte> messages) const;
  std::size_t message_bytes() const;
  // Announcements of this rank's uncached, not yet announced names (marks them announced).
  std::vector<std::byte> take_announcements();
  // The cycle's decisions from the summary and, when any_announcements, every rank's announcement blob.
  CycleDecision decide(const CycleSummary& summary, const std::vector<std::vector<std::byte>>& announcements);

  // True when, after decide(), no rank had anything to negotiate: no cache bit set, nothing announced this cycle
  // and no announcement waiting for other ranks. The same on every rank (it depends only on gathered state).
  bool quiet(const CycleSummary& summary) const;
  // Cycles decided so far (the same on every rank).
  std::uint64_t cycle() const { return cycle_; }
  std::size_t cached() const { return index_.size(); }

 private:
  struct Pending {
    Signature signature;
    bool announced = false;
  };
  struct Slot {
    std::string name;
    Signature signature;
    bool valid = false;
    std::uint64_t partial_since = UINT64_MAX;  // first cycle with some but not all bits set
  };
  struct Announced {
    std::uint64_t first_cycle = 0;
    std::vector<std::optional<Signature>> by_rank;
  };

  void evict(const std::string& name);
  void insert(const std::string& name, const Signature& signature);
  // The parts of decide(): record the announcements (returns the evicted slots, packed like the summary's bits),
  // run or time out the cached slots, run or fail the names every rank not joined announced, track the joins.
  std::vector<std::uint64_t> record_announcements(const CycleSummary& summary,
                                                  const std::vector<std::vector<std::byte>>& announcements,
                                                  std::uint64_t cycle);
  void decide_cached(const CycleSummary& summary, const std::vector<std::uint64_t>& evicted, std::uint64_t cycle,
                     CycleDecision& decision);
  void decide_announced(const CycleSummary& summary, CycleDecision& decision);
  void decide_join(const CycleSummary& summary, std::uint64_t cycle, CycleDecision& decision);
  // "tensor 'name' was not submitted by rank(s) ... within the timeout", `missing` the ranks without it.
  static FailedTensor timed_out(const std::string& name, const std::vector<int>& missing);

  // Cache slots some but not all ranks marked (Slot::partial_since is set), packed like CycleSummary::bits.
  std::vector<std::uint64_t> partial_;

  int rank_, size_;
  std::size_t capacity_;
  std::uint64_t cycle_ = 0;
  std::map<std::string, Pending> pending_;
  std::vector<Slot> slots_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, Announced> table_;
  std::vector<std::uint64_t> joined_since_;  // per rank: the first cycle its message carried the joined flag, or
                                             // UINT64_MAX
};

}  // namespace gradcomp::runtime
