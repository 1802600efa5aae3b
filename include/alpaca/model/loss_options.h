// What each labelled token contributes to the causal-LM loss beyond plain cross-entropy (label
// smoothing, TRL's DFT). Light (no LibTorch): train/options.h includes it.
#pragma once

namespace alpaca::model {

struct LossOptions {
  // HF label_smoothing_factor e (transformers' LabelSmoother): (1 - e) * nll + e * mean_v(-log p_v).
  double label_smoothing = 0.0;
  // TRL loss_type "dft" (Dynamic Fine-Tuning): nll * p, p = exp(-nll) the token's probability,
  // held constant to autograd.
  bool dft = false;
  // Not a loss term: also measure each call's label tokens' entropy and top-1 hits (LossSum::token_stats),
  // what TRL's SFTTrainer logs as entropy and mean_token_accuracy.
  bool token_stats = false;
  bool plain() const { return label_smoothing == 0.0 && !dft; }
};

}  // namespace alpaca::model
