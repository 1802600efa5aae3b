// Page-locked host tensors of exactly their size, for the long-lived offload buffers (the FSDP
// engine's fp32 master and gradient shards and their param_dtype staging).
//
// LibTorch's caching host allocator (`pinned_memory(true)`) rounds every block up to a power of two
// (torch 2.11 always; 2.15 unless its pinned_max_round_threshold is set) and keeps it cached: a 7B
// decoder layer's 810 MB fp32 shard took 1 GiB, and a 6.7B offload run's pinned states ~82 GiB
// where their bytes are ~67 (on a GPU host of 128 GiB, with the AdamW moments beside them). These
// buffers live as long as the engine and are never reallocated, so a cache gains them nothing.
//
// The memory comes from cudaHostAlloc and goes back with the tensor's storage (cudaFreeHost).
// is_pinned() is true (CUDA's pointer attributes), so copies from and to it run asynchronously;
// LibTorch's allocator does not track it, so the caller must keep it alive and unwritten while a
// copy reads it (the engine's copy events do). Needs a CUDA build and a CUDA device; contents
// undefined. Zero elements: a plain (unpinned) empty tensor.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

namespace alpaca::util {

at::Tensor empty_pinned(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace alpaca::util
