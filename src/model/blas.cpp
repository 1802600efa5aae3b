// LibTorch's BLAS sgemm_, looked up at run time; see blas.h.
#include "blas.h"

#include <dlfcn.h>

namespace alpaca::model::blas {
namespace {

using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);

SgemmFn sgemm_fn() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

}  // namespace

bool sgemm_available() { return sgemm_fn() != nullptr; }

void sgemm(bool a_t, bool b_t, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  // BLAS is column-major: C^T = op(B)^T op(A)^T, with B's and A's roles and sizes swapped.
  const char ta = b_t ? 'T' : 'N', tb = a_t ? 'T' : 'N';
  const int im = static_cast<int>(n), in = static_cast<int>(m), ik = static_cast<int>(k), ila = static_cast<int>(ldb),
            ilb = static_cast<int>(lda), ilc = static_cast<int>(ldc);
  const float one = 1.0f;
  sgemm_fn()(&ta, &tb, &im, &in, &ik, &one, b, &ila, a, &ilb, &beta, c, &ilc);
}

}  // namespace alpaca::model::blas
