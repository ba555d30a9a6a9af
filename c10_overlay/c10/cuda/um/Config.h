// Configuration of the unified-memory engine.
//
// Read from PYTORCH_CUDA_UM_CONF at first use, in the syntax users know from
// PYTORCH_CUDA_ALLOC_CONF ("key:value,key:value"), and changeable at run time
// through the C API (torch.cuda.um.configure in Python). Pure C++: no CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace c10::cuda::um {

constexpr const char* kConfigEnvVar = "PYTORCH_CUDA_UM_CONF";

// A byte count, or a percentage of the device's total memory.
struct SizeSpec {
  uint64_t bytes = 0;
  double percent = 0.0; // > 0 means "percent of device total"
  bool isPercent() const {
    return percent > 0.0;
  }
  uint64_t resolve(uint64_t device_total) const;
  std::string str() const;
};

struct Config {
  // Allocator segments are cudaMallocManaged memory. Off: plain cudaMalloc.
  bool enabled = true;
  // Hard cap on managed bytes summed over all devices; nullopt = no cap.
  std::optional<uint64_t> max_managed;
  // Per device: managed bytes the engine places on the device; segments past
  // it live in host RAM, mapped for the GPU to read and write in place.
  SizeSpec device_budget{0, 90.0};
  // A segment placed in host RAM must leave this much host memory available.
  uint64_t host_headroom = 2ull << 30;
  // Prefetch a new segment to where it was placed.
  bool prefetch = true;
  // Residency policy (Residency.h): "lru" moves data over time under the
  // budget; "static" keeps a segment where it was placed when allocated.
  bool lru = true;
  // Dead data (blocks the allocator has freed) is discarded, never copied.
  bool discard = true;
  // torch.cuda.um's module hooks report parameters and saved activations as
  // about to be used, once a device has run past its budget (um.py).
  bool hooks = true;
  // With hooks: saved activations past the budget leave the device by copy
  // (DMA at link speed) when the forward saves them and come back ahead of
  // the backward in the reverse order of saving, instead of being evicted by
  // migration (Note [Saved-activation offload], torch/cuda/_um_predict.py).
  // predict_lookahead bounds the bytes brought back ahead of their use.
  bool predict = true;
  uint64_t predict_lookahead = 1ull << 30;
  // While a device is near its budget, every ATen operator's managed inputs
  // are brought to the device before its kernels run, and room is made by
  // the learned order of use; with op_lookahead > 0 the storages it predicts
  // next are also brought in ahead, at most op_lookahead bytes in flight (and
  // an eighth of the budget): Notes [Operator use signals] (OpSignal.h),
  // [Learned lookahead] (Lookahead.h), [The learned eviction order]
  // (Residency.h). Off by default: while evictions migrate at 8-10 GB/s the
  // lookahead's bring-ins cost more evictions than they hide (train-plain
  // 0.55-0.68 s a step without it, 0.93-1.50 with 1 GiB; step 54).
  bool op_signal = true;
  uint64_t op_lookahead = 0;
  // State that one burst of operators a period writes (a hand-written
  // update's momentum) is copied to a device block for the burst and back
  // into host RAM after it, under the storage's own pointer, instead of
  // migrating in and being evicted: Note [State one burst a period writes is
  // staged by copy] (Stage.h). Off by default until measured.
  bool op_stage = false;
  // Of the planned chunks due after the lookahead's window, those whose pages
  // were in host RAM before leave first: the driver evicts into pages a range
  // never had at about a third of the speed (Note [First evictions],
  // Residency.h). On since step 57 measured it with victims leaving as runs.
  bool evict_warm_first = true;
  // The most SMs the weight streamer's copies (Note [Weight streaming]) hold:
  // a copy kernel holds its SMs while it waits on the link, and the forward's
  // kernels beside it keep the rest. With foreach, the copies run on a stream
  // of a CUDA green context of that many SMs; -1 is auto (an eighth of the
  // device's SMs, a multiple of 8, at least 8). With the lean kernel, that
  // many blocks; auto is 2. 0 lets the copies take any SM (foreach on a plain
  // stream).
  int32_t predict_copy_sms = -1;
  // The kernel of those copies: false is torch._foreach_copy_, true the
  // engine's own (Note [Lean copies], torch/cuda/_um_copy.py), which carries
  // the link on two SMs. The default since bench/README.md step 32: faster in
  // every benchmark run at full CPU speed; foreach where it cannot be had.
  bool predict_copy_lean = true;
  // The kernel of the optimizer state staging's copies in and out (Note
  // [Optimizer state staging], torch/cuda/_um_optim.py): false is one
  // torch._foreach_copy_ a chunk, true the lean kernel on 32 SMs a copy
  // (predict_copy_sms where set to a count), so that a copy in and a copy out
  // run at once. Off: in training it was no faster, the chunked foreach copies
  // already overlapping both ways (bench/README.md, step 46).
  bool predict_stage_lean = false;
  // With predict: DistributedDataParallel's gradient buckets
  // (gradient_as_bucket_view) are forgotten between a step and the next
  // backward, which overwrites them, so that they leave the device without
  // a copy and come back without one (Note [DDP's buckets between steps],
  // torch/cuda/_um_ddp.py).
  bool predict_ddp_buckets = true;
  // With predict, while no module hook drives (plain tensors, compiled models,
  // hooks:False): the saved-activation offload for the program's forward,
  // begun and ended by torch.autograd.backward (Note [A program's forward
  // between two backwards], torch/cuda/_um_program.py). On since step 58:
  // the plain-tensor step 22-24 % faster (docs/notes/step-58-programs-on.md).
  bool predict_programs = true;
  // Data its user only reads (parameters in a forward without autograd)
  // comes back to the device as a read-only copy, which leaves without a
  // write-back (Note [Read-only duplicates] in Residency.h). Off by default:
  // with it, the inference benchmark's logits differed from stock's by a
  // relative 6e-4..4e-3 in two runs on an H200 (bench/README.md).
  bool read_copies = false;
  // CPU tensors of at least host_alloc_min bytes are managed memory placed in
  // host RAM (Note [Managed host memory], HostAllocator.h), so that
  // torch.cuda.um.move_ can hand them to a GPU without a copy. "default"
  // (false) keeps c10's CPU allocator except inside torch.cuda.um's
  // managed_host() scope; "managed" applies it process-wide once the process
  // has used CUDA. Off by default: fork()ed DataLoader workers cannot read
  // managed memory of their parent.
  bool host_alloc_managed = false;
  uint64_t host_alloc_min = 1ull << 20;
  // Copies between managed host memory and a GPU (torch's cudaMemcpyAsync of
  // a CPU tensor under host_alloc:managed or managed_host()) run as the
  // engine's copy kernel at the link's speed instead of the driver's staged
  // copy (Note [Copies of managed host memory by kernel], HostCopy.h). On by
  // default; the injection path only.
  bool host_copy_kernel = true;
  // The most of such a copy's bytes that CPU threads copy at the same time,
  // where both sides lie in host RAM (Note [Copies shared with the CPU],
  // HostCopy.h); 0 leaves every byte to the kernel.
  double host_copy_cpu_share = 0.35;
  // A copy between pageable memory (torch's ordinary CPU tensors) and an
  // engine segment whose chunks lie in host RAM past the device budget copies
  // those chunks' bytes by CPU threads, in place, and the rest through the
  // engine's page-locked buffers (Note [Copies of pageable memory past the
  // budget], HostCopy.h). On by default; the injection path only.
  bool pageable_copy_cpu = true;
  // DataLoader pin_memory=True page-locks each batch tensor of at least
  // host_alloc_min bytes where it lies (cudaHostRegister) instead of copying
  // it into page-locked buffers (Note [Pinned in place], HostAllocator.h).
  // Off by default: see the Note.
  bool pin_in_place = false;

  // Canonical "key:value,..." form of every setting.
  std::string str() const;
};

// Apply "key:value,key:value" on top of `base`. Throws c10::Error naming the
// offending key or value and listing what is accepted; `base` is untouched
// then. `source` names where the text came from, for the message.
Config parseConfig(
    std::string_view text,
    const Config& base,
    std::string_view source);

// "1.50 GiB"-style rendering for messages.
std::string formatBytes(uint64_t bytes);

// Parses "4096", "512MB", "8GiB", "1.5G" (binary units). nullopt if malformed.
std::optional<uint64_t> parseBytes(std::string_view text);

} // namespace c10::cuda::um
