// Global-norm clipping over shards; see include/alpaca/optim/grad_clip.h.
#include "alpaca/optim/grad_clip.h"

#include <cmath>

#include "alpaca/dist/communicator.h"
#include "alpaca/util/host_sync.h"

namespace alpaca::optim {
namespace {

at::Device where(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  for (const auto& g : grad_shards)
    if (g.defined()) return g.device();
  return comm != nullptr ? comm->device() : at::Device(at::kCPU);
}

// The squared L2 norm of one gradient tensor, accurate to fp32 rounding whatever its size, in fp64.
// ATen's fp32 CPU norm accumulates in fp32 along the vector: 2e-5 relative off at 1e5 elements,
// 3e-4 at 1e6, 1e-3 at 4e6 (float64 as the truth). A flat FSDP shard holds whole units, so its one
// norm was 1e-5..1e-4 off the per-parameter norms transformers sums (and clipping scaled by it).
// Norms of 4096-element rows, squared and summed in fp64: ~3e-7 at every size, one pass, n/4096
// floats of scratch.
at::Tensor squared_norm_fp64(const at::Tensor& g) {
  constexpr int64_t kRow = 4096;
  const at::Tensor flat = g.reshape({-1});
  const int64_t n = flat.numel(), full = n / kRow * kRow;
  at::Tensor sq;
  if (full > 0) sq = at::linalg_vector_norm(flat.narrow(0, 0, full).view({-1, kRow}), 2, {1}).to(at::kDouble).square().sum();
  if (full < n) {
    const at::Tensor tail = flat.narrow(0, full, n - full).norm(2).to(at::kDouble).square();
    sq = sq.defined() ? sq + tail : tail;
  }
  return sq;
}

}  // namespace

at::Tensor global_grad_norm_sq(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  // Squared norms summed in fp64, one shard after the other, as tensor operations where the
  // gradients are: no host round trip per shard.
  at::Tensor sq;
  for (const auto& g : grad_shards) {
    if (!g.defined() || g.numel() == 0) continue;
    const at::Tensor n2 = squared_norm_fp64(g);
    sq = sq.defined() ? sq + n2 : n2;
  }
  if (!sq.defined()) sq = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(where(grad_shards, comm)));
  at::Tensor t = sq.reshape({1});
  if (comm != nullptr && comm->world_size() > 1) {
    t = util::to_device_async(t, comm->device()).clone();
    comm->all_reduce(t, dist::ReduceOp::kSum)->wait();
  }
  return t;
}

double global_grad_norm(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  const at::Tensor sq = global_grad_norm_sq(grad_shards, comm);
  util::count_host_sync();  // the one read of the step's norm
  return std::sqrt(sq.cpu().item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& grad_shards, double max_norm,
                      dist::Communicator* comm) {
  const double total = global_grad_norm(grad_shards, comm);
  clip_grad_norm_by(grad_shards, max_norm, total);
  return total;
}

void clip_grad_norm_by(const std::vector<at::Tensor>& grad_shards, double max_norm, double total_norm) {
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef < 1.0) {
    for (const auto& g : grad_shards)
      if (g.defined()) g.mul_(coef);
  }
}

bool any_non_finite(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  // One flag for all shards, read once (not one read per shard).
  at::Tensor bad = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(where(grad_shards, comm)));
  for (const auto& g : grad_shards) {
    if (!g.defined() || g.numel() == 0) continue;
    bad = at::maximum(bad, at::logical_not(at::isfinite(g).all()).to(at::kFloat).reshape({1}));
  }
  if (comm != nullptr && comm->world_size() > 1) {
    bad = util::to_device_async(bad, comm->device()).contiguous();
    comm->all_reduce(bad, dist::ReduceOp::kMax)->wait();
  }
  util::count_host_sync();
  return bad.cpu().item<float>() > 0.0f;
}

}  // namespace alpaca::optim
