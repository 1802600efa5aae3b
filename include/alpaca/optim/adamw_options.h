// AdamW's hyperparameters, without the optimizer (adamw.h): train/options.h carries them, and what
// includes that (the CLI, its tests) must not compile ATen for four doubles.
#pragma once

namespace alpaca::optim {

struct AdamWOptions {
  double beta1 = 0.9;  // HF defaults (adam_beta1, adam_beta2, adam_epsilon)
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // bitsandbytes' AdamW, as transformers builds it for --optim adamw_bnb_8bit / adamw_8bit /
  // paged_adamw_8bit (8) and paged_adamw_32bit (32): its update formula, and at 8 bits its blockwise
  // quantized moments (adamw.h). 0: torch.optim.AdamW (adamw_torch, adamw_torch_fused).
  int bnb_bits = 0;
  // With bnb_bits: bitsandbytes' Lion instead of its AdamW (--optim lion_8bit / lion_32bit /
  // paged_lion_8bit / paged_lion_32bit): the sign of an interpolated momentum, one state (exp_avg),
  // betas (adam_beta1, adam_beta2) as transformers passes them; eps unused.
  bool lion = false;
  // transformers' Adafactor instead of AdamW (--optim adafactor), with the settings Trainer gives it:
  // scale_parameter and relative_step off (the learning rate is --learning_rate's schedule), no first
  // moment, eps (1e-30, 1e-3), clip_threshold 1, decay_rate -0.8; weight_decay applies (per group);
  // beta1 / beta2 / eps above are not used (transformers does not pass them). adafactor.cpp.
  bool adafactor = false;
};

}  // namespace alpaca::optim
