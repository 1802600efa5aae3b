// CheckpointReader over the four HF weight layouts. safetensors files are mapped lazily (one
// mapping per shard, opened on first use); a .bin shard is unpickled whole by LibTorch's own
// loader (torch.save's zip format) and only the most recently used .bin shard is kept.
#include "alpaca/io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>                         // defines: nlohmann::json
#include <torch/csrc/jit/serialization/pickle.h>     // defines: torch::jit::pickle_load

#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"

namespace alpaca::io {
namespace fs = std::filesystem;
using nlohmann::json;

struct CheckpointReader::Impl {
  std::string dir, format;
  std::map<std::string, std::string> file_of;  // tensor name -> file path
  mutable std::mutex mu;
  mutable std::map<std::string, std::shared_ptr<SafetensorsFile>> st_files;
  mutable std::string bin_path;                        // the .bin shard currently held
  mutable std::map<std::string, at::Tensor> bin_tensors;

  std::shared_ptr<SafetensorsFile> st(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu);
    auto& f = st_files[path];
    if (!f) f = SafetensorsFile::open(path);
    return f;
  }

  const std::map<std::string, at::Tensor>& bin(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu);
    if (bin_path != path) {
      bin_tensors.clear();  // drop the previous shard first: never two shards resident
      bin_path.clear();
      std::ifstream in(path, std::ios::binary);
      ALPACA_CHECK(in.good(), path << ": cannot open the .bin checkpoint");
      std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      c10::IValue v;
      try {
        v = torch::jit::pickle_load(bytes);
      } catch (const c10::Error& e) {
        ALPACA_FAIL(path << ": LibTorch cannot read this .bin file (" << e.what_without_backtrace()
                         << "). Only torch.save's zip format (PyTorch >= 1.6) is supported; convert the checkpoint "
                            "to safetensors: load it with transformers' from_pretrained and save_pretrained it");
      }
      ALPACA_CHECK(v.isGenericDict(), path << ": a .bin checkpoint must hold a dict of tensors (a state dict)");
      for (const auto& kv : v.toGenericDict()) {
        ALPACA_CHECK(kv.key().isString() && kv.value().isTensor(),
                     path << ": a .bin checkpoint must map tensor names to tensors");
        bin_tensors[kv.key().toStringRef()] = kv.value().toTensor();
      }
      bin_path = path;
    }
    return bin_tensors;
  }

  std::string file(const std::string& name) const {
    auto it = file_of.find(name);
    ALPACA_CHECK(it != file_of.end(), dir << ": checkpoint has no tensor named \"" << name << "\"");
    return it->second;
  }

  at::Tensor bin_tensor(const std::string& name) const {
    const std::string path = file(name);
    const auto& m = bin(path);
    auto it = m.find(name);
    ALPACA_CHECK(it != m.end(), path << ": tensor \"" << name << "\" is listed in the index but not in the file");
    return it->second;
  }
};

namespace {

std::map<std::string, std::string> read_index(const fs::path& index_path) {
  std::ifstream in(index_path);
  ALPACA_CHECK(in.good(), index_path.string() << ": cannot open");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    ALPACA_FAIL(index_path.string() << ": not valid JSON (" << e.what() << ")");
  }
  ALPACA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               index_path.string() << ": field \"weight_map\" is missing or not an object");
  std::map<std::string, std::string> out;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    ALPACA_CHECK(it.value().is_string(), index_path.string() << ": weight_map entry \"" << it.key()
                                                             << "\" must name a file");
    const std::string file = it.value().get<std::string>();
    ALPACA_CHECK(file.find('/') == std::string::npos && file != "..",
                 index_path.string() << ": weight_map entry \"" << it.key() << "\" names a file outside the directory");
    out[it.key()] = (index_path.parent_path() / file).string();
  }
  return out;
}

}  // namespace

