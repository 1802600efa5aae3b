// bitsandbytes' AdamW inside ShardedAdamW (include/alpaca/optim/adamw.h): the update of its CPU
// kernels (bitsandbytes/backends/cpu/ops.py, 0.50: _optimizer_update_32bit_cpu and
// _optimizer_update_8bit_blockwise_cpu with the default backend's quantize_blockwise /
// dequantize_blockwise), written with the same ATen operations in the same order so a parameter
// held whole by one rank gets bitsandbytes' values bit for bit. Written here, not called: the
// kernels live in Python, and the 8-bit state has to follow a parameter cut across ranks.
//
// At 8 bits a moment is stored per block of 256 of its parameter's elements: absmax (the block's
// largest magnitude) and one uint8 code per element. bitsandbytes' native CPU quantizer
// (csrc/cpu_ops.cpp quantize_cpu_impl) finds the code through a 65536-entry table: value x absmax's
// reciprocal, clamped to [-1, 1], mapped to a table index (t + 1) / 2 x 65535 + 0.5 truncated, the
// table holding for each index the number of map midpoints below -1 + 2 i / 65535. Near zero that is
// coarser than the nearest code, so it is reproduced as is (a block of zeros: scale 0, codes 0). A
// block cut by a shard boundary is quantized by each rank for its part with the maximum over all
// parts (one all-reduce of the cut blocks' partial maxima per step, through the BlockMaxReducer).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "alpaca/optim/adamw.h"
#include "alpaca/util/error.h"

