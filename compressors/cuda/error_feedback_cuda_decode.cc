// The CUDA decode of ErrorFeedbackCompressor: payloads of one tensor (one, or every rank's of a gathered buffer),
// plain or segmented, in device or host memory, into a CUDA tensor. The host waits at most twice whatever the number
// of payloads and parts: once for the device payloads' metadata blocks (every part's header, kernels/payload_meta.cuh;
// a host payload's is read on the host) and once for the device checks of every part (CudaCodec::validate: indices,
// scales), which all run before any part is written, so a corrupt part leaves the whole output untouched. The decode
// itself is left queued on the output's stream.
#include "gradcomp/config.h"

#if GRADCOMP_WITH_CUDA
#include <algorithm>
#include <cstring>
#include <vector>

#include "compressors/cuda/cuda_path.h"
#include "compressors/framework/error_feedback.h"
#include "compressors/framework/segmented_payload.h"
#include "gradcomp/error.h"
#include "kernels/common_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/payload_meta.cuh"

namespace gradcomp {
namespace {

constexpr std::size_t kMetaCapacity = kernels::meta_block_bytes(kernels::kMaxMetaParts);
constexpr std::size_t kCheckBytes = 16;  // per part: int flag, padding, u64 word

// One part of a payload, its header checked on the host, its sections in device memory.
struct PartPlan {
  std::size_t payload = 0;  // which payload of the call
  payload::View view;
  std::size_t element_offset = 0;
  std::size_t numel = 0;
  std::span<const std::byte> lead;  // host: the first 32 bytes of section 0
};

payload::Header header_at(const std::byte* lead, std::size_t bytes) {
  return payload::decode_header(std::span<const std::byte, payload::kHeaderBytes>(lead, payload::kHeaderBytes), bytes);
}

PartPlan plan_part(std::size_t payload_index, const payload::Header& header, const std::byte* device_part,
                   const std::byte* lead, std::size_t element_offset, std::size_t numel) {
  PartPlan part;
  part.payload = payload_index;
  part.view.header = header;
  for (std::size_t i = 0; i < header.section_count; ++i) {
    part.view.sections[i] = std::span<const std::byte>(device_part + payload::section_offset(header, i),
                                                       header.section_bytes[i]);
  }
  part.element_offset = element_offset;
  part.numel = numel;
  part.lead = std::span<const std::byte>(lead + payload::kHeaderBytes, kernels::kMetaLead - payload::kHeaderBytes);
  return part;
}

// The table and the part leads of a segmented payload whose metadata block could not hold them (more than
// kMaxMetaParts parts): read back with two more waits, into `storage`.
const std::byte* read_large_meta(const std::byte* device_bytes, const payload::Header& header, std::size_t size,
                                 std::vector<std::byte>& storage, cudaStream_t stream) {
  const std::size_t parts = header.param0, table_bytes = 16 * parts;
  GRADCOMP_CHECK_AS(CorruptPayload, payload::kHeaderBytes + table_bytes <= size,
                    "corrupt segmented payload: a table of {} parts does not fit its {} bytes", parts, size);
  storage.assign(kernels::meta_block_bytes(parts), std::byte{0});
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(storage.data() + kernels::kMetaLead, device_bytes + payload::kHeaderBytes,
                                      table_bytes, cudaMemcpyDeviceToHost, stream));
  kernels::synchronize_stream(stream);
  const auto layout = payload::parse_segmented(
      header, std::span<const std::byte>(storage.data() + kernels::kMetaLead, table_bytes), size);
  std::byte* leads = storage.data() + kernels::kMetaLead + table_bytes;
  for (std::size_t s = 0; s < parts; ++s) {
    GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(leads + s * kernels::kMetaLead, device_bytes + layout[s].offset,
                                        std::min(kernels::kMetaLead, layout[s].bytes), cudaMemcpyDeviceToHost,
                                        stream));
  }
  kernels::synchronize_stream(stream);
  return storage.data();
}

// Where one payload of the call is read from: device memory at a 16-byte aligned address, and its metadata block.
struct Placed {
  const std::byte* device = nullptr;
  std::size_t size = 0;
  const std::byte* meta = nullptr;
  std::vector<std::byte> host_meta;  // a host payload's block, or a large segmented payload's
};

