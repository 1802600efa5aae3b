// HF checkpoint -> FSDP shards; see include/alpaca/fsdp/load_checkpoint.h.
#include "alpaca/fsdp/load_checkpoint.h"

#include <map>

#include "alpaca/dist/communicator.h"
#include "alpaca/io/bnb4bit.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::fsdp {

namespace {

bool is_vocab_tensor(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("embed_tokens.weight") || name == "lm_head.weight";
}

// The run's --load_in_4bit settings must be the checkpoint's (nothing is re-quantized).
void check_bnb4bit_run(const io::Bnb4bitConfig& q, const FsdpPolicy& policy, const std::string& dir) {
  const std::string& type = q.quant_type;
  const bool nested = q.nested;
  const std::string flags = "--use_peft True --load_in_4bit True --bnb_4bit_quant_type " + type +
                            (nested ? " --use_bnb_nested_quant True" : "");
  ALPACA_CHECK(!policy.quant4_type.empty(), dir << " is a pre-quantized bitsandbytes 4-bit checkpoint "
               "(quantization_config in config.json): its base can only be trained through an adapter; add " << flags);
  ALPACA_CHECK(policy.quant4_type == type && policy.quant4_nested == nested,
               dir << " is quantized " << type << (nested ? " with" : " without") << " nested quantization, the run "
               << policy.quant4_type << (policy.quant4_nested ? " with" : " without") << "; use " << flags);
  ALPACA_CHECK(q.storage == "uint8", dir << " stores its 4-bit bytes as " << q.storage
               << " (bnb_4bit_quant_storage); alpaca-train reads uint8 storage only");
}

// A Quant4Reader over `ckpt`: each call releases the previous tensor's mapped pages.
Quant4Reader bnb4bit_reader(std::shared_ptr<io::CheckpointReader> ckpt) {
  auto last = std::make_shared<std::vector<std::string>>();
  return [ckpt, last](const std::string& name, const std::vector<int64_t>& shape, model::Quant4Tensor& out) {
    for (const auto& n : *last) ckpt->release(n);
    last->clear();
    if (io::bnb4bit_state_key(*ckpt, name).empty()) return false;
    out = io::read_bnb4bit(*ckpt, name, shape);
    *last = {name, name + ".absmax", name + ".nested_absmax"};
    if (!out.state.nested) last->pop_back();
    return true;
  };
}

}  // namespace

ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt, int64_t vocab_mean_from) {
  auto means = std::make_shared<std::map<std::string, at::Tensor>>();  // (1, D) fp32 per filled tensor
  return [ckpt, vocab_mean_from, means](const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                                        int64_t end, at::Tensor out) {
    ALPACA_USER_CHECK(ckpt->contains(name), "checkpoint " << ckpt->dir() << " has no tensor " << name
                 << "; is it a checkpoint of this model architecture?");
    ALPACA_CHECK(io::bnb4bit_state_key(*ckpt, name).empty(), "checkpoint " << ckpt->dir() << " stores " << name
                 << " 4-bit (bitsandbytes) but this run holds it in full precision; train such a checkpoint with "
                    "--use_peft True --load_in_4bit True");
    const io::TensorInfo info = ckpt->info(name);
    // Rows vocab_mean_from.. of a vocabulary tensor as large as the model's, or grown to it, are the mean.
    const bool fills = vocab_mean_from >= 0 && is_vocab_tensor(name) && shape.size() == 2 && info.shape.size() == 2 &&
                       info.shape[1] == shape[1] && info.shape[0] <= shape[0] && vocab_mean_from < shape[0] &&
                       vocab_mean_from <= info.shape[0] && vocab_mean_from > 0;
    ALPACA_CHECK(info.shape == shape || fills, "tensor " << name << " in " << info.file << " has shape "
                 << at::IntArrayRef(info.shape) << " but the model expects " << at::IntArrayRef(shape)
                 << "; build the model with the checkpoint's shapes (vocabulary growth is only done for "
                    "embed_tokens/lm_head, with vocab_mean_from)");
    if (!fills) {
      out.copy_(ckpt->read_range(name, begin, end - begin));
      ckpt->release(name);  // each rank reads each tensor's range once: drop the mapped pages now
      return;
    }
    const int64_t d = shape[1];
    const int64_t kept = vocab_mean_from * d;  // elements read as stored
    const int64_t kept_end = std::min(end, kept);
    if (begin < kept_end) out.narrow(0, 0, kept_end - begin).copy_(ckpt->read_range(name, begin, kept_end - begin));
    if (end > kept) {
      auto it = means->find(name);
      if (it == means->end())
        it = means->emplace(name, ckpt->read(name, at::kFloat).narrow(0, 0, vocab_mean_from).mean(0, true)).first;
      const int64_t from = std::max(begin, kept);
      // Element i of the flattened (V, D) tensor is column i % D of its row.
      at::Tensor cols = at::arange(from, end, at::kLong).remainder(d);
      out.narrow(0, from - begin, end - from).copy_(it->second.reshape({-1}).index_select(0, cols));
    }
    ckpt->release(name);
  };
}

void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only, int64_t vocab_mean_from,
                     const std::function<bool(const std::string&)>& include) {
  // A pre-quantized checkpoint: checked against the run on every rank before anything is read,
  // and opened on every rank (each copies its own shard's 4-bit bytes).
  const std::optional<io::Bnb4bitConfig> bnb = io::read_bnb4bit_config(dir);
  if (bnb) check_bnb4bit_run(*bnb, engine.policy(), dir);
  std::shared_ptr<io::CheckpointReader> ckpt;
  if (!rank0_only || engine.comm().rank() == 0 || bnb)
    ckpt = std::make_shared<io::CheckpointReader>(io::CheckpointReader::open(dir));
  ParamRangeReader reader;
  if (ckpt && (!rank0_only || engine.comm().rank() == 0)) reader = checkpoint_range_reader(ckpt, vocab_mean_from);
  engine.load_parameters(reader, rank0_only, include, bnb ? bnb4bit_reader(ckpt) : Quant4Reader());
}

}  // namespace alpaca::fsdp
