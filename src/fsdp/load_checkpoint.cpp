// HF checkpoint -> FSDP shards; see include/alpaca/fsdp/load_checkpoint.h.
#include "alpaca/fsdp/load_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "alpaca/dist/communicator.h"
#include "alpaca/model/quant4.h"
#include "alpaca/util/error.h"

namespace alpaca::fsdp {

namespace {

bool is_vocab_tensor(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with("embed_tokens.weight") || name == "lm_head.weight";
}

// bitsandbytes' pre-quantized 4-bit layout (Linear4bit._save_to_state_dict): beside the packed
// uint8 weight W, W.absmax, W.quant_map, (nested) W.nested_absmax, W.nested_quant_map, and
// W.quant_state.bitsandbytes__<type>, a uint8 tensor holding the state as JSON.
const char* const kQuantStateInfix = ".quant_state.bitsandbytes__";

std::string quant_state_key(const io::CheckpointReader& ckpt, const std::string& name) {
  for (const char* type : {"nf4", "fp4"})
    if (ckpt.contains(name + kQuantStateInfix + type)) return name + kQuantStateInfix + type;
  return {};
}

// A stored tensor of the 4-bit layout, checked for dtype and element count (zero-copy for safetensors).
at::Tensor stored(const io::CheckpointReader& ckpt, const std::string& weight, const std::string& key,
                  at::ScalarType dtype, int64_t numel) {
  ALPACA_CHECK(ckpt.contains(key), "checkpoint " << ckpt.dir() << ": the 4-bit weight " << weight << " has no " << key
                                                 << "; the bitsandbytes checkpoint is incomplete");
  const io::TensorInfo info = ckpt.info(key);
  ALPACA_CHECK(info.dtype == dtype && info.numel() == numel,
               "checkpoint " << ckpt.dir() << ": " << key << " is " << info.dtype << " " << at::IntArrayRef(info.shape)
               << " but the quant_state of " << weight << " needs " << numel << " " << dtype << " values; "
               "the checkpoint's quant_state disagrees with its tensors");
  return ckpt.read(key);
}

// `key` holds the same float32 values as `expected` (a code book), bit for bit.
void expect_code(const io::CheckpointReader& ckpt, const std::string& key, const float* expected, int64_t n) {
  const at::Tensor got = stored(ckpt, key.substr(0, key.rfind('.')), key, at::kFloat, n).contiguous();
  ALPACA_CHECK(std::memcmp(got.data_ptr(), expected, static_cast<size_t>(n) * sizeof(float)) == 0,
               "checkpoint " << ckpt.dir() << ": " << key << " is not bitsandbytes' code book; custom quantization "
               "maps are not supported");
}

nlohmann::json read_quant_state(const io::CheckpointReader& ckpt, const std::string& key) {
  const at::Tensor raw = ckpt.read(key).contiguous();
  const std::string text(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.nbytes()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ALPACA_CHECK(j.is_object() && j.contains("quant_type") && j.contains("blocksize") && j.contains("shape"),
               "checkpoint " << ckpt.dir() << ": " << key << " is not bitsandbytes' quant_state JSON");
  return j;
}

// The stored 4-bit tensor `name` (quant_state under `key`), checked against the model's `shape`.
model::Quant4Tensor read_bnb4bit(const io::CheckpointReader& ckpt, const std::string& name,
                                 const std::vector<int64_t>& shape, const std::string& key) {
  const nlohmann::json j = read_quant_state(ckpt, key);
  model::Quant4Tensor q;
  model::Quant4State& st = q.state;
  st.type = model::parse_quant4_type(j.at("quant_type").get<std::string>());
  st.blocksize = j.at("blocksize").get<int64_t>();
  st.shape = j.at("shape").get<std::vector<int64_t>>();
  ALPACA_CHECK(st.shape == shape, "checkpoint " << ckpt.dir() << ": the quant_state of " << name << " has shape "
               << at::IntArrayRef(st.shape) << " but the model's weight is " << at::IntArrayRef(shape)
               << "; the checkpoint does not match its config.json");
  ALPACA_CHECK(st.blocksize == model::kQuant4DefaultBlocksize,
               "checkpoint " << ckpt.dir() << ": " << name << " is quantized in blocks of " << st.blocksize
               << "; alpaca-train holds 4-bit bases in bitsandbytes' default blocks of " << model::kQuant4DefaultBlocksize);
  st.nested = j.contains("nested_offset");
  const int64_t blocks = st.num_blocks();
  q.packed = stored(ckpt, name, name, at::kByte, (st.numel() + 1) / 2);
  st.absmax = stored(ckpt, name, name + ".absmax", st.nested ? at::kByte : at::kFloat, blocks);
  expect_code(ckpt, name + ".quant_map", model::quant4_code(st.type).data(), 16);
  if (st.nested) {
    ALPACA_CHECK(j.value("nested_blocksize", int64_t{0}) == model::kQuant4NestedBlocksize,
                 "checkpoint " << ckpt.dir() << ": " << key << " has nested_blocksize " << j.value("nested_blocksize", int64_t{0})
                               << "; bitsandbytes' double quantization uses " << model::kQuant4NestedBlocksize);
    const int64_t nested_blocks = (blocks + model::kQuant4NestedBlocksize - 1) / model::kQuant4NestedBlocksize;
    st.nested_absmax = stored(ckpt, name, name + ".nested_absmax", at::kFloat, nested_blocks);
    st.offset = j.at("nested_offset").get<float>();
    expect_code(ckpt, name + ".nested_quant_map", model::dynamic_map_8bit().data(), 256);
  }
  return q;
}

// config.json's quantization_config when it is a bitsandbytes 4-bit one (null otherwise).
nlohmann::json bnb4bit_config(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  if (!in.good()) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantization_config") || !j["quantization_config"].is_object()) return nullptr;
  const nlohmann::json& q = j["quantization_config"];
  ALPACA_CHECK(!q.value("load_in_8bit", false), dir << " holds an 8-bit (LLM.int8) bitsandbytes checkpoint; "
               "alpaca-train trains on bf16/fp32 or 4-bit bases only");
  return q.value("load_in_4bit", false) ? q : nlohmann::json(nullptr);
}

// The run's --load_in_4bit settings must be the checkpoint's (nothing is re-quantized).
void check_bnb4bit_run(const nlohmann::json& q, const FsdpPolicy& policy, const std::string& dir) {
  const std::string type = q.value("bnb_4bit_quant_type", std::string("fp4"));  // BitsAndBytesConfig's default
  const bool nested = q.value("bnb_4bit_use_double_quant", false);
  const std::string flags = "--use_peft True --load_in_4bit True --bnb_4bit_quant_type " + type +
                            (nested ? " --use_bnb_nested_quant True" : "");
  ALPACA_CHECK(!policy.quant4_type.empty(), dir << " is a pre-quantized bitsandbytes 4-bit checkpoint "
               "(quantization_config in config.json): its base can only be trained through an adapter; add " << flags);
  ALPACA_CHECK(policy.quant4_type == type && policy.quant4_nested == nested,
               dir << " is quantized " << type << (nested ? " with" : " without") << " nested quantization, the run "
               << policy.quant4_type << (policy.quant4_nested ? " with" : " without") << "; use " << flags);
  const std::string storage = q.value("bnb_4bit_quant_storage", std::string("uint8"));
  ALPACA_CHECK(storage == "uint8", dir << " stores its 4-bit bytes as " << storage
               << " (bnb_4bit_quant_storage); alpaca-train reads uint8 storage only");
}

// A Quant4Reader over `ckpt`: each call releases the previous tensor's mapped pages.
Quant4Reader bnb4bit_reader(std::shared_ptr<io::CheckpointReader> ckpt) {
  auto last = std::make_shared<std::vector<std::string>>();
  return [ckpt, last](const std::string& name, const std::vector<int64_t>& shape, model::Quant4Tensor& out) {
    for (const auto& n : *last) ckpt->release(n);
    last->clear();
    const std::string key = quant_state_key(*ckpt, name);
    if (key.empty()) return false;
    out = read_bnb4bit(*ckpt, name, shape, key);
    *last = {name, name + ".absmax", name + ".nested_absmax"};
    if (!out.state.nested) last->pop_back();
    return true;
  };
}

}  // namespace

ParamRangeReader checkpoint_range_reader(std::shared_ptr<io::CheckpointReader> ckpt, bool grow_vocab) {
  auto means = std::make_shared<std::map<std::string, at::Tensor>>();  // (1, D) fp32 per grown tensor
  return [ckpt, grow_vocab, means](const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                                   int64_t end, at::Tensor out) {
    ALPACA_CHECK(ckpt->contains(name), "checkpoint " << ckpt->dir() << " has no tensor " << name
                 << "; is it a checkpoint of this model architecture?");
    ALPACA_CHECK(quant_state_key(*ckpt, name).empty(), "checkpoint " << ckpt->dir() << " stores " << name
                 << " 4-bit (bitsandbytes) but this run holds it in full precision; train such a checkpoint with "
                    "--use_peft True --load_in_4bit True");
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
  // A pre-quantized checkpoint: checked against the run on every rank before anything is read,
  // and opened on every rank (each copies its own shard's 4-bit bytes).
  const nlohmann::json bnb = bnb4bit_config(dir);
  if (!bnb.is_null()) check_bnb4bit_run(bnb, engine.policy(), dir);
  std::shared_ptr<io::CheckpointReader> ckpt;
  if (!rank0_only || engine.comm().rank() == 0 || !bnb.is_null())
    ckpt = std::make_shared<io::CheckpointReader>(io::CheckpointReader::open(dir));
  ParamRangeReader reader;
  if (ckpt && (!rank0_only || engine.comm().rank() == 0)) reader = checkpoint_range_reader(ckpt, grow_vocab);
  engine.load_parameters(reader, rank0_only, include, bnb.is_null() ? Quant4Reader() : bnb4bit_reader(ckpt));
}

}  // namespace alpaca::fsdp
