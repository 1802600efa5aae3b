// bitsandbytes' AdamW and Lion inside ShardedAdamW (include/alpaca/optim/adamw.h): the update of its
// CPU kernels (bitsandbytes/backends/cpu/ops.py, 0.50: _optimizer_update_32bit_cpu and
// _optimizer_update_8bit_blockwise_cpu with the default backend's quantize_blockwise /
// dequantize_blockwise; "adam" and "lion"), written with the same ATen operations in the same order
// so a parameter held whole by one rank gets bitsandbytes' values bit for bit. Lion has one state,
// the momentum (state1: the signed map); what follows for "the moments" holds for it alone. Written
// here, not called: the kernels live in Python, and the 8-bit state has to follow a parameter cut
// across ranks.
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
#include <mutex>
#include <string>

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

// `t` (a CPU table: a map or the quantizer's table) on device `d`, copied there once.
const at::Tensor& table_on(const at::Tensor& t, const at::Device& d) {
  if (d.is_cpu()) return t;
  static std::mutex mu;
  static std::map<std::pair<const void*, std::string>, at::Tensor> cache;
  std::lock_guard<std::mutex> lock(mu);
  at::Tensor& slot = cache[{t.data_ptr(), d.str()}];
  if (!slot.defined()) slot = t.to(d);
  return slot;
}

// A segment cut at its parameter's blocks: a piece is one partial block or a run of whole blocks
// (at most kBnbChunk elements, so a step's fp32 temporaries stay small).
struct BlockPiece {
  int64_t offset = 0;  // in the segment
  int64_t numel = 0;
  int64_t block = 0;   // the first block, counted from the segment's first
  int64_t blocks = 1;
  bool cut = false;    // a partial block continuing on another rank
};

std::vector<BlockPiece> block_pieces(const ParamSegment& seg) {
  std::vector<BlockPiece> out;
  const int64_t pb = seg.param_begin, n = seg.numel, pn = seg.param_numel;
  const int64_t first = pb / kBnbBlock;
  int64_t o = 0;
  auto single = [&](int64_t len) {
    const int64_t start = (pb + o) / kBnbBlock * kBnbBlock;
    const int64_t end = std::min(start + kBnbBlock, pn);
    out.push_back({o, len, (pb + o) / kBnbBlock - first, 1, start < pb + o || end > pb + o + len});
    o += len;
  };
  if (pb % kBnbBlock != 0) single(std::min(n, kBnbBlock - pb % kBnbBlock));
  while (n - o >= kBnbBlock) {
    const int64_t blocks = std::min((n - o) / kBnbBlock, kBnbChunk / kBnbBlock);
    out.push_back({o, blocks * kBnbBlock, (pb + o) / kBnbBlock - first, blocks, false});
    o += blocks * kBnbBlock;
  }
  if (o < n) single(n - o);
  return out;
}

// Optimizer8bit.init_state: 8-bit moments from min_8bit_size elements on, except where transformers
// registered the 32-bit override (nn.Embedding weights).
bool keeps_8bit_moments(const ParamSegment& seg) { return !seg.embedding && seg.param_numel >= kBnbMin8BitSize; }

int64_t blocks_touched(const ParamSegment& seg) {
  return seg.numel == 0 ? 0 : (seg.param_begin + seg.numel - 1) / kBnbBlock - seg.param_begin / kBnbBlock + 1;
}

// The piece's elements as (blocks, 256), or one partial block as (1, n).
at::Tensor as_blocks(const at::Tensor& x, const BlockPiece& p) {
  return p.numel == p.blocks * kBnbBlock ? x.view({p.blocks, kBnbBlock}) : x.view({1, p.numel});
}

// dequantizeBlockwise8bitCpu for one piece: code[q] times its block's scale. `q` is the piece's
// codes, `scales` its blocks' scales; returns fp32 (numel).
at::Tensor dequantize_piece(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& code, const BlockPiece& p) {
  const at::Tensor values = table_on(code, q.device()).index({q.to(at::kLong)});
  return (as_blocks(values, p) * scales.view({p.blocks, 1})).reshape({-1});
}

