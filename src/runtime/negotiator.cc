#include "src/runtime/negotiator.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "compressors/framework/state_io.h"
#include "gradcomp/error.h"

namespace gradcomp::runtime {
namespace {

constexpr std::uint32_t kFlagAnnounce = 1u;
constexpr std::uint32_t kFlagShutdown = 2u;
constexpr std::uint32_t kFlagJoined = 4u;
constexpr std::size_t kHeaderBytes = 32;  // u32 flags, u32 reserved, u64 expire_before, u64 slot count, u64 threshold

void put_signature(ByteWriter& writer, const Signature& signature) {
  writer.put<std::uint64_t>(signature.numel);
  writer.put<std::uint8_t>(static_cast<std::uint8_t>(signature.dtype));
  writer.put<std::uint8_t>(static_cast<std::uint8_t>(signature.device.type));
  writer.put<std::int32_t>(signature.device.index);
  writer.put_string(signature.spec);
  writer.put<std::uint8_t>(static_cast<std::uint8_t>(signature.op));
  writer.put_string(signature.scope);
  writer.put<std::uint64_t>(signature.rows);
}

Signature get_signature(ByteReader& reader) {
  Signature signature;
  signature.numel = reader.get<std::uint64_t>();
  signature.dtype = static_cast<DType>(reader.get<std::uint8_t>());
  signature.device.type = static_cast<DeviceType>(reader.get<std::uint8_t>());
  signature.device.index = reader.get<std::int32_t>();
  signature.spec = reader.get_string();
  signature.op = static_cast<ReduceOp>(reader.get<std::uint8_t>());
  signature.scope = reader.get_string();
  signature.rows = reader.get<std::uint64_t>();
  return signature;
}

// Calls fn(slot) for every set bit of `word`, the `w`-th word of a packed slot vector, in slot order.
template <typename Fn>
void for_each_bit(std::uint64_t word, std::size_t w, Fn&& fn) {
  while (word != 0) {
    fn(64 * w + static_cast<std::size_t>(std::countr_zero(word)));
    word &= word - 1;
  }
}

}  // namespace

std::string Signature::describe() const {
  const std::string shape = rows == 0 ? fmt::format("{}", numel) : fmt::format("{}x{}", rows, numel / rows);
  return fmt::format("{}[{}] on {}, spec {}, op {}{}", dtype_name(dtype), shape, device_name(device), spec,
                     reduce_op_name(op), scope.empty() ? std::string() : fmt::format(", scope {}", scope));
}

Negotiator::Negotiator(int rank, int size, std::size_t cache_capacity)
    : rank_(rank), size_(size), capacity_(cache_capacity), joined_since_(static_cast<std::size_t>(size), UINT64_MAX) {}

void Negotiator::add_pending(const std::string& name, const Signature& signature) {
  pending_[name] = Pending{signature, false};
}

void Negotiator::remove_pending(const std::string& name) { pending_.erase(name); }

std::size_t Negotiator::message_bytes() const { return kHeaderBytes + (slots_.size() + 7) / 8; }

std::vector<std::byte> Negotiator::make_message(bool shutdown, std::uint64_t expire_before,
                                               std::uint64_t fusion_threshold, bool joined) const {
  std::vector<std::byte> message(message_bytes(), std::byte{0});
  std::uint32_t flags = (shutdown ? kFlagShutdown : 0u) | (joined ? kFlagJoined : 0u);
  for (const auto& [name, entry] : pending_) {
    auto it = index_.find(name);
    if (it != index_.end() && slots_[it->second].signature == entry.signature) {
      message[kHeaderBytes + it->second / 8] |= std::byte(1u << (it->second % 8));
    } else if (!entry.announced) {
      flags |= kFlagAnnounce;
    }
  }
  const std::uint64_t slot_count = slots_.size();
  std::memcpy(message.data(), &flags, 4);
  std::memcpy(message.data() + 8, &expire_before, 8);
  std::memcpy(message.data() + 16, &slot_count, 8);
  std::memcpy(message.data() + 24, &fusion_threshold, 8);
  return message;
}

CycleSummary Negotiator::summarize(std::span<const std::byte> messages) const {
  const std::size_t bytes = message_bytes();
  GRADCOMP_CHECK_AS(CommError, messages.size() == bytes * static_cast<std::size_t>(size_),
                    "negotiation on rank {}: got {} bytes of messages, expected {} x {}", rank_, messages.size(),
                    size_, bytes);
  CycleSummary summary;
  summary.all_shutdown = true;
  summary.bits.resize(size_);
  summary.joined.assign(static_cast<std::size_t>(size_), false);
  const std::size_t words = (slots_.size() + 63) / 64;
  summary.all.assign(words, ~std::uint64_t{0});
  summary.any.assign(words, 0);
  bool any_active = false;
  for (int r = 0; r < size_; ++r) {
    const std::byte* message = messages.data() + bytes * r;
    std::uint32_t flags = 0;
    std::uint64_t expire = 0, slot_count = 0, threshold = 0;
    std::memcpy(&flags, message, 4);
    std::memcpy(&expire, message + 8, 8);
    std::memcpy(&slot_count, message + 16, 8);
    std::memcpy(&threshold, message + 24, 8);
    GRADCOMP_CHECK_AS(CommError, slot_count == slots_.size(),
                      "negotiation out of sync: rank {} has {} cached names, rank {} has {}", r, slot_count, rank_,
                      slots_.size());
    summary.any_announcements = summary.any_announcements || (flags & kFlagAnnounce) != 0;
    summary.all_shutdown = summary.all_shutdown && (flags & kFlagShutdown) != 0;
    summary.joined[r] = (flags & kFlagJoined) != 0;
    any_active = any_active || !summary.joined[r];
    if (r == 0) {
      summary.expire_before = expire;
      summary.fusion_threshold = threshold;
    }
    auto& bits = summary.bits[r];
    bits.assign(words, 0);
    for (std::size_t b = 0; b < (slots_.size() + 7) / 8; ++b) {
      bits[b / 8] |= std::uint64_t{std::to_integer<std::uint8_t>(message[kHeaderBytes + b])} << (8 * (b % 8));
    }
    for (std::size_t w = 0; w < words; ++w) {
      if (!summary.joined[r]) summary.all[w] &= bits[w];  // a joined rank takes part in whatever the others run
      summary.any[w] |= bits[w];
    }
  }
  if (!any_active) summary.all.assign(words, 0);
  return summary;
}

std::vector<std::byte> Negotiator::take_announcements() {
  ByteWriter writer;
  std::vector<std::pair<const std::string*, Pending*>> todo;
  for (auto& [name, entry] : pending_) {
    auto it = index_.find(name);
    const bool cached = it != index_.end() && slots_[it->second].signature == entry.signature;
    if (!cached && !entry.announced) todo.emplace_back(&name, &entry);
  }
  writer.put<std::uint64_t>(todo.size());
  for (auto& [name, entry] : todo) {
    writer.put_string(*name);
    put_signature(writer, entry->signature);
    entry->announced = true;
  }
  return writer.take();
}

void Negotiator::evict(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  slots_[it->second].valid = false;
  slots_[it->second].name.clear();
  slots_[it->second].partial_since = UINT64_MAX;
  index_.erase(it);
  // A local entry that relied on the slot must now announce itself.
  auto p = pending_.find(name);
  if (p != pending_.end()) p->second.announced = false;
}

void Negotiator::insert(const std::string& name, const Signature& signature) {
  if (index_.count(name) != 0) return;
  std::size_t slot = slots_.size();
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (!slots_[s].valid) {
      slot = s;
      break;
    }
  }
  if (slot == slots_.size()) {
    if (slots_.size() >= capacity_) return;  // full: the name keeps being announced
    slots_.emplace_back();
  }
  slots_[slot] = Slot{name, signature, true, UINT64_MAX};
  index_[name] = slot;
}

