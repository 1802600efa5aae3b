// LibTorch's BLAS sgemm_, looked up at run time; see blas.h.
#include "blas.h"

#include <dlfcn.h>

#include "alpaca/util/error.h"

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

void mm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, float beta) {
  const auto rows_of = [](const at::Tensor& t, bool& transposed) {  // the stride between rows of the stored matrix
    transposed = t.size(1) > 1 && t.stride(1) != 1;
    ALPACA_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_cpu() && (transposed ? t.stride(0) == 1 : true),
                 "blas::mm: needs 2-D fp32 CPU matrices with a unit stride, got " << t.sizes() << " " << t.strides());
    return transposed ? t.stride(1) : std::max<int64_t>(t.stride(0), std::max<int64_t>(t.size(1), 1));
  };
  bool a_t = false, b_t = false, c_t = false;
  const int64_t lda = rows_of(a, a_t), ldb = rows_of(b, b_t), ldc = rows_of(c, c_t);
  ALPACA_CHECK(!c_t && a.size(1) == b.size(0) && c.size(0) == a.size(0) && c.size(1) == b.size(1),
               "blas::mm: " << a.sizes() << " x " << b.sizes() << " into " << c.sizes());
  sgemm(a_t, b_t, a.size(0), b.size(1), a.size(1), a.const_data_ptr<float>(), lda, b.const_data_ptr<float>(), ldb, beta,
        c.mutable_data_ptr<float>(), ldc);
}

}  // namespace alpaca::model::blas
