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
};

}  // namespace alpaca::optim
