// transformers' Adafactor inside ShardedAdamW (include/alpaca/optim/adamw.h), as Trainer builds it
// for --optim adafactor (trainer_optimizer.py _get_adafactor: scale_parameter=False,
// relative_step=False, so the learning rate is the schedule's; the class defaults eps=(1e-30, 1e-3),
// clip_threshold=1.0, decay_rate=-0.8, beta1=None: no first moment). Per parameter and step t:
//
//   beta2t = 1 - t^-0.8;  u = grad^2 + 1e-30
//   matrix (R, C): row = beta2t row + (1 - beta2t) mean_cols(u);  col = beta2t col + (1 - beta2t) mean_rows(u)
//                  update = rsqrt(row / mean(row))[:, None] * rsqrt(col)[None, :] * grad
//   vector:        v = beta2t v + (1 - beta2t) u;  update = rsqrt(v) * grad
//   update /= max(rms(update) / 1, 1);  update *= lr;  p -= wd lr p;  p -= update
//
// written with the same ATen operations in the same order as optimization.py (the means as sum /
// count, which is how CPU torch computes them), so a parameter held whole by one rank gets
// transformers' values; parts of a parameter on several ranks add their partial sums in an
// all-reduce, which rounds differently (tests state the tolerance). The statistics of every parameter
// of this rank's flat buffers live in one fp32 vector that every rank of the shard group keeps whole
// (rows + columns of a matrix, every element of a vector: 0.1% of the model for LLaMA shapes). A step
// all-reduces (SUM) two small vectors: the statistics' partial sums, then each parameter's partial
// sum of squared updates (the clipping RMS is over the whole parameter).
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "alpaca/optim/adamw.h"
#include "alpaca/util/error.h"

namespace alpaca::optim {
namespace {

constexpr double kEps1 = 1e-30;       // Adafactor's eps[0], added to grad^2
constexpr double kClipThreshold = 1.0;
constexpr double kDecayRate = -0.8;
constexpr int64_t kChunk = int64_t{1} << 22;  // elements per pass over a matrix part (temporaries)

// A part of a matrix (cols columns) held by a segment, cut into pieces of whole rows or one partial
// row: `rows` rows of `width` elements from column `col` of row `row` (width == cols when rows > 1).
struct RowPiece {
  int64_t offset = 0;  // in the segment
  int64_t row = 0, col = 0, rows = 1, width = 0;
};

std::vector<RowPiece> row_pieces(int64_t begin, int64_t numel, int64_t cols) {
  std::vector<RowPiece> out;
  int64_t o = 0;
  while (o < numel) {
    const int64_t pos = begin + o, r = pos / cols, c = pos % cols;
    if (c != 0 || numel - o < cols) {
      const int64_t w = std::min(numel - o, cols - c);
      out.push_back({o, r, c, 1, w});
      o += w;
    } else {
      const int64_t k = std::min((numel - o) / cols, std::max<int64_t>(1, kChunk / cols));
      out.push_back({o, r, 0, k, cols});
      o += k * cols;
    }
  }
  return out;
}

}  // namespace

void ShardedAdamW::init_adafactor() {
  int64_t total = 0;
  factor_params_.assign(shards_.size(), {});
  std::vector<float> divisor;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const OptimShard& s = shards_[i];
    for (const ParamSegment& seg : s.segments)
      ALPACA_CHECK(seg.numel == 0 || (seg.param_index >= 0 && seg.param_index < static_cast<int64_t>(s.params.size()) &&
                                      seg.param_begin + seg.numel <= seg.param_numel),
                   "Adafactor: shard " << i << " has a segment without its parameter (per-parameter shards needed)");
    for (const ShardParam& p : s.params) {
      ALPACA_CHECK(!p.shape.empty() && p.shape.size() <= 2,
                   "Adafactor: " << p.name << " has " << p.shape.size()
                                 << " dimensions; LLaMA-family parameters are vectors or matrices");
      FactorParam f;
      f.offset = total;
      f.factored = p.shape.size() == 2;  // Adafactor._get_options: len(shape) >= 2
      f.rows = f.factored ? p.shape[0] : 1;
      f.cols = p.shape.back();
      if (f.factored) {  // row means divide by the columns, column means by the rows
        divisor.insert(divisor.end(), f.rows, static_cast<float>(f.cols));
        divisor.insert(divisor.end(), f.cols, static_cast<float>(f.rows));
        total += f.rows + f.cols;
      } else {
        divisor.insert(divisor.end(), f.cols, 1.0f);
        total += f.cols;
      }
      factor_params_[i].push_back(f);
    }
  }
  const auto opts = shards_.empty() ? at::TensorOptions().dtype(at::kFloat) : shards_.front().param.options();
  factor_state_ = at::zeros({total}, opts);
  factor_divisor_ = at::tensor(divisor, at::TensorOptions().dtype(at::kFloat)).to(opts.device());
}