FailedTensor Negotiator::timed_out(const std::string& name, const std::vector<int>& missing) {
  return {name, true,
          fmt::format("tensor '{}' was not submitted by rank(s) {} within the timeout", name, fmt::join(missing, ","))};
}

std::vector<std::uint64_t> Negotiator::record_announcements(const CycleSummary& summary,
                                                            const std::vector<std::vector<std::byte>>& announcements,
                                                            std::uint64_t cycle) {
  std::vector<std::uint64_t> evicted((slots_.size() + 63) / 64, 0);  // packed like the summary's bits
  if (!summary.any_announcements) return evicted;
  GRADCOMP_CHECK_AS(CommError, announcements.size() == static_cast<std::size_t>(size_),
                    "negotiation on rank {}: {} announcement blobs for {} ranks", rank_, announcements.size(), size_);
  for (int r = 0; r < size_; ++r) {
    ByteReader reader(announcements[r], fmt::format("announcements of rank {}", r));
    const auto count = reader.get<std::uint64_t>();
    for (std::uint64_t i = 0; i < count; ++i) {
      std::string name = reader.get_string();
      Signature signature = get_signature(reader);
      auto it = index_.find(name);
      if (it != index_.end()) {  // a cached name announced with another signature loses its slot everywhere
        evicted[it->second / 64] |= std::uint64_t{1} << (it->second % 64);
        evict(name);
      }
      Announced& entry = table_[name];
      if (entry.by_rank.empty()) {
        entry.by_rank.resize(size_);
        entry.first_cycle = cycle;
      }
      entry.by_rank[r] = std::move(signature);
    }
  }
  return evicted;
}

