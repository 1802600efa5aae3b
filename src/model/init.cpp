// Random initialisation as transformers' LlamaPreTrainedModel._init_weights.
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include "alpaca/model/llama.h"

namespace alpaca::model {

void init_weights(LlamaForCausalLM& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  const LlamaConfig& cfg = m->config();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std = cfg.initializer_range;
  // Draw on the CPU in fp32 in a fixed order so the result does not depend on device or dtype.
  for (auto& item : m->named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    at::Tensor values;
    if (name.size() >= 12 && name.ends_with("norm.weight")) {
      values = at::ones(p.sizes(), at::kFloat);
    } else if (name.ends_with(".bias")) {
      values = at::zeros(p.sizes(), at::kFloat);
    } else {
      values = at::empty(p.sizes(), at::kFloat);
      values.normal_(0.0, std, gen);
      if (name == "model.embed_tokens.weight" && cfg.pad_token_id && *cfg.pad_token_id < cfg.vocab_size)
        values[*cfg.pad_token_id].zero_();
    }
    p.copy_(values);
  }
}

}  // namespace alpaca::model
