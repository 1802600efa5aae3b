#include "alpaca/ckpt/resume_state.h"

#include <ATen/ATen.h>                             // defines: at::Tensor, at::globalContext
#include <ATen/detail/CUDAHooksInterface.h>       // defines: at::detail::getCUDAHooks

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/util/error.h"

namespace alpaca::ckpt {
namespace {

std::string to_hex(const at::Tensor& bytes_u8) {
  const at::Tensor t = bytes_u8.contiguous().cpu();
  const auto* p = t.data_ptr<uint8_t>();
  static const char* kDigits = "0123456789abcdef";
  std::string out(static_cast<size_t>(t.numel()) * 2, '0');
  for (int64_t i = 0; i < t.numel(); ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

at::Tensor from_hex(const std::string& hex, const std::string& what) {
  ALPACA_CHECK(hex.size() % 2 == 0, what << " is not a hex string of even length");
  at::Tensor t = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    ALPACA_FAIL(what << " holds the non-hex character '" << c << "'");
  };
  for (size_t i = 0; i < hex.size() / 2; ++i) p[i] = static_cast<uint8_t>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return t;
}

int cuda_device_count() {
  return at::detail::getCUDAHooks().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
}

}  // namespace

std::string ResumeState::to_json() const {
  nlohmann::json j = {
      {"format_version", kResumeStateVersion},
      {"global_step", global_step},
      {"epoch", epoch},
      {"samples_in_epoch", samples_in_epoch},
      {"steps_in_epoch", steps_in_epoch},
      {"seed", seed},
      {"data_seed", data_seed},
      {"world_size", world_size},
      {"global_batch_size", global_batch_size},
      {"scheduler_step", scheduler_step},
      {"num_input_tokens_seen", num_input_tokens_seen},
      {"total_loss_sum", total_loss_sum},
      {"cpu_rng_state", cpu_rng_state},
      {"cuda_rng_states", cuda_rng_states},
      {"model", model},
      {"tokenizer", tokenizer},
  };
  if (loss_scaler) j["loss_scaler"] = {{"scale", loss_scaler->scale}, {"growth_tracker", loss_scaler->growth_tracker}};
  else j["loss_scaler"] = nullptr;
  return j.dump(2) + "\n";
}

ResumeState ResumeState::from_json(const std::string& text, const std::string& what) {
  ResumeState s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const int version = j.at("format_version").get<int>();
    ALPACA_CHECK(version == kResumeStateVersion, what << " has format_version " << version << "; this build reads version "
                                                      << kResumeStateVersion << ". Resume with the alpaca-train that wrote it");
    s.global_step = j.at("global_step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.samples_in_epoch = j.at("samples_in_epoch").get<int64_t>();
    s.steps_in_epoch = j.at("steps_in_epoch").get<int64_t>();
    s.seed = j.at("seed").get<int64_t>();
    s.data_seed = j.at("data_seed").get<int64_t>();
    s.world_size = j.at("world_size").get<int64_t>();
    s.global_batch_size = j.at("global_batch_size").get<int64_t>();
    s.scheduler_step = j.at("scheduler_step").get<int64_t>();
    s.num_input_tokens_seen = j.at("num_input_tokens_seen").get<int64_t>();
    s.total_loss_sum = j.at("total_loss_sum").get<double>();
    s.cpu_rng_state = j.at("cpu_rng_state").get<std::string>();
    s.cuda_rng_states = j.at("cuda_rng_states").get<std::vector<std::string>>();
    s.model = j.at("model").get<Fingerprint>();
    s.tokenizer = j.at("tokenizer").get<Fingerprint>();
    if (!j.at("loss_scaler").is_null())
      s.loss_scaler = LossScalerState{j["loss_scaler"].at("scale").get<double>(),
                                      j["loss_scaler"].at("growth_tracker").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    ALPACA_FAIL(what << " is not a valid resume state (" << e.what() << "); the checkpoint is corrupt, resume from an older one");
  }
  return s;
}

void ResumeState::save(const std::string& path) const { write_file_durable(path, to_json()); }

ResumeState ResumeState::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ALPACA_CHECK(f, "cannot open " << path << "; the checkpoint was not written by alpaca-train (or is incomplete)");
  return from_json(std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()), path);
}

std::string fingerprint_mismatch(const std::string& what, const Fingerprint& expected, const Fingerprint& actual) {
  std::ostringstream os;
  for (const auto& [k, v] : expected) {
    auto it = actual.find(k);
    const std::string here = it == actual.end() ? "(absent)" : it->second;
    if (here != v) os << (os.tellp() > 0 ? "; " : "") << k << " is " << v << " in the checkpoint, " << here << " here";
  }
  for (const auto& [k, v] : actual) {
    if (!expected.count(k)) os << (os.tellp() > 0 ? "; " : "") << k << " is (absent) in the checkpoint, " << v << " here";
  }
  if (os.tellp() == 0) return "";
  return "the checkpoint was written with a different " + what + ": " + os.str();
}

std::string capture_cpu_rng_state() { return to_hex(at::detail::getDefaultCPUGenerator().get_state()); }

void restore_cpu_rng_state(const std::string& hex) {
  if (hex.empty()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(from_hex(hex, "cpu_rng_state"));
}

std::vector<std::string> capture_cuda_rng_states() {
  std::vector<std::string> out;
  for (int d = 0; d < cuda_device_count(); ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    out.push_back(to_hex(gen.get_state()));
  }
  return out;
}

void restore_cuda_rng_states(const std::vector<std::string>& hex_states) {
  const int n = std::min<int>(cuda_device_count(), static_cast<int>(hex_states.size()));
  for (int d = 0; d < n; ++d) {
    at::Generator gen = at::globalContext().defaultGenerator(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d)));
    gen.set_state(from_hex(hex_states[d], "cuda_rng_states"));
  }
}

}  // namespace alpaca::ckpt
