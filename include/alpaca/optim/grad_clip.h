// Gradient clipping by the global L2 norm of gradients that are sharded across ranks, and the
// overflow check of fp16 training; both need one all-reduce over the ranks holding disjoint shards.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <vector>

namespace alpaca::dist {
class Communicator;
}

namespace alpaca::optim {

// The L2 norm of the concatenation of every rank's `grad_shards` (shards of `comm`'s ranks must
// be disjoint parts of the model; nullptr = this rank holds all gradients). Collective over comm.
double global_grad_norm(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm);
// The same squared, as a (1,) fp64 tensor on the gradients' device (comm's device when
// all-reduced), without reading it on the host: a caller folds it into the step's one read.
at::Tensor global_grad_norm_sq(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm);

// torch.nn.utils.clip_grad_norm_ across shards: scales the gradients in place by
// min(1, max_norm / (norm + 1e-6)) and returns the norm before clipping. Collective over comm.
double clip_grad_norm(const std::vector<at::Tensor>& grad_shards, double max_norm,
                      dist::Communicator* comm);
// The scaling of clip_grad_norm for a norm the caller already has (from global_grad_norm_sq).
void clip_grad_norm_by(const std::vector<at::Tensor>& grad_shards, double max_norm, double total_norm);

// True when any rank's gradients hold inf or NaN. Collective over comm (may be nullptr).
bool any_non_finite(const std::vector<at::Tensor>& grad_shards, dist::Communicator* comm);

}  // namespace alpaca::optim