CheckpointReader CheckpointReader::open(const std::string& dir) {
  CheckpointReader r;
  r.impl_ = std::make_shared<Impl>();
  Impl& im = *r.impl_;
  im.dir = dir;
  const fs::path d(dir);
  ALPACA_CHECK(fs::is_directory(d), dir << ": checkpoint directory does not exist");
  if (fs::exists(d / "model.safetensors")) {
    im.format = "safetensors";
    auto f = im.st((d / "model.safetensors").string());
    for (const auto& n : f->names()) im.file_of[n] = f->path();
  } else if (fs::exists(d / "model.safetensors.index.json")) {
    im.format = "safetensors-sharded";
    im.file_of = read_index(d / "model.safetensors.index.json");
    std::map<std::string, bool> checked;
    for (const auto& [name, path] : im.file_of) {
      ALPACA_CHECK(fs::exists(path), (d / "model.safetensors.index.json").string()
                                         << ": tensor \"" << name << "\" is in " << path << ", which is missing");
      // Open every shard now so header errors surface at open, not mid-load.
      ALPACA_CHECK(im.st(path)->contains(name), path << ": tensor \"" << name
                                                     << "\" is listed in the index but not in the file");
    }
  } else if (fs::exists(d / "pytorch_model.bin")) {
    im.format = "bin";
    const std::string path = (d / "pytorch_model.bin").string();
    for (const auto& [n, t] : im.bin(path)) im.file_of[n] = path;
  } else if (fs::exists(d / "pytorch_model.bin.index.json")) {
    im.format = "bin-sharded";
    im.file_of = read_index(d / "pytorch_model.bin.index.json");
  } else {
    // A training checkpoint of ours keeps each rank's ranges under sharded/ (torch DCP's HF layout),
    // sealed by checkpoint_complete.json (ckpt/checkpoint_dir.h).
    ALPACA_USER_CHECK(!(fs::is_directory(d / "sharded") && fs::exists(d / "checkpoint_complete.json")),
                      dir << " is an alpaca-train training checkpoint (its weights are split by rank under sharded/); "
                             "write it as a model directory with `alpaca-train consolidate " << dir
                          << " OUT` and pass OUT");
    ALPACA_USER_FAIL(dir << ": no weights found (expected model.safetensors, model.safetensors.index.json, "
                       "pytorch_model.bin or pytorch_model.bin.index.json)");
  }
  return r;
}

const std::string& CheckpointReader::dir() const { return impl_->dir; }
const std::string& CheckpointReader::format() const { return impl_->format; }

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : impl_->file_of) out.push_back(n);
  return out;
}

bool CheckpointReader::contains(const std::string& name) const { return impl_->file_of.count(name) != 0; }

TensorInfo CheckpointReader::info(const std::string& name) const {
  const std::string path = impl_->file(name);
  if (impl_->format.starts_with("safetensors")) return impl_->st(path)->info(name);
  at::Tensor t = impl_->bin_tensor(name);
  TensorInfo ti;
  ti.name = name;
  ti.file = path;
  ti.dtype = t.scalar_type();
  ti.shape = t.sizes().vec();
  ti.data_end = static_cast<int64_t>(t.nbytes());
  return ti;
}

at::Tensor CheckpointReader::read(const std::string& name, std::optional<at::ScalarType> dtype) const {
  const std::string path = impl_->file(name);
  at::Tensor t = impl_->format.starts_with("safetensors") ? impl_->st(path)->tensor(name) : impl_->bin_tensor(name);
  if (dtype && *dtype != t.scalar_type()) return t.to(*dtype);
  return t;
}

at::Tensor CheckpointReader::read_range(const std::string& name, int64_t elem_begin, int64_t elem_count) const {
  const std::string path = impl_->file(name);
  if (impl_->format.starts_with("safetensors")) return impl_->st(path)->tensor_range(name, elem_begin, elem_count);
  at::Tensor t = impl_->bin_tensor(name).reshape({-1});
  ALPACA_CHECK(elem_begin >= 0 && elem_count >= 0 && elem_begin + elem_count <= t.numel(),
               path << ": tensor \"" << name << "\": element range out of bounds");
  return t.narrow(0, elem_begin, elem_count);
}

void CheckpointReader::release(const std::string& name) const {
  if (impl_->format.starts_with("safetensors")) impl_->st(impl_->file(name))->release(name);
}

}  // namespace alpaca::io