// Appends the parts of payload `index` (placed at `p`, `n` output elements, codec `codec` of compressor `name`) to
// `parts`, every header checked.
void plan_payload(std::size_t index, Placed& p, std::size_t n, payload::CodecId codec, std::string_view name,
                  std::vector<PartPlan>& parts, cudaStream_t stream) {
  const payload::Header header = header_at(p.meta, p.size);
  GRADCOMP_CHECK_AS(CorruptPayload, header.codec == codec,
                    "corrupt payload: codec {} ({}) where {} ({}) was expected", payload::codec_name(header.codec),
                    static_cast<int>(header.codec), payload::codec_name(codec), static_cast<int>(codec));
  GRADCOMP_CHECK_AS(CorruptPayload, header.numel == n,
                    "corrupt payload: it holds {} elements but the output tensor has {}", header.numel, n);
  if (!payload::is_segmented(header)) {
    parts.push_back(plan_part(index, header, p.device, p.meta, 0, n));
    return;
  }
  std::size_t count = kernels::meta_parts(reinterpret_cast<const unsigned char*>(p.meta), p.size, kMetaCapacity);
  if (count == 0) {
    p.meta = read_large_meta(p.device, header, p.size, p.host_meta, stream);
    count = header.param0;
  }
  const auto table = std::span<const std::byte>(p.meta + kernels::kMetaLead, 16 * count);
  const std::vector<payload::Part> layout = payload::parse_segmented(header, table, p.size);
  const std::byte* leads = p.meta + kernels::kMetaLead + 16 * count;
  for (std::size_t s = 0; s < layout.size(); ++s) {
    const std::byte* lead = leads + s * kernels::kMetaLead;
    const payload::Header part = header_at(lead, layout[s].bytes);
    GRADCOMP_CHECK_AS(CorruptPayload,
                      part.codec == codec && !payload::is_segmented(part) && part.dtype == header.dtype &&
                          part.numel == layout[s].numel,
                      "corrupt segmented payload: part {} of {} is codec {}, {}segmented, dtype {} over {} elements "
                      "(expected '{}', not segmented, {} over {})",
                      s, layout.size(), payload::codec_name(part.codec), payload::is_segmented(part) ? "" : "not ",
                      dtype_name(part.dtype), part.numel, name, dtype_name(header.dtype), layout[s].numel);
    parts.push_back(plan_part(index, part, p.device + layout[s].offset, lead, layout[s].element_offset,
                              layout[s].numel));
  }
}

// 1. Every payload in device memory at a 16-byte aligned address (sections are loaded as int32 and float4): a host
// payload, or a misaligned device one, is staged; and every metadata block on the host, with one wait for all the
// device payloads' (a host payload's is made on the host).
std::vector<Placed> place_payloads(std::span<const PayloadBytes> payloads, DeviceScratch& scratch,
                                   cudaStream_t stream) {
  std::vector<Placed> placed(payloads.size());
  std::vector<bool> on_device(payloads.size());
  std::size_t staged = 0, device_count = 0;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    on_device[i] = !payloads[i].memory.is_host();  // as the caller labelled it
    const bool aligned = reinterpret_cast<std::uintptr_t>(payloads[i].bytes.data()) % payload::kSectionAlign == 0;
    if (!on_device[i] || !aligned) staged += (payloads[i].bytes.size() + 255) / 256 * 256;
    device_count += on_device[i] ? 1 : 0;
  }
  if (staged > 0) scratch.staging.reserve(staged);
  if (device_count > 0) scratch.meta.reserve(kMetaCapacity * payloads.size());
  std::size_t staging_at = 0;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const std::span<const std::byte> bytes = payloads[i].bytes;
    Placed& p = placed[i];
    p.size = bytes.size();
    p.device = bytes.data();
    const bool aligned = reinterpret_cast<std::uintptr_t>(bytes.data()) % payload::kSectionAlign == 0;
    if (!on_device[i] || !aligned) {
      std::byte* to = scratch.staging.as<std::byte>() + staging_at;
      staging_at += (bytes.size() + 255) / 256 * 256;
      GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(to, bytes.data(), bytes.size(),
                                          on_device[i] ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, stream));
      p.device = to;
    }
    if (on_device[i]) {
      std::byte* block = scratch.meta.as<std::byte>() + kMetaCapacity * i;
      kernels::launch_collect_payload_meta(p.device, p.size, block, kMetaCapacity, stream);
      p.meta = block;
    } else {
      const auto* host = reinterpret_cast<const unsigned char*>(bytes.data());
      p.host_meta.resize(kernels::meta_block_bytes(kernels::meta_parts(host, p.size, kMetaCapacity)));
      std::vector<std::uint64_t> offsets(kernels::kMaxMetaParts);
      kernels::collect_payload_meta_host(host, p.size, reinterpret_cast<unsigned char*>(p.host_meta.data()),
                                         kMetaCapacity, offsets.data());
      p.meta = p.host_meta.data();
    }
  }
  if (device_count > 0) kernels::synchronize_stream(stream);
  return placed;
}