// Each block's largest magnitude (a cut block's: this rank's part).
void piece_absmax(const at::Tensor& x, const BlockPiece& p, at::Tensor scales) {
  scales.copy_(std::get<0>(as_blocks(x, p).abs().max(1)));
}

// quantize_cpu_impl for one piece with its blocks' scales: table[trunc((clamp(x * (1 / scale), -1,
// 1) + 1) * 0.5 * 65535 + 0.5)] in float; a block of scale 0 gets code 0. Writes `q`.
void quantize_piece(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& lut, const BlockPiece& p,
                    at::Tensor q) {
  const at::Tensor scale = scales.view({p.blocks, 1});
  // A block of zeros (scale 0) takes code 0 below; its 1 / 0 would make 0 x inf = NaN table indices.
  const at::Tensor inv = at::where(scale == 0, at::zeros_like(scale), scale.reciprocal());
  at::Tensor t = at::clamp(as_blocks(x, p) * inv, -1, 1);
  t = ((t + 1.0) * 0.5) * static_cast<double>(kBnbLutSize - 1) + 0.5;
  at::Tensor codes = table_on(lut, x.device()).index({t.to(at::kInt).to(at::kLong)});
  codes.masked_fill_((scale == 0).expand_as(codes), 0);
  q.copy_(codes.reshape({-1}));
}