void Negotiator::decide_cached(const CycleSummary& summary, const std::vector<std::uint64_t>& evicted,
                               std::uint64_t cycle, CycleDecision& decision) {
  partial_.resize(summary.all.size(), 0);
  for (std::size_t w = 0; w < summary.all.size(); ++w) {
    const std::uint64_t live = ~evicted[w];
    const std::uint64_t partial = summary.any[w] & ~summary.all[w] & live;
    for_each_bit(summary.all[w] & live, w, [&](std::size_t s) {
      if (!slots_[s].valid) return;
      decision.ready.push_back({slots_[s].name, slots_[s].signature});
      slots_[s].partial_since = UINT64_MAX;
    });
    // Slots partial before and not now (ready, or withdrawn everywhere) start over.
    for_each_bit(partial_[w] & ~partial, w, [&](std::size_t s) { slots_[s].partial_since = UINT64_MAX; });
    partial_[w] = 0;
    for_each_bit(partial, w, [&](std::size_t s) {
      if (!slots_[s].valid) return;
      if (slots_[s].partial_since == UINT64_MAX) {
        slots_[s].partial_since = cycle;
      } else if (slots_[s].partial_since < summary.expire_before) {
        std::vector<int> missing;
        for (int r = 0; r < size_; ++r) {
          if (!summary.joined[r] && ((summary.bits[r][w] >> (s % 64)) & 1u) == 0) missing.push_back(r);
        }
        decision.failed.push_back(timed_out(slots_[s].name, missing));
        slots_[s].partial_since = UINT64_MAX;
        return;
      }
      partial_[w] |= std::uint64_t{1} << (s % 64);
    });
  }
}

void Negotiator::decide_announced(const CycleSummary& summary, CycleDecision& decision) {
  // Complete when every rank not joined announced the name; expired when rank 0's deadline passed first.
  std::vector<std::pair<std::uint64_t, std::string>> complete;
  for (auto& [name, entry] : table_) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!entry.by_rank[r] && !summary.joined[r]) missing.push_back(r);
    }
    if (missing.empty()) {
      complete.emplace_back(entry.first_cycle, name);
    } else if (entry.first_cycle < summary.expire_before) {
      decision.failed.push_back(timed_out(name, missing));
    }
  }
  std::sort(complete.begin(), complete.end());
  for (auto& [first, name] : complete) {
    // The ranks that announced it (a joined rank takes the others' signature) must have announced it alike.
    const Announced& entry = table_[name];
    int reference = -1, other = -1;
    for (int r = 0; r < size_ && other < 0; ++r) {
      if (!entry.by_rank[r]) continue;
      if (reference < 0) {
        reference = r;
      } else if (!(*entry.by_rank[r] == *entry.by_rank[reference])) {
        other = r;
      }
    }
    if (other < 0) {
      decision.ready.push_back({name, *entry.by_rank[reference]});
      insert(name, *entry.by_rank[reference]);
    } else {
      decision.failed.push_back(
          {name, false,
           fmt::format("tensor '{}' was submitted differently across ranks: rank {} has {}, rank {} has {}", name,
                       reference, entry.by_rank[reference]->describe(), other, entry.by_rank[other]->describe())});
    }
  }
}

void Negotiator::decide_join(const CycleSummary& summary, std::uint64_t cycle, CycleDecision& decision) {
  bool all = true;
  for (int r = 0; r < size_; ++r) {
    if (!summary.joined[r]) {
      joined_since_[r] = UINT64_MAX;
      all = false;
    } else if (joined_since_[r] == UINT64_MAX) {
      joined_since_[r] = cycle;
    }
  }
  if (!all) return;
  decision.all_joined = true;
  for (int r = 0; r < size_; ++r) {
    if (decision.last_joined < 0 || joined_since_[r] >= joined_since_[decision.last_joined]) decision.last_joined = r;
  }
  joined_since_.assign(static_cast<std::size_t>(size_), UINT64_MAX);
}

CycleDecision Negotiator::decide(const CycleSummary& summary,
                                 const std::vector<std::vector<std::byte>>& announcements) {
  CycleDecision decision;
  decision.shutdown = summary.all_shutdown;
  const std::uint64_t cycle = cycle_++;
  const std::vector<std::uint64_t> evicted = record_announcements(summary, announcements, cycle);
  decide_cached(summary, evicted, cycle, decision);
  decide_announced(summary, decision);
  for (auto& failed : decision.failed) table_.erase(failed.name);
  for (auto& ready : decision.ready) table_.erase(ready.name);
  decide_join(summary, cycle, decision);
  return decision;
}

bool Negotiator::quiet(const CycleSummary& summary) const {
  if (summary.any_announcements || !table_.empty()) return false;
  return std::all_of(summary.any.begin(), summary.any.end(), [](std::uint64_t word) { return word == 0; });
}

}  // namespace gradcomp::runtime