// 3. The device checks of every part (decoding into `values`), then one wait for all their verdicts; returns the
// decode arguments of every part.
std::vector<CudaDecodeArgs> check_parts(CudaCodec& codec, const std::vector<PartPlan>& parts, float* values,
                                        DecodeMode first, DeviceScratch& scratch, cudaStream_t stream) {
  scratch.checks.reserve(kCheckBytes * parts.size());
  GRADCOMP_CUDA_CHECK(cudaMemsetAsync(scratch.checks.data(), 0, kCheckBytes * parts.size(), stream));
  std::vector<CudaDecodeArgs> args(parts.size());
  bool device_checks = false;
  for (std::size_t s = 0; s < parts.size(); ++s) {
    CudaDecodeArgs& a = args[s];
    a.view = &parts[s].view;
    a.out = values + parts[s].element_offset;
    a.numel = parts[s].numel;
    a.accumulate = parts[s].payload > 0 || first == DecodeMode::kAccumulate;
    a.error_flag = reinterpret_cast<int*>(scratch.checks.as<std::byte>() + kCheckBytes * s);
    a.check_word = reinterpret_cast<std::uint64_t*>(scratch.checks.as<std::byte>() + kCheckBytes * s + 8);
    a.lead = parts[s].lead;
    a.workspace = scratch.workspace.data();
    a.stream = stream;
    device_checks = codec.validate(a) || device_checks;
  }
  if (!device_checks) return args;
  scratch.checks_host.reserve(kCheckBytes * parts.size());
  GRADCOMP_CUDA_CHECK(cudaMemcpyAsync(scratch.checks_host.as<void>(), scratch.checks.data(),
                                      kCheckBytes * parts.size(), cudaMemcpyDeviceToHost, stream));
  kernels::synchronize_stream(stream);
  for (std::size_t s = 0; s < parts.size(); ++s) {
    const std::byte* check = scratch.checks_host.as<const std::byte>() + kCheckBytes * s;
    int flag = 0;
    std::uint64_t word = 0;
    std::memcpy(&flag, check, sizeof(flag));
    std::memcpy(&word, check + 8, sizeof(word));
    codec.checked(args[s], flag, word);
  }
  return args;
}

}  // namespace

void ErrorFeedbackCompressor::decompress_cuda(std::span<const PayloadBytes> payloads, const TensorView& out,
                                              DecodeMode first) {
  CudaCodec* codec = cuda_codec();
  GRADCOMP_CHECK(codec != nullptr, "compressor '{}' has no CUDA path (output is {})", name_, out.describe());
  for (const PayloadBytes& payload : payloads) {
    GRADCOMP_CHECK(payload.memory.is_host() || payload.memory.device == out.device(),
                   "compressor '{}': a payload in {} memory cannot be decoded into {} (host or the output's device)",
                   name_, device_name(payload.memory.device), out.describe());
    GRADCOMP_CHECK_AS(CorruptPayload, payload.bytes.size() >= payload::kHeaderBytes,
                      "corrupt payload: {} bytes is shorter than the {}-byte header", payload.bytes.size(),
                      payload::kHeaderBytes);
  }
  if (payloads.empty()) return;
  const int device = out.device().index;
  kernels::DeviceGuard guard(device);
  auto stream = static_cast<cudaStream_t>(out.stream());
  DeviceScratch& scratch = cuda_->scratch[device];
  const ScratchUse scratch_use(scratch, stream);
  const std::size_t n = out.numel();
  std::vector<Placed> placed = place_payloads(payloads, scratch, stream);

  // 2. Every part's header, checked on the host.
  std::vector<PartPlan> parts;
  for (std::size_t i = 0; i < placed.size(); ++i) plan_payload(i, placed[i], n, codec_, name_, parts, stream);

  std::size_t largest = 0;
  for (const PartPlan& part : parts) largest = std::max(largest, part.numel);
  scratch.workspace.reserve(std::max<std::size_t>(codec->decode_workspace_bytes(largest), 256));
  const bool half = out.dtype() != DType::kF32;
  float* values = static_cast<float*>(out.data());
  if (half) values = static_cast<float*>(scratch.values.reserve(std::max<std::size_t>(n, 1) * sizeof(float)));
  std::vector<CudaDecodeArgs> args = check_parts(*codec, parts, values, first, scratch, stream);

  // 4. Every part into the output, payload after payload (through f32 for an f16/bf16 tensor).
  const bool bf16 = out.dtype() == DType::kBF16;
  if (half && first == DecodeMode::kAccumulate) {
    kernels::launch_half_to_float(static_cast<const std::uint16_t*>(out.data()), values, n, bf16, stream);
  }
  for (CudaDecodeArgs& a : args) codec->decode(a);
  if (half) kernels::launch_float_to_half(values, static_cast<std::uint16_t*>(out.data()), n, bf16, stream);
}

}  // namespace gradcomp
#endif