namespace alpaca::optim {
namespace {

constexpr int64_t kBnbBlock = 256;         // the CPU kernels' blocksize
constexpr int64_t kBnbMin8BitSize = 4096;  // Optimizer8bit's min_8bit_size default
constexpr int64_t kBnbLutSize = 65536;     // cpu_ops.cpp kLUTSize
constexpr int64_t kBnbChunk = int64_t{1} << 20;  // elements per quantize / dequantize pass (temporaries)

// functional.create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), computed as there: for
// each exponent i, the midpoints of linspace(0.1, 1, 2^i + 1) (signed; 2^(i+1) + 1 unsigned) in
// fp32, times 10^(i - 6) (and its negation when signed), then 0 and 1, sorted.
at::Tensor bnb_dynamic_map(bool is_signed) {
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const at::Tensor b = at::linspace(0.1, 1, items, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor means = (b.slice(0, 0, items - 1) + b.slice(0, 1)) / 2.0;
    // Python's 10 ** (i - 6): an int (1) at i = 6, else pow(10.0, i - 6).
    const double scale = i == 6 ? 1.0 : std::pow(10.0, static_cast<double>(i - 6));
    for (const at::Tensor& t : {means * scale, means * -scale}) {
      const at::Tensor c = t.contiguous();
      const float* p = c.data_ptr<float>();
      data.insert(data.end(), p, p + c.numel());
      if (!is_signed) break;
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  ALPACA_CHECK(data.size() == 256, "bitsandbytes' dynamic map has " << data.size() << " entries");
  std::sort(data.begin(), data.end());
  return at::tensor(data, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
}

struct BnbMaps {
  at::Tensor code[2], lut[2];  // [0] signed (first moment), [1] unsigned (second)
};

// cpu_ops.cpp build_quantize_lut: for table index i, the number of midpoints 0.5 (c[j] + c[j+1])
// below -1 + 2 i / 65535, all in float.
at::Tensor bnb_quantize_lut(const at::Tensor& code) {
  const float* c = code.data_ptr<float>();
  float mid[255];
  for (int j = 0; j < 255; ++j) mid[j] = 0.5f * (c[j] + c[j + 1]);
  at::Tensor lut = at::empty({kBnbLutSize}, at::TensorOptions().dtype(at::kByte));
  uint8_t* out = lut.data_ptr<uint8_t>();
  int idx = 0;
  for (int64_t i = 0; i < kBnbLutSize; ++i) {
    const float val = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kBnbLutSize - 1);
    while (idx < 255 && mid[idx] < val) ++idx;
    out[i] = static_cast<uint8_t>(idx);
  }
  return lut;
}

const BnbMaps& bnb_maps() {
  static const BnbMaps maps = [] {
    BnbMaps m;
    for (int k = 0; k < 2; ++k) {
      m.code[k] = bnb_dynamic_map(k == 0);
      m.lut[k] = bnb_quantize_lut(m.code[k]);
    }
    return m;
  }();
  return maps;
}

// A segment cut at its parameter's blocks: a piece is one partial block or a run of whole blocks.
struct BlockPiece {
  int64_t offset = 0;  // in the segment
  int64_t numel = 0;
  int64_t block = 0;   // the first block, counted from the segment's first
  int64_t blocks = 1;
  bool cut = false;  // a single block continuing on another rank
};

std::vector<BlockPiece> block_pieces(const ParamSegment& seg) {
  std::vector<BlockPiece> out;
  const int64_t pb = seg.param_begin, n = seg.numel, pn = seg.param_numel;
  const int64_t first = pb / kBnbBlock;
  int64_t o = 0;
  auto single = [&](int64_t len) {
    BlockPiece p;
    p.offset = o;
    p.numel = len;
    p.block = (pb + o) / kBnbBlock - first;
    const int64_t start = (pb + o) / kBnbBlock * kBnbBlock;
    const int64_t end = std::min(start + kBnbBlock, pn);
    p.cut = start < pb + o || end > pb + o + len;
    out.push_back(p);
    o += len;
  };
  if (pb % kBnbBlock != 0) single(std::min(n, kBnbBlock - pb % kBnbBlock));
  const int64_t whole = (n - o) / kBnbBlock;
  if (whole > 0) {
    out.push_back({o, whole * kBnbBlock, (pb + o) / kBnbBlock - first, whole, false});
    o += whole * kBnbBlock;
  }
  if (o < n) single(n - o);
  return out;
}

int64_t blocks_touched(const ParamSegment& seg) {
  return seg.numel == 0 ? 0 : (seg.param_begin + seg.numel - 1) / kBnbBlock - seg.param_begin / kBnbBlock + 1;
}

bool single_block(const BlockPiece& p) { return p.blocks == 1 && p.numel != kBnbBlock; }

// dequantizeBlockwise8bitCpu: code[q] times the block's scale, in chunks of whole blocks.
void bnb_dequantize(const at::Tensor& q, const at::Tensor& absmax, const at::Tensor& code,
                    const std::vector<BlockPiece>& pieces, at::Tensor& out) {
  const at::Tensor table = code.to(q.device());
  for (const BlockPiece& p : pieces) {
    if (single_block(p)) {
      out.narrow(0, p.offset, p.numel)
          .copy_(table.index({q.narrow(0, p.offset, p.numel).to(at::kLong)}) * absmax[p.block]);
      continue;
    }
    for (int64_t b = 0; b < p.blocks; b += kBnbChunk / kBnbBlock) {
      const int64_t nb = std::min(kBnbChunk / kBnbBlock, p.blocks - b);
      const int64_t off = p.offset + b * kBnbBlock;
      const at::Tensor v = table.index({q.narrow(0, off, nb * kBnbBlock).to(at::kLong)}).view({nb, kBnbBlock});
      out.narrow(0, off, nb * kBnbBlock).view({nb, kBnbBlock}).copy_(v * absmax.narrow(0, p.block + b, nb).view({nb, 1}));
    }
  }
}

// quantize_cpu_impl's codes for `x` (nb blocks of 256, or one partial block) with scales `scale`
// (nb, 1) or 0-dim: table[trunc((clamp(x / scale, -1, 1) + 1) * 0.5 * 65535 + 0.5)], where x / scale
// is x times the float reciprocal; a block of scale 0 gets code 0.
at::Tensor bnb_codes(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& lut) {
  const at::Tensor inv = scale.reciprocal();
  at::Tensor t = at::clamp(x * inv, -1, 1);
  t = ((t + 1.0) * 0.5) * static_cast<double>(kBnbLutSize - 1) + 0.5;
  at::Tensor codes = lut.to(x.device()).index({t.to(at::kInt).to(at::kLong)});
  return codes.masked_fill_((scale == 0).expand_as(codes), 0);
}

// The codes whose dequantized values are `x` (a checkpoint's moments, code[q] x scale): per block the
// first q with code[q] x scale >= x (the products rise with q), which is that q; where two codes
// give the same product (a scale so small the products round together) either restores the same
// moment, all the next step reads.
at::Tensor bnb_codes_of_dequantized(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& code) {
  const at::Tensor table = code.to(x.device());
  if (x.dim() == 1) return at::searchsorted(table * scale, x).to(at::kByte);
  const at::Tensor products = table.view({1, -1}) * scale;  // (nb, 256)
  return at::searchsorted(products, x).to(at::kByte);
}

// The codes of one piece from the state's scales: quantized (a step), or recovered from the
// dequantized values (a restore).
void bnb_restore_piece(const at::Tensor& x, const at::Tensor& absmax, const at::Tensor& code, const BlockPiece& p,
                       at::Tensor& q) {
  if (single_block(p)) {
    q.narrow(0, p.offset, p.numel).copy_(bnb_codes_of_dequantized(x.narrow(0, p.offset, p.numel), absmax[p.block], code));
    return;
  }
  for (int64_t b = 0; b < p.blocks; b += kBnbChunk / kBnbBlock) {
    const int64_t nb = std::min(kBnbChunk / kBnbBlock, p.blocks - b);
    const int64_t off = p.offset + b * kBnbBlock;
    q.narrow(0, off, nb * kBnbBlock)
        .view({nb, kBnbBlock})
        .copy_(bnb_codes_of_dequantized(x.narrow(0, off, nb * kBnbBlock).view({nb, kBnbBlock}),
                                        absmax.narrow(0, p.block + b, nb).view({nb, 1}), code));
  }
}

// The codes of one piece from the state's scales.
void bnb_quantize_piece(const at::Tensor& x, const at::Tensor& absmax, const at::Tensor& lut, const BlockPiece& p,
                        at::Tensor& q) {
  if (single_block(p)) {
    q.narrow(0, p.offset, p.numel).copy_(bnb_codes(x.narrow(0, p.offset, p.numel), absmax[p.block], lut));
    return;
  }
  for (int64_t b = 0; b < p.blocks; b += kBnbChunk / kBnbBlock) {
    const int64_t nb = std::min(kBnbChunk / kBnbBlock, p.blocks - b);
    const int64_t off = p.offset + b * kBnbBlock;
    q.narrow(0, off, nb * kBnbBlock)
        .view({nb, kBnbBlock})
        .copy_(bnb_codes(x.narrow(0, off, nb * kBnbBlock).view({nb, kBnbBlock}),
                         absmax.narrow(0, p.block + b, nb).view({nb, 1}), lut));
  }
}

// The largest magnitude of each block of a piece (a cut block's: this rank's part).
void piece_absmax(const at::Tensor& x, const BlockPiece& p, at::Tensor& absmax) {
  const at::Tensor a = x.narrow(0, p.offset, p.numel).abs();
  if (single_block(p)) {
    absmax.narrow(0, p.block, 1).copy_(a.max().reshape({1}));
  } else {
    absmax.narrow(0, p.block, p.blocks).copy_(std::get<0>(a.view({p.blocks, kBnbBlock}).max(1)));
  }
}

// The shard boundaries (flat positions k * S, k in 1..world-1) inside a cut block: the reduction
// slots its partial maxima go to.
std::vector<int64_t> cut_slots(const OptimShard& s, const ParamSegment& seg, const BlockPiece& p) {
  const int64_t S = s.param.numel();
  const int64_t param_flat = s.shard_rank * S + seg.offset - seg.param_begin;
  const int64_t start = param_flat + ((seg.param_begin + p.offset) / kBnbBlock) * kBnbBlock;
  const int64_t end = std::min(start + kBnbBlock, param_flat + seg.param_numel);
  std::vector<int64_t> slots;
  for (int64_t k = 1; k < s.shard_world; ++k)
    if (start < k * S && k * S < end) slots.push_back(k - 1);
  return slots;
}

using SegmentState = ShardedAdamW::SegmentState;

// A cut block's values waiting for the maxima of the other ranks' parts.
struct PendingCut {
  SegmentState* st = nullptr;
  BlockPiece piece;
  std::vector<int64_t> slots;  // reduction slots: the shard's first slot + boundary
  at::Tensor values[2];        // this rank's part of each moment
};

// Quantizes an 8-bit segment's fp32 moments `m`, `v` into its codes. given_scales: a restore, the
// state's absmax arrays already hold the blocks' scales and m, v are dequantized values, whose
// codes are recovered exactly; else each block's largest magnitude is taken, and the blocks cut by
// a shard boundary wait in `pending` for finish_cut_blocks.
void quantize_segment(const OptimShard& s, const ParamSegment& seg, SegmentState& st, const at::Tensor& m,
                      const at::Tensor& v, bool given_scales, int64_t slot_base, std::vector<PendingCut>* pending) {
  const BnbMaps& maps = bnb_maps();
  for (const BlockPiece& piece : block_pieces(seg)) {
    if (!given_scales) {
      piece_absmax(m, piece, st.absmax1);
      piece_absmax(v, piece, st.absmax2);
      if (piece.cut) {
        PendingCut c;
        c.st = &st;
        c.piece = piece;
        for (int64_t slot : cut_slots(s, seg, piece)) c.slots.push_back(slot_base + slot);
        c.values[0] = m.narrow(0, piece.offset, piece.numel).clone();
        c.values[1] = v.narrow(0, piece.offset, piece.numel).clone();
        pending->push_back(std::move(c));
        continue;
      }
    }
    if (given_scales) {
      bnb_restore_piece(m, st.absmax1, maps.code[0], piece, st.q1);
      bnb_restore_piece(v, st.absmax2, maps.code[1], piece, st.q2);
    } else {
      bnb_quantize_piece(m, st.absmax1, maps.lut[0], piece, st.q1);
      bnb_quantize_piece(v, st.absmax2, maps.lut[1], piece, st.q2);
    }
  }
}

// The cut blocks' scales: every rank's part maximum, all-reduced (MAX) over the shard group in one
// (2, slots) tensor, then each part quantized with the block's scale.
void finish_cut_blocks(std::vector<PendingCut>& pending, int64_t num_slots, const BlockMaxReducer& reducer) {
  at::Tensor maxima = at::zeros({2, num_slots}, at::TensorOptions().dtype(at::kFloat));
  for (const PendingCut& c : pending)
    for (int j = 0; j < 2; ++j) {
      const float partial = (j == 0 ? c.st->absmax1 : c.st->absmax2)[c.piece.block].item<float>();
      for (int64_t slot : c.slots) {
        at::Tensor cell = maxima[j][slot];
        cell.fill_(std::max(cell.item<float>(), partial));
      }
    }
  ALPACA_CHECK(reducer, "bitsandbytes AdamW: a block spans shards but no BlockMaxReducer was set");
  reducer(maxima);
  const BnbMaps& maps = bnb_maps();
  for (PendingCut& c : pending) {
    BlockPiece one = c.piece;  // the piece alone: offset 0 in its own values, its block first
    one.offset = 0;
    one.block = 0;
    for (int j = 0; j < 2; ++j) {
      at::Tensor& absmax = j == 0 ? c.st->absmax1 : c.st->absmax2;
      at::Tensor& q = j == 0 ? c.st->q1 : c.st->q2;
      const at::Tensor scale = maxima[j].index({at::tensor(c.slots, at::kLong)}).max().to(absmax.device());
      absmax.narrow(0, c.piece.block, 1).copy_(scale.reshape({1}));
      at::Tensor codes = at::empty({c.piece.numel}, q.options());
      bnb_quantize_piece(c.values[j], absmax.narrow(0, c.piece.block, 1), maps.lut[j], one, codes);
      q.narrow(0, c.piece.offset, c.piece.numel).copy_(codes);
    }
  }
}

}  // namespace

void ShardedAdamW::init_bnb_states() {
  const bool eight_bits = options_.bnb_bits == 8;
  seg_states_.assign(shards_.size(), {});
  for (size_t i = 0; i < shards_.size(); ++i) {
    const OptimShard& s = shards_[i];
    for (const ParamSegment& seg : s.segments) {
      SegmentState st;
      ALPACA_CHECK(!eight_bits || seg.param_numel >= seg.param_begin + seg.numel,
                   "bitsandbytes AdamW: shard " << i << " has a segment without its parameter's extent");
      st.eight = eight_bits && !seg.embedding && seg.param_numel >= kBnbMin8BitSize;
      const auto opts = s.param.options();
      if (st.eight) {
        st.first_block = seg.param_begin / kBnbBlock;
        st.q1 = at::zeros({seg.numel}, opts.dtype(at::kByte));
        st.q2 = at::zeros({seg.numel}, opts.dtype(at::kByte));
        st.absmax1 = at::zeros({blocks_touched(seg)}, opts);
        st.absmax2 = at::zeros({blocks_touched(seg)}, opts);
      } else if (eight_bits) {
        st.m = at::zeros({seg.numel}, opts);
        st.v = at::zeros({seg.numel}, opts);
      }
      seg_states_[i].push_back(std::move(st));
    }
  }
}

bool ShardedAdamW::cuts_blocks() const {
  if (options_.bnb_bits != 8) return false;
  for (const OptimShard& s : shards_)
    if (s.shard_world > 1) return true;
  return false;
}

void ShardedAdamW::step_bnb(double lr) {
  const double b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const double step = static_cast<double>(step_count_);
  // Python: 1.0 - beta1**step, math.sqrt(1.0 - beta2**step).
  const double correction1 = 1.0 - std::pow(b1, step);
  const double correction2 = std::sqrt(1.0 - std::pow(b2, step));
  const BnbMaps& maps = bnb_maps();
  std::vector<PendingCut> pending;
  int64_t num_slots = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const OptimShard& s = shards_[i];
    const int64_t slot_base = num_slots;
    num_slots += s.shard_world - 1;
    for (size_t k = 0; k < s.segments.size(); ++k) {
      const ParamSegment& seg = s.segments[k];
      if (seg.numel == 0) continue;
      SegmentState& st = seg_states_[i][k];
      at::Tensor p = s.param.narrow(0, seg.offset, seg.numel);
      const at::Tensor g = s.grad.narrow(0, seg.offset, seg.numel);
      const double wd = seg.decay ? options_.weight_decay : 0.0;
      const at::Tensor gf = g * 1.0;  // g.float() * gnorm_scale (1.0)
      if (!st.eight) {
        // _optimizer_update_32bit_cpu, "adam" (max_unorm 0: update_scale 1).
        at::Tensor m = st.m.defined() ? st.m : exp_avg_[i].narrow(0, seg.offset, seg.numel);
        at::Tensor v = st.v.defined() ? st.v : exp_avg_sq_[i].narrow(0, seg.offset, seg.numel);
        m.mul_(b1).add_(gf, 1.0 - b1);
        v.mul_(b2).addcmul_(gf, gf, 1.0 - b2);
        const double step_size = -lr * correction2 / correction1;
        if (wd > 0.0) p.mul_(1.0 - lr * wd);
        const at::Tensor update = m / (v.sqrt() + eps * correction2);
        p.add_(update, step_size * 1.0);
        continue;
      }
      // _optimizer_update_8bit_blockwise_cpu, "adam".
      const std::vector<BlockPiece> pieces = block_pieces(seg);
      at::Tensor m = at::empty({seg.numel}, s.param.options()), v = at::empty({seg.numel}, s.param.options());
      bnb_dequantize(st.q1, st.absmax1, maps.code[0], pieces, m);
      bnb_dequantize(st.q2, st.absmax2, maps.code[1], pieces, v);
      m.mul_(b1).add_(gf, 1.0 - b1);
      v.mul_(b2).addcmul_(gf, gf, 1.0 - b2);
      const at::Tensor denom = (v.sqrt() / correction2).add_(eps);
      if (wd > 0.0) p.mul_(1.0 - lr * wd);
      p.addcdiv_(m, denom, -lr / correction1);
      quantize_segment(s, seg, st, m, v, /*given_scales=*/false, slot_base, &pending);
    }
    s.param.unsafeGetTensorImpl()->bump_version();
  }
  if (cuts_blocks()) finish_cut_blocks(pending, num_slots, reducer_);
}

void ShardedAdamW::begin_state_io() {
  if (!quantized()) return;
  ALPACA_CHECK(!io_open_, "ShardedAdamW::begin_state_io twice");
  const BnbMaps& maps = bnb_maps();
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (auto& a : absmax_io_) a.clear();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const OptimShard& s = shards_[i];
    at::Tensor m = at::zeros_like(s.param), v = at::zeros_like(s.param);
    at::Tensor a1 = at::zeros_like(s.param), a2 = at::zeros_like(s.param);
    for (size_t k = 0; k < s.segments.size(); ++k) {
      const ParamSegment& seg = s.segments[k];
      if (seg.numel == 0) continue;
      const SegmentState& st = seg_states_[i][k];
      at::Tensor ms = m.narrow(0, seg.offset, seg.numel), vs = v.narrow(0, seg.offset, seg.numel);
      if (!st.eight) {
        ms.copy_(st.m);
        vs.copy_(st.v);
        continue;
      }
      const auto pieces = block_pieces(seg);
      bnb_dequantize(st.q1, st.absmax1, maps.code[0], pieces, ms);
      bnb_dequantize(st.q2, st.absmax2, maps.code[1], pieces, vs);
      // Each element's block scale: "dequantize" code 1.0 everywhere.
      const at::Tensor one = at::ones({1}, s.param.options());
      const at::Tensor zeros = at::zeros({seg.numel}, s.param.options().dtype(at::kByte));
      at::Tensor as1 = a1.narrow(0, seg.offset, seg.numel), as2 = a2.narrow(0, seg.offset, seg.numel);
      bnb_dequantize(zeros, st.absmax1, one, pieces, as1);
      bnb_dequantize(zeros, st.absmax2, one, pieces, as2);
    }
    exp_avg_.push_back(m);
    exp_avg_sq_.push_back(v);
    absmax_io_[0].push_back(a1);
    absmax_io_[1].push_back(a2);
  }
  io_open_ = true;
}

void ShardedAdamW::end_state_io(bool written, bool have_absmax) {
  if (!quantized()) return;
  ALPACA_CHECK(io_open_, "ShardedAdamW::end_state_io without begin_state_io");
  if (written) {
    std::vector<PendingCut> pending;
    int64_t num_slots = 0;
    for (size_t i = 0; i < shards_.size(); ++i) {
      const OptimShard& s = shards_[i];
      const int64_t slot_base = num_slots;
      num_slots += s.shard_world - 1;
      for (size_t k = 0; k < s.segments.size(); ++k) {
        const ParamSegment& seg = s.segments[k];
        if (seg.numel == 0) continue;
        SegmentState& st = seg_states_[i][k];
        const at::Tensor m = exp_avg_[i].narrow(0, seg.offset, seg.numel);
        const at::Tensor v = exp_avg_sq_[i].narrow(0, seg.offset, seg.numel);
        if (!st.eight) {
          st.m.copy_(m);
          st.v.copy_(v);
          continue;
        }
        if (have_absmax) {
          // Each block's scale from any of its elements (all equal): the first of each block.
          for (const BlockPiece& piece : block_pieces(seg))
            for (int j = 0; j < 2; ++j) {
              const at::Tensor a = absmax_io_[j][i].narrow(0, seg.offset + piece.offset, piece.numel);
              (j == 0 ? st.absmax1 : st.absmax2)
                  .narrow(0, piece.block, piece.blocks)
                  .copy_(single_block(piece) ? a.narrow(0, 0, 1) : a.view({piece.blocks, kBnbBlock}).select(1, 0));
            }
        }
        quantize_segment(s, seg, st, m, v, have_absmax, slot_base, &pending);
      }
    }
    if (!have_absmax && cuts_blocks()) finish_cut_blocks(pending, num_slots, reducer_);
  }
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (auto& a : absmax_io_) a.clear();
  io_open_ = false;
}

at::Tensor bnb_quantization_map(bool is_signed) { return bnb_maps().code[is_signed ? 0 : 1]; }

ShardedAdamW::QuantState ShardedAdamW::quant_state(size_t shard, size_t segment) const {
  const SegmentState& st = seg_states_.at(shard).at(segment);
  if (!st.eight) return {};
  return {st.q1, st.q2, st.absmax1, st.absmax2};
}

}  // namespace alpaca::optim
