#include "alpaca/ckpt/consolidate.h"

#include <set>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/ckpt/sharded_tensors.h"
#include "alpaca/ckpt/trainer_state.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/model/config.h"
#include "alpaca/util/error.h"

namespace fs = std::filesystem;

namespace alpaca::ckpt {

ConsolidateStats consolidate_checkpoint(const fs::path& dir, const fs::path& out_dir, int64_t max_shard_bytes) {
  const std::string why = checkpoint_problem(dir);
  ALPACA_CHECK(why.empty(), "consolidate: " << dir.string() << " is not a complete checkpoint: " << why);
  ALPACA_CHECK(fs::is_directory(dir / "sharded"), "consolidate: " << dir.string() << " has no sharded/ directory; it is a "
               "gathered checkpoint, which already is a Hugging Face directory");
  ALPACA_CHECK(fs::weakly_canonical(dir) != fs::weakly_canonical(out_dir), "consolidate: OUT must differ from CHECKPOINT");
  ALPACA_CHECK(!fs::exists(dir / "adapter_config.json"),
               "consolidate: " << dir.string() << " is a checkpoint of a LoRA run: its adapter_model.safetensors and "
               "adapter_config.json already are the peft adapter (load it with PeftModel.from_pretrained), and "
               "`alpaca-train merge` merges it into the base model");
  const auto cfg = model::LlamaConfig::from_json_file((dir / "config.json").string());
  const auto reader = ShardedTensorReader::open(dir / "sharded");
  fs::create_directories(out_dir);
  ConsolidateStats stats;
  io::HfExportWriter writer(out_dir.string(), max_shard_bytes, std::nullopt);
  for (const std::string& name : reader.names()) {
    const at::Tensor t = reader.read(name);
    stats.bytes += static_cast<int64_t>(t.nbytes());
    ++stats.num_tensors;
    writer.add(name, t);
  }
  writer.finish(cfg, io::generation_config_text(dir.string(), cfg));  // the run's, which the checkpoint carries
  // The tokenizer files: everything at the top level but our own bookkeeping and the weights.
  const std::set<std::string> ours = {kCompleteMarker, kResumeStateName, kTrainerStateName, "config.json",
                                      "generation_config.json"};
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || ours.count(name)) continue;
    fs::copy_file(e.path(), out_dir / name, fs::copy_options::overwrite_existing);
  }
  return stats;
}

}  // namespace alpaca::ckpt
