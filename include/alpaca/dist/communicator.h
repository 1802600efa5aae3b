// The only way ranks talk (DESIGN.md, "The communicator"). Two backends implement it: MPI for CPU
// tensors and NCCL for CUDA tensors; callers never know which. Every collective is called by all
// ranks of the communicator, in the same order, with tensors of matching dtype and size.
// Collectives return immediately with a handle; `wait()` blocks the host (CPU) or makes the
// current compute stream wait on the communication stream (CUDA), and throws alpaca::Error naming
// the operation when it fails or exceeds the communicator's timeout.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor, at::Device

#include <chrono>
#include <memory>
#include <string>

namespace alpaca::dist {

enum class ReduceOp { kSum, kAvg, kMax };

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual at::Device device() const = 0;  // where this rank's tensors live (kCPU or cuda:local)
  virtual std::string backend() const = 0;  // "mpi" or "nccl"

  // out (world*n) <- concatenation of every rank's in (n), in rank order. Contiguous, same dtype.
  virtual WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) = 0;
  // out (n) <- op over ranks of in[rank*n : (rank+1)*n]; in has world*n elements.
  virtual WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op) = 0;
  // t <- op over ranks of t (in place).
  virtual WorkHandle all_reduce(at::Tensor t, ReduceOp op) = 0;
  // t <- root's t (in place).
  virtual WorkHandle broadcast(at::Tensor t, int root) = 0;
  // Its wait() blocks the host until every rank of the communicator called barrier(), on every
  // backend (NCCL included): checkpoint sealing and shutdown rely on host ordering.
  virtual WorkHandle barrier() = 0;

  // A sub-communicator of the ranks passing the same color, ordered by key (MPI_Comm_split
  // semantics). Collective over this communicator. Used for hybrid sharding (intra/inter node).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;
};

}  // namespace alpaca::dist
