// HF checkpoint -> FSDP shards; see include/alpaca/fsdp/load_checkpoint.h.
#include "alpaca/fsdp/load_checkpoint.h"

#include <map>

#include "alpaca/dist/communicator.h"
#include "alpaca/util/error.h"

namespace alpaca::fsdp {

namespace {

bool is_vocab_tensor(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("embed_tokens.weight") || name == "lm_head.weight";
}

}  // namespace

ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt, bool grow_vocab) {
  auto means = std::make_shared<std::map<std::string, at::Tensor>>();  // (1, D) fp32 per grown tensor
  return [ckpt, grow_vocab, means](const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                                   int64_t end, at::Tensor out) {
    ALPACA_CHECK(ckpt->contains(name), "checkpoint " << ckpt->dir() << " has no tensor " << name
                 << "; is it a checkpoint of this model architecture?");
    const io::TensorInfo info = ckpt->info(name);
    const bool grows = grow_vocab && is_vocab_tensor(name) && shape.size() == 2 && info.shape.size() == 2 &&
                       info.shape[1] == shape[1] && info.shape[0] < shape[0];
    ALPACA_CHECK(info.shape == shape || grows, "tensor " << name << " in " << info.file << " has shape "
                 << at::IntArrayRef(info.shape) << " but the model expects " << at::IntArrayRef(shape)
                 << "; build the model with the checkpoint's shapes (vocabulary growth is only done for "
                    "embed_tokens/lm_head with grow_vocab)");
    if (!grows) {
      out.copy_(ckpt->read_range(name, begin, end - begin));
      ckpt->release(name);  // each rank reads each tensor's range once: drop the mapped pages now
      return;
    }
    const int64_t stored = info.shape[0] * info.shape[1];
    const int64_t stored_end = std::min(end, stored);
    if (begin < stored_end) out.narrow(0, 0, stored_end - begin).copy_(ckpt->read_range(name, begin, stored_end - begin));
    if (end > stored) {
      auto it = means->find(name);
      if (it == means->end()) it = means->emplace(name, ckpt->read(name, at::kFloat).mean(0, true)).first;
      const int64_t from = std::max(begin, stored);
      const int64_t d = shape[1];
      // Element i of the flattened (V, D) tensor is column i % D of its row.
      at::Tensor cols = at::arange(from, end, at::kLong).remainder(d);
      out.narrow(0, from - begin, end - from).copy_(it->second.reshape({-1}).index_select(0, cols));
    }
    ckpt->release(name);
  };
}

void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only, bool grow_vocab,
                     const std::function<bool(const std::string&)>& include) {
  std::shared_ptr<io::CheckpointReader> ckpt;
  if (!rank0_only || engine.comm().rank() == 0)
    ckpt = std::make_shared<io::CheckpointReader>(io::CheckpointReader::open(dir));
  ParamRangeReader reader;
  if (ckpt) reader = checkpoint_range_reader(ckpt, grow_vocab);
  engine.load_parameters(reader, rank0_only, include);
}

}  // namespace alpaca::fsdp