// The codes whose dequantized values are `x` (a checkpoint's moments, code[q] x scale): per block
// the first q with code[q] x scale >= x (the products rise with q), which is that q; where two codes
// give the same product (a scale so small the products round together) either restores the same
// moment, all the next step reads. Writes `q`.
void restore_piece(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& code, const BlockPiece& p,
                   at::Tensor q) {
  const at::Tensor products = table_on(code, x.device()).view({1, -1}) * scales.view({p.blocks, 1});  // (blocks, 256)
  q.copy_(at::searchsorted(products, as_blocks(x, p).contiguous()).reshape({-1}).to(at::kByte));
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

// Codes for one piece of an 8-bit segment from its fp32 moments `m`, `v` (the piece's elements).
// given_scales: a restore, the state's scales are set and m, v are dequantized values, whose codes
// are recovered exactly; else each block's largest magnitude is its scale, and a cut block waits in
// `pending` for finish_cut_blocks.
void encode_piece(const OptimShard& s, const ParamSegment& seg, SegmentState& st, const BlockPiece& piece,
                  const at::Tensor& m, const at::Tensor& v, bool given_scales, int64_t slot_base,
                  std::vector<PendingCut>* pending) {
  const BnbMaps& maps = bnb_maps();
  const bool two = st.q2.defined();  // Lion: the first moment only
  at::Tensor a1 = st.absmax1.narrow(0, piece.block, piece.blocks), q1 = st.q1.narrow(0, piece.offset, piece.numel);
  at::Tensor a2 = two ? st.absmax2.narrow(0, piece.block, piece.blocks) : at::Tensor();
  at::Tensor q2 = two ? st.q2.narrow(0, piece.offset, piece.numel) : at::Tensor();
  if (given_scales) {
    restore_piece(m, a1, maps.code[0], piece, q1);
    if (two) restore_piece(v, a2, maps.code[1], piece, q2);
    return;
  }
  piece_absmax(m, piece, a1);
  if (two) piece_absmax(v, piece, a2);
  if (piece.cut) {
    PendingCut c;
    c.st = &st;
    c.piece = piece;
    for (int64_t slot : cut_slots(s, seg, piece)) c.slots.push_back(slot_base + slot);
    c.values[0] = m.clone();
    if (two) c.values[1] = v.clone();
    pending->push_back(std::move(c));
    return;
  }
  quantize_piece(m, a1, maps.lut[0], piece, q1);
  if (two) quantize_piece(v, a2, maps.lut[1], piece, q2);
}

// The cut blocks' scales: every rank's part maximum, all-reduced (MAX) over the shard group in one
// (2, slots) tensor, then each part quantized with the block's scale.
void finish_cut_blocks(std::vector<PendingCut>& pending, int64_t num_slots, const BlockMaxReducer& reducer) {
  at::Tensor maxima = at::zeros({2, num_slots}, at::TensorOptions().dtype(at::kFloat));
  float* mx = maxima.data_ptr<float>();
  std::vector<at::Tensor> parts;  // this rank's part maxima, read from the device at once
  for (const PendingCut& c : pending)
    for (int j = 0; j < 2; ++j)  // Lion's absent second moment: a part of 0
      parts.push_back(c.values[j].defined() ? (j == 0 ? c.st->absmax1 : c.st->absmax2)[c.piece.block]
                                            : at::zeros({}, c.st->absmax1.options()));
  const at::Tensor host = parts.empty() ? at::Tensor() : at::stack(parts).to(at::kCPU, at::kFloat).contiguous();
  for (size_t n = 0; n < pending.size(); ++n)
    for (int j = 0; j < 2; ++j) {
      const float partial = host.data_ptr<float>()[2 * n + static_cast<size_t>(j)];
      for (int64_t slot : pending[n].slots) mx[j * num_slots + slot] = std::max(mx[j * num_slots + slot], partial);
    }
  ALPACA_CHECK(reducer, "bitsandbytes AdamW: a block spans shards but no BlockMaxReducer was set");
  reducer(maxima);
  const BnbMaps& maps = bnb_maps();
  for (PendingCut& c : pending)
    for (int j = 0; j < 2; ++j) {
      if (!c.values[j].defined()) continue;
      at::Tensor scale = (j == 0 ? c.st->absmax1 : c.st->absmax2).narrow(0, c.piece.block, 1);
      scale.copy_(maxima[j].index({at::tensor(c.slots, at::kLong)}).max().reshape({1}));
      at::Tensor q = (j == 0 ? c.st->q1 : c.st->q2).narrow(0, c.piece.offset, c.piece.numel);
      quantize_piece(c.values[j], scale, maps.lut[j], c.piece, q);
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
      st.eight = eight_bits && keeps_8bit_moments(seg);
      const auto opts = s.param.options();
      const bool two = has_exp_avg_sq();
      if (st.eight) {
        st.q1 = at::zeros({seg.numel}, opts.dtype(at::kByte));
        st.absmax1 = at::zeros({blocks_touched(seg)}, opts);
        if (two) st.q2 = at::zeros({seg.numel}, opts.dtype(at::kByte));
        if (two) st.absmax2 = at::zeros({blocks_touched(seg)}, opts);
      } else if (eight_bits) {
        st.m = at::zeros({seg.numel}, opts);
        if (two) st.v = at::zeros({seg.numel}, opts);
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

int64_t ShardedAdamW::visit_segments(const std::function<void(size_t, size_t, int64_t)>& fn) const {
  int64_t num_slots = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const int64_t slot_base = num_slots;
    num_slots += shards_[i].shard_world - 1;
    for (size_t k = 0; k < shards_[i].segments.size(); ++k)
      if (shards_[i].segments[k].numel > 0) fn(i, k, slot_base);
  }
  return num_slots;
}

void ShardedAdamW::step_bnb(double lr) {
  const double b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
  const double step = static_cast<double>(step_count_);
  // Python: 1.0 - beta1**step, math.sqrt(1.0 - beta2**step).
  const double correction1 = 1.0 - std::pow(b1, step);
  const double correction2 = std::sqrt(1.0 - std::pow(b2, step));
  const BnbMaps& maps = bnb_maps();
  std::vector<PendingCut> pending;
  const int64_t num_slots = visit_segments([&](size_t i, size_t k, int64_t slot_base) {
    const OptimShard& s = shards_[i];
    const ParamSegment& seg = s.segments[k];
    SegmentState& st = seg_states_[i][k];
    at::Tensor p = s.param.narrow(0, seg.offset, seg.numel);
    const at::Tensor g = s.grad.narrow(0, seg.offset, seg.numel);
    const double wd = seg.decay ? options_.weight_decay : 0.0;
    const at::Tensor& gf = g;  // g.float() * gnorm_scale: fp32 already, the scale 1 (an exact product)
    if (!st.eight) {
      at::Tensor m = st.m.defined() ? st.m : exp_avg_[i].narrow(0, seg.offset, seg.numel);
      if (options_.lion) {  // _optimizer_update_32bit_cpu, "lion"
        if (wd > 0.0) p.mul_(1.0 - lr * wd);
        const at::Tensor update = m.mul(b1).add(gf, 1.0 - b1);
        p.add_(update.sign(), -lr);
        m.mul_(b2).add_(gf, 1.0 - b2);
        return;
      }
      // _optimizer_update_32bit_cpu, "adam" (max_unorm 0: update_scale 1).
      at::Tensor v = st.v.defined() ? st.v : exp_avg_sq_[i].narrow(0, seg.offset, seg.numel);
      m.mul_(b1).add_(gf, 1.0 - b1);
      v.mul_(b2).addcmul_(gf, gf, 1.0 - b2);
      const double step_size = -lr * correction2 / correction1;
      if (wd > 0.0) p.mul_(1.0 - lr * wd);
      const at::Tensor update = m / (v.sqrt() + eps * correction2);
      p.add_(update, step_size * 1.0);
      return;
    }
    // _optimizer_update_8bit_blockwise_cpu, "adam", a piece at a time (elementwise but for the
    // scales, which are per block).
    for (const BlockPiece& piece : block_pieces(seg)) {
      at::Tensor pp = p.narrow(0, piece.offset, piece.numel);
      const at::Tensor gp = gf.narrow(0, piece.offset, piece.numel);
      at::Tensor m = dequantize_piece(st.q1.narrow(0, piece.offset, piece.numel),
                                      st.absmax1.narrow(0, piece.block, piece.blocks), maps.code[0], piece);
      if (options_.lion) {  // _optimizer_update_8bit_blockwise_cpu, "lion"
        if (wd > 0.0) pp.mul_(1.0 - lr * wd);
        const at::Tensor update_dir = at::sign(m.mul(b1) + gp.mul(1.0 - b1));
        pp.add_(update_dir, -lr);
        m.mul_(b2).add_(gp, 1.0 - b2);
        encode_piece(s, seg, st, piece, m, at::Tensor(), /*given_scales=*/false, slot_base, &pending);
        continue;
      }
      at::Tensor v = dequantize_piece(st.q2.narrow(0, piece.offset, piece.numel),
                                      st.absmax2.narrow(0, piece.block, piece.blocks), maps.code[1], piece);
      m.mul_(b1).add_(gp, 1.0 - b1);
      v.mul_(b2).addcmul_(gp, gp, 1.0 - b2);
      const at::Tensor denom = (v.sqrt() / correction2).add_(eps);
      if (wd > 0.0) pp.mul_(1.0 - lr * wd);
      pp.addcdiv_(m, denom, -lr / correction1);
      encode_piece(s, seg, st, piece, m, v, /*given_scales=*/false, slot_base, &pending);
    }
  });
  // The updates write the parameters without moving their version counter (as the fused kernel).
  for (const OptimShard& s : shards_) s.param.unsafeGetTensorImpl()->bump_version();
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
    const bool two = has_exp_avg_sq();
    at::Tensor m = at::zeros_like(s.param), a1 = at::zeros_like(s.param);
    at::Tensor v = two ? at::zeros_like(s.param) : at::Tensor(), a2 = two ? at::zeros_like(s.param) : at::Tensor();
    for (size_t k = 0; k < s.segments.size(); ++k) {
      const ParamSegment& seg = s.segments[k];
      if (seg.numel == 0) continue;
      const SegmentState& st = seg_states_[i][k];
      at::Tensor ms = m.narrow(0, seg.offset, seg.numel);
      if (!st.eight) {
        ms.copy_(st.m);
        if (two) v.narrow(0, seg.offset, seg.numel).copy_(st.v);
        continue;
      }
      for (const BlockPiece& piece : block_pieces(seg)) {
        const at::Tensor s1 = st.absmax1.narrow(0, piece.block, piece.blocks);
        const at::Tensor s2 = two ? st.absmax2.narrow(0, piece.block, piece.blocks) : at::Tensor();
        ms.narrow(0, piece.offset, piece.numel)
            .copy_(dequantize_piece(st.q1.narrow(0, piece.offset, piece.numel), s1, maps.code[0], piece));
        // Each element's block scale.
        as_blocks(a1.narrow(0, seg.offset + piece.offset, piece.numel), piece).copy_(s1.view({piece.blocks, 1}));
        if (!two) continue;
        v.narrow(0, seg.offset + piece.offset, piece.numel)
            .copy_(dequantize_piece(st.q2.narrow(0, piece.offset, piece.numel), s2, maps.code[1], piece));
        as_blocks(a2.narrow(0, seg.offset + piece.offset, piece.numel), piece).copy_(s2.view({piece.blocks, 1}));
      }
    }
    exp_avg_.push_back(m);
    absmax_io_[0].push_back(a1);
    if (!two) continue;
    exp_avg_sq_.push_back(v);
    absmax_io_[1].push_back(a2);
  }
  io_open_ = true;
}

void ShardedAdamW::end_state_io(bool written, bool have_absmax) {
  if (!quantized()) return;
  ALPACA_CHECK(io_open_, "ShardedAdamW::end_state_io without begin_state_io");
  if (written) {
    std::vector<PendingCut> pending;
    const int64_t num_slots = visit_segments([&](size_t i, size_t k, int64_t slot_base) {
      const OptimShard& s = shards_[i];
      const ParamSegment& seg = s.segments[k];
      SegmentState& st = seg_states_[i][k];
      const bool two = has_exp_avg_sq();
      const at::Tensor m = exp_avg_[i].narrow(0, seg.offset, seg.numel);
      const at::Tensor v = two ? exp_avg_sq_[i].narrow(0, seg.offset, seg.numel) : at::Tensor();
      if (!st.eight) {
        st.m.copy_(m);
        if (two) st.v.copy_(v);
        return;
      }
      for (const BlockPiece& piece : block_pieces(seg)) {
        if (have_absmax)  // each block's scale from any of its elements (all equal): the first
          for (int j = 0; j < (two ? 2 : 1); ++j)
            (j == 0 ? st.absmax1 : st.absmax2)
                .narrow(0, piece.block, piece.blocks)
                .copy_(as_blocks(absmax_io_[j][i].narrow(0, seg.offset + piece.offset, piece.numel), piece).select(1, 0));
        encode_piece(s, seg, st, piece, m.narrow(0, piece.offset, piece.numel),
                     two ? v.narrow(0, piece.offset, piece.numel) : at::Tensor(), have_absmax, slot_base, &pending);
      }
    });
    if (!have_absmax && cuts_blocks()) finish_cut_blocks(pending, num_slots, reducer_);
  }
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (auto& a : absmax_io_) a.clear();
  io_open_ = false;
}

at::Tensor bnb_quantization_map(bool is_signed) { return bnb_maps().code[is_signed ? 0 : 1]; }

bool bnb_embedding_weight(const std::string& name, const std::vector<std::string>& aliases) {
  auto embedding = [](const std::string& n) { return n.ends_with("embed_tokens.weight"); };
  return embedding(name) || std::any_of(aliases.begin(), aliases.end(), embedding);
}

int64_t bnb8_segment_state_bytes(const ParamSegment& seg, int moments) {
  if (!keeps_8bit_moments(seg)) return 4 * moments * seg.numel;
  return moments * (seg.numel + 4 * blocks_touched(seg));
}

ShardedAdamW::QuantState ShardedAdamW::quant_state(size_t shard, size_t segment) const {
  const SegmentState& st = seg_states_.at(shard).at(segment);
  if (!st.eight) return {};
  return {st.q1, st.q2, st.absmax1, st.absmax2};
}

}  // namespace alpaca::optim
