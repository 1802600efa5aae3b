// Exactly sized page-locked host tensors; see include/alpaca/util/pinned.h.
#include "alpaca/util/pinned.h"

#ifdef ALPACA_WITH_CUDA
#include <cuda_runtime_api.h>  // defines: cudaHostAlloc, cudaFreeHost
#endif

#include <c10/util/accumulate.h>  // defines: c10::multiply_integers

#include "alpaca/util/error.h"

namespace alpaca::util {

at::Tensor empty_pinned(at::IntArrayRef sizes, at::ScalarType dtype) {
  const int64_t numel = c10::multiply_integers(sizes);
  if (numel == 0) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
#ifdef ALPACA_WITH_CUDA
  void* ptr = nullptr;
  const cudaError_t rc = cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it
    ALPACA_FAIL("pinned host memory: cudaHostAlloc of " << bytes << " bytes failed (" << cudaGetErrorString(rc)
                                                        << "): the host's memory, or the locked-memory limit "
                                                           "(`ulimit -l`), is exhausted; offload less or free host memory");
  }
  // cudaFreeHost's status is ignored: at process exit the CUDA runtime may already be unloading.
  return at::from_blob(ptr, sizes, [](void* p) { (void)cudaFreeHost(p); }, at::TensorOptions().dtype(dtype));
#else
  ALPACA_FAIL("pinned host memory (" << bytes << " bytes) needs a build with CUDA; this one has none");
#endif
}

}  // namespace alpaca::util
