// bitsandbytes' 4-bit checkpoint layout; see include/alpaca/io/bnb4bit.h.
#include "alpaca/io/bnb4bit.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alpaca/util/error.h"

namespace alpaca::io {
namespace {

const char* const kQuantStateInfix = ".quant_state.bitsandbytes__";

// A stored tensor of the 4-bit layout, checked for dtype and element count (zero-copy for safetensors).
at::Tensor stored(const CheckpointReader& ckpt, const std::string& weight, const std::string& key,
                  at::ScalarType dtype, int64_t numel) {
  ALPACA_CHECK(ckpt.contains(key), "checkpoint " << ckpt.dir() << ": the 4-bit weight " << weight << " has no " << key
                                                 << "; the bitsandbytes checkpoint is incomplete");
  const TensorInfo info = ckpt.info(key);
  ALPACA_CHECK(info.dtype == dtype && info.numel() == numel,
               "checkpoint " << ckpt.dir() << ": " << key << " is " << info.dtype << " " << at::IntArrayRef(info.shape)
               << " but the quant_state of " << weight << " needs " << numel << " " << dtype << " values; "
               "the checkpoint's quant_state disagrees with its tensors");
  return ckpt.read(key);
}

// `key` holds the same float32 values as `expected` (a code book), bit for bit.
void expect_code(const CheckpointReader& ckpt, const std::string& key, const float* expected, int64_t n) {
  const at::Tensor got = stored(ckpt, key.substr(0, key.rfind('.')), key, at::kFloat, n).contiguous();
  ALPACA_CHECK(std::memcmp(got.data_ptr(), expected, static_cast<size_t>(n) * sizeof(float)) == 0,
               "checkpoint " << ckpt.dir() << ": " << key << " is not bitsandbytes' code book; custom quantization "
               "maps are not supported");
}

nlohmann::json read_quant_state(const CheckpointReader& ckpt, const std::string& key) {
  const at::Tensor raw = ckpt.read(key).contiguous();
  const std::string text(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.nbytes()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ALPACA_CHECK(j.is_object() && j.contains("quant_type") && j.contains("blocksize") && j.contains("shape"),
               "checkpoint " << ckpt.dir() << ": " << key << " is not bitsandbytes' quant_state JSON");
  return j;
}

}  // namespace

model::Quant4Tensor read_bnb4bit(const CheckpointReader& ckpt, const std::string& name,
                                 const std::vector<int64_t>& shape) {
  const std::string key = bnb4bit_state_key(ckpt, name);
  ALPACA_CHECK(!key.empty(), "checkpoint " << ckpt.dir() << " does not store " << name << " 4-bit (no quant_state)");
  const nlohmann::json j = read_quant_state(ckpt, key);
  model::Quant4Tensor q;
  model::Quant4State& st = q.state;
  const std::string type = j.at("quant_type").is_string() ? j.at("quant_type").get<std::string>() : j.at("quant_type").dump();
  ALPACA_CHECK(type == "nf4" || type == "fp4", "checkpoint " << ckpt.dir() << ": the quant_state of " << name
               << " has quant_type " << type << "; bitsandbytes' 4-bit types are nf4 and fp4");
  st.type = model::parse_quant4_type(type);
  st.blocksize = j.at("blocksize").get<int64_t>();
  st.shape = j.at("shape").get<std::vector<int64_t>>();
  ALPACA_CHECK(shape.empty() || st.shape == shape, "checkpoint " << ckpt.dir() << ": the quant_state of " << name << " has shape "
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

std::string bnb4bit_state_key(const CheckpointReader& ckpt, const std::string& name) {
  for (const char* type : {"nf4", "fp4"})
    if (ckpt.contains(name + kQuantStateInfix + type)) return name + kQuantStateInfix + type;
  return {};
}

at::ScalarType bnb4bit_dtype(const CheckpointReader& ckpt, const std::string& name) {
  const std::string key = bnb4bit_state_key(ckpt, name);
  ALPACA_CHECK(!key.empty(), "checkpoint " << ckpt.dir() << " does not store " << name << " 4-bit (no quant_state)");
  const std::string dtype = read_quant_state(ckpt, key).value("dtype", std::string("float32"));
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  ALPACA_CHECK(dtype == "float32", "checkpoint " << ckpt.dir() << ": " << key << " names dtype " << dtype
                                                 << "; a 4-bit weight dequantizes to float32, bfloat16 or float16");
  return at::kFloat;
}

bool is_bnb4bit_side_tensor(const std::string& name) {
  for (const char* suffix : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"})
    if (name.ends_with(suffix)) return true;
  return name.find(kQuantStateInfix) != std::string::npos;
}

std::optional<Bnb4bitConfig> read_bnb4bit_config(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  if (!in.good()) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantization_config") || !j["quantization_config"].is_object()) return std::nullopt;
  const nlohmann::json& q = j["quantization_config"];
  ALPACA_CHECK(!q.value("load_in_8bit", false), dir << " holds an 8-bit (LLM.int8) bitsandbytes checkpoint; "
               "alpaca-train reads bf16/fp32 or 4-bit bases only");
  if (!q.value("load_in_4bit", false)) return std::nullopt;
  Bnb4bitConfig c;
  c.quant_type = q.value("bnb_4bit_quant_type", std::string("fp4"));
  c.nested = q.value("bnb_4bit_use_double_quant", false);
  c.storage = q.value("bnb_4bit_quant_storage", std::string("uint8"));
  return c;
}

}  // namespace alpaca::io
