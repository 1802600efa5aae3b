// HF checkpoint -> FSDP shards; see include/alpaca/fsdp/load_checkpoint.h.
#include "alpaca/fsdp/load_checkpoint.h"

#include "alpaca/dist/communicator.h"
#include "alpaca/util/error.h"

namespace alpaca::fsdp {

ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt) {
  return [ckpt](const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end,
                at::Tensor out) {
    ALPACA_CHECK(ckpt->contains(name), "checkpoint " << ckpt->dir() << " has no tensor " << name
                 << "; is it a checkpoint of this model architecture?");
    const io::TensorInfo info = ckpt->info(name);
    ALPACA_CHECK(info.shape == shape, "tensor " << name << " in " << info.file << " has shape "
                 << at::IntArrayRef(info.shape) << " but the model expects " << at::IntArrayRef(shape)
                 << "; resize the model to the checkpoint before wrapping, or load before resizing");
    out.copy_(ckpt->read_range(name, begin, end - begin));
    ckpt->release(name);  // each rank reads each tensor's range once: drop the mapped pages now
  };
}

void load_checkpoint(FsdpEngine& engine, const std::string& dir, bool rank0_only) {
  std::shared_ptr<io::CheckpointReader> ckpt;
  if (!rank0_only || engine.comm().rank() == 0)
    ckpt = std::make_shared<io::CheckpointReader>(io::CheckpointReader::open(dir));
  ParamRangeReader reader;
  if (ckpt) reader = checkpoint_range_reader(ckpt);
  engine.load_parameters(reader, rank0_only);
}

}  // namespace alpaca::fsdp