void ShardedAdamW::step_adafactor(double lr) {
  const double step = static_cast<double>(step_count_);
  const double beta2t = 1.0 - std::pow(step, kDecayRate);
  const bool collective = std::any_of(shards_.begin(), shards_.end(), [](const OptimShard& s) { return s.shard_world > 1; });
  ALPACA_CHECK(!collective || sum_reducer_, "Adafactor: shards of several ranks need a sum reducer");

  // fn(shard index, segment, its parameter's statistics) for every non-empty segment (the walk the
  // bitsandbytes states use, visit_segments).
  auto each_segment = [&](const std::function<void(size_t, const ParamSegment&, const FactorParam&)>& fn) {
    visit_segments([&](size_t i, size_t k, int64_t) {
      const ParamSegment& seg = shards_[i].segments[k];
      fn(i, seg, factor_params_[i][static_cast<size_t>(seg.param_index)]);
    });
  };
  // fn(piece, its gradient as (rows, width), its parameter values as (rows, width)) for one segment.
  auto each_piece = [&](size_t i, const ParamSegment& seg, const FactorParam& f,
                        const std::function<void(const RowPiece&, const at::Tensor&, const at::Tensor&)>& fn) {
    const OptimShard& s = shards_[i];
    const at::Tensor g = s.grad.narrow(0, seg.offset, seg.numel), p = s.param.narrow(0, seg.offset, seg.numel);
    if (!f.factored) {
      fn({0, 0, seg.param_begin, 1, seg.numel}, g.view({1, seg.numel}), p.view({1, seg.numel}));
      return;
    }
    for (const RowPiece& rp : row_pieces(seg.param_begin, seg.numel, f.cols))
      fn(rp, g.narrow(0, rp.offset, rp.rows * rp.width).view({rp.rows, rp.width}),
         p.narrow(0, rp.offset, rp.rows * rp.width).view({rp.rows, rp.width}));
  };

  // 1. This rank's sums of grad^2 + eps per row and column (a vector: its elements), all-reduced.
  at::Tensor sums = at::zeros_like(factor_state_);
  each_segment([&](size_t i, const ParamSegment& seg, const FactorParam& f) {
    each_piece(i, seg, f, [&](const RowPiece& rp, const at::Tensor& g, const at::Tensor&) {
      const at::Tensor u = g.pow(2).add_(kEps1);
      if (!f.factored) {
        sums.narrow(0, f.offset + rp.col, rp.width).add_(u.view({-1}));
        return;
      }
      sums.narrow(0, f.offset + rp.row, rp.rows).add_(u.sum(1));
      sums.narrow(0, f.offset + f.rows + rp.col, rp.width).add_(u.sum(0));
    });
  });
  if (collective) sum_reducer_(sums);
  factor_state_.mul_(beta2t).add_(sums.div_(factor_divisor_), 1.0 - beta2t);

  // 2. The factors of every parameter this rank updates: rsqrt(row / mean(row)) and rsqrt(col), or
  // rsqrt(v) of a vector. [shard][param]
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> factors(shards_.size());
  for (size_t i = 0; i < shards_.size(); ++i) factors[i].resize(factor_params_[i].size());
  each_segment([&](size_t i, const ParamSegment& seg, const FactorParam& f) {
    auto& out = factors[i][static_cast<size_t>(seg.param_index)];
    if (!f.factored) {
      out.first = factor_state_.narrow(0, f.offset, f.cols).rsqrt().view({1, f.cols});
      return;
    }
    const at::Tensor row = factor_state_.narrow(0, f.offset, f.rows);
    const at::Tensor col = factor_state_.narrow(0, f.offset + f.rows, f.cols);
    out.first = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);  // (R, 1)
    out.second = col.unsqueeze(-2).rsqrt();                                      // (1, C)
  });
  // The update of one piece: r_factor x c_factor x grad (a vector: rsqrt(v) x grad).
  auto update_of = [&](size_t i, const ParamSegment& seg, const FactorParam& f, const RowPiece& rp, const at::Tensor& g) {
    const auto& [rf, cf] = factors[i][static_cast<size_t>(seg.param_index)];
    if (!f.factored) return rf.narrow(1, rp.col, rp.width).mul(g);
    return at::mul(rf.narrow(0, rp.row, rp.rows), cf.narrow(1, rp.col, rp.width)).mul_(g);
  };

  // 3. Each parameter's sum of squared updates (the clipping RMS), all-reduced.
  int64_t num_params = 0;
  std::vector<int64_t> param_base;
  for (const auto& fp : factor_params_) {
    param_base.push_back(num_params);
    num_params += static_cast<int64_t>(fp.size());
  }
  at::Tensor sumsq = at::zeros({num_params}, factor_state_.options());
  each_segment([&](size_t i, const ParamSegment& seg, const FactorParam& f) {
    at::Tensor slot = sumsq.narrow(0, param_base[i] + seg.param_index, 1);
    each_piece(i, seg, f, [&](const RowPiece& rp, const at::Tensor& g, const at::Tensor&) {
      const at::Tensor u = update_of(i, seg, f, rp, g);
      slot.add_(u.mul(u).sum().view({1}));
    });
  });
  if (collective) sum_reducer_(sumsq);
  const at::Tensor host_sumsq = sumsq.to(at::kCPU).contiguous();

  // 4. The update, clipped by the parameter's RMS (as fp32 tensors compute it: norm / sqrt(numel) /
  // clip_threshold, at least 1), times lr; weight decay; the step (written through views of the shard).
  each_segment([&](size_t i, const ParamSegment& seg, const FactorParam& f) {
    const float norm = std::sqrt(host_sumsq.data_ptr<float>()[param_base[i] + seg.param_index]);
    const float rms = norm / static_cast<float>(std::sqrt(static_cast<double>(seg.param_numel)));
    const float clip = std::max(rms / static_cast<float>(kClipThreshold), 1.0f);
    const double wd = seg.decay ? options_.weight_decay : 0.0;
    each_piece(i, seg, f, [&](const RowPiece& rp, const at::Tensor& g, const at::Tensor& p) {
      at::Tensor u = update_of(i, seg, f, rp, g);
      u.div_(static_cast<double>(clip)).mul_(lr);
      if (wd != 0.0) p.add_(p, -wd * lr);
      p.add_(u.neg_());
    });
  });
  // Written through views: the shard's version counter has to move for the offload staging's cache.
  for (const OptimShard& s : shards_) s.param.unsafeGetTensorImpl()->bump_version();
}

std::vector<ShardedAdamW::NamedState> ShardedAdamW::adafactor_state() const {
  ALPACA_CHECK(options_.adafactor, "ShardedAdamW::adafactor_state: the optimizer is AdamW");
  std::vector<NamedState> out;
  for (size_t i = 0; i < shards_.size(); ++i)
    for (size_t j = 0; j < shards_[i].params.size(); ++j) {
      const ShardParam& p = shards_[i].params[j];
      const FactorParam& f = factor_params_[i][j];
      if (!f.factored) {
        out.push_back({p.name, "exp_avg_sq", factor_state_.narrow(0, f.offset, f.cols).view(p.shape)});
        continue;
      }
      out.push_back({p.name, "exp_avg_sq_row", factor_state_.narrow(0, f.offset, f.rows)});
      out.push_back({p.name, "exp_avg_sq_col", factor_state_.narrow(0, f.offset + f.rows, f.cols)});
    }
  return out;
}

}  // namespace alpaca::optim
