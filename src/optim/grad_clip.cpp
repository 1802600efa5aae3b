// Global-norm clipping over shards; see include/alpaca/optim/grad_clip.h.
#include "alpaca/optim/grad_clip.h"

#include <cmath>

#include "alpaca/dist/communicator.h"

namespace alpaca::optim {

double global_grad_norm(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  // Squared norms summed in fp64 on the host: one scalar per shard, so the cost is a sync, not math.
  double local_sq = 0.0;
  for (const auto& g : grad_shards) {
    if (!g.defined() || g.numel() == 0) continue;
    const double n = g.norm(2).item<double>();
    local_sq += n * n;
  }
  if (comm != nullptr && comm->world_size() > 1) {
    at::Tensor t = at::full({1}, local_sq, at::TensorOptions().dtype(at::kDouble)).to(comm->device());
    comm->all_reduce(t, dist::ReduceOp::kSum)->wait();
    local_sq = t.cpu().item<double>();
  }
  return std::sqrt(local_sq);
}

double clip_grad_norm(const std::vector<at::Tensor>& grad_shards, double max_norm,
                      dist::Communicator* comm) {
  const double total = global_grad_norm(grad_shards, comm);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const auto& g : grad_shards)
      if (g.defined()) g.mul_(coef);
  }
  return total;
}

bool any_non_finite(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm) {
  double bad = 0.0;
  for (const auto& g : grad_shards) {
    if (!g.defined() || g.numel() == 0) continue;
    if (!at::isfinite(g).all().item<bool>()) bad = 1.0;
  }
  if (comm != nullptr && comm->world_size() > 1) {
    at::Tensor t = at::full({1}, bad, at::TensorOptions().dtype(at::kFloat)).to(comm->device());
    comm->all_reduce(t, dist::ReduceOp::kMax)->wait();
    bad = t.cpu().item<double>();
  }
  return bad > 0.0;
}

}  // namespace alpaca::optim
