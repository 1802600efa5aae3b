// A small bf16 GEMM on packed operands for the GEMM attention (attention_cpu.cpp), internal to src/model/.
//
// Operands are 32-bit words each holding two bf16 values consecutive along the reduction dimension
// (the VNNI layout AVX512-BF16's VDPBF16PS multiplies), so a K x N matrix is kp = ceil(K / 2) rows
// of N words, an odd K padded with a zero:
//   c[i * ldc + j] (+)= sum_p  a[i * a_rs + p * a_ks] . B(p, j)     i < m, j < n, p < kp
// where "." is the two-term dot product, summed in fp32. A row-major bf16 A (K contiguous, even
// row stride lda) is a = its words, a_rs = lda / 2, a_ks = 1; a transposed A comes from pack_rows
// (a_rs = 1, a_ks = its row length). B is stored in panels of kPanel columns (Packed):
// B(p, j) = b[(j / kPanel) * panel + p * ldb + j % kPanel]. Row-major words (rows_of: panel =
// kPanel) or panel after panel, each kp x kPanel words contiguous (panels_of: ldb = kPanel): what
// pack_cols writes, so that a transposed operand's packing and the kernel's loads of B walk 4 KiB
// blocks rather than rows a power of two apart (which share a handful of L1 sets).
//
// Three backends run the product (bf16_gemm.cpp picks one per process):
// - own: our register-blocked kernel (8 x 32 fp32 accumulators, one VDPBF16PS per 16 x 2 multiply-adds),
//   the default on CPUs with AVX512-BF16 and without AMX (AMD Zen 4/5, Intel Cooper Lake), where
//   ATen's bf16 -> fp32 GEMM is MKL's, which converts to fp32 and runs an fp32 kernel (~80 GFLOP/s a
//   core on this EPYC); it honours every causal hint below;
// - onednn: oneDNN's brgemm ukernel through ATen (cpublas::brgemm on our words, which are its VNNI B
//   layout), the default on AMX CPUs, where it runs on the tiles (as ATen's own flash attention does);
//   it runs on any AVX-512 CPU (here, too: tests and measurements) and honours the kCols hint per
//   32-column panel;
// - cpublas: the operands unpacked and ATen's cpublas GEMM, where neither runs (AVX2-only CPUs).
// ALPACA_BF16_GEMM=own|onednn|cpublas picks another the CPU runs (auto: the default).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace alpaca::model::bf16gemm {

enum class Backend : uint8_t { kOwn, kOnednn, kCpublas };
const char* name(Backend b);
std::optional<Backend> backend_named(const std::string& s);  // the Backend whose name() is s
bool runs(Backend b);          // whether this CPU (and this LibTorch) runs b
Backend backend();             // the one gemm() takes
void set_backend(Backend b);   // tests and benchmarks; refuses one that does not run here
// The GEMM attention and the lm_head gradient summed inside the GEMM take these products where they
// are fast: our kernel, or oneDNN's on an AMX CPU (not on a CPU whose oneDNN kernel would emulate bf16).
bool fast();
// Ends this thread's use of the onednn backend (on AMX, releases the tile configuration): call at the
// end of a task that ran gemm(), as ATen's flash attention does; nothing for the others.
void release();

constexpr int64_t kPanel = 32;

struct Packed {
  const uint32_t* b;
  int64_t ldb, panel;
};
inline Packed rows_of(const uint32_t* b, int64_t ldb) { return {b, ldb, kPanel}; }
inline Packed panels_of(const uint32_t* b, int64_t kp) { return {b, kPanel, kPanel * kp}; }
// Words of panels_of storage for a kp x n B (n rounded up to whole panels).
inline int64_t panels_size(int64_t kp, int64_t n) { return (n + kPanel - 1) / kPanel * kPanel * kp; }

// The causal attention's products on a block of queries from `diag` leave tiles of work that only
// meets zeros (probabilities of keys after the query) or feeds nothing the softmax reads. A hint lets
// our kernel skip them per 8-row tile; the result is the same (terms that are exactly zero are left
// out; the fallback ignores the hint and computes them):
//   kCols       row i's columns j >= diag + i + 1 are not needed (S = Q K^T, dP = dO V^T: left unset),
//   kDepthTo    row i's A is zero from word (diag + i + 1) / 2 on (O = P V, dQ = dS K),
//   kDepthFrom  row i's A is zero below word (i - diag) / 2 (dV += P^T dO, dK += dS^T Q: i a key).
struct Causal {
  enum Kind : uint8_t { kNone, kCols, kDepthTo, kDepthFrom } kind = kNone;
  int64_t diag = 0;
};

void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_rs, int64_t a_ks, const Packed& b, float* c,
          int64_t ldc, bool add, Causal hint = {});

// dst[p * cols + j] = (src[2p][j], src[2p + 1][j]) for p < ceil(rows / 2), j < cols (a zero partner
// for an odd last row): B = src (K = rows) packed, or A = src^T packed (a_rs = 1, a_ks = cols).
void pack_rows(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst);

// B = src^T packed in panels (panels_of(dst, cols / 2), panels_size(cols / 2, rows) words): B(p, i) =
// (src[i][2p], src[i][2p + 1]) for i < rows, p < cols / 2 (cols even), K = cols; the columns from
// rows to the end of the last panel are zero.
void pack_cols(const uint16_t* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst);

}  // namespace alpaca::model::bf16gemm
