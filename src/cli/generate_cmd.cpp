// `alpaca-train generate`: answer one instruction (streamed to stdout) or a file of Alpaca
// records (JSON Lines out) with a model directory, as transformers' generate() would. Flags keep
// transformers' GenerationConfig names; unset decoding flags come from the model's
// generation_config.json, then from transformers' defaults. The work is in src/generate/.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include <ATen/CPUGeneratorImpl.h>  // defines: at::CPUGeneratorImpl
#include <CLI/CLI.hpp>  // defines: CLI::App

#include "alpaca/ckpt/lora_adapter.h"
#include "alpaca/cli/commands.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/tokenizer.h"
#include "alpaca/generate/generation_config.h"
#include "alpaca/generate/generator.h"
#include "alpaca/generate/prompt_records.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"

namespace fs = std::filesystem;

namespace alpaca::cli {
namespace {

struct GenerateFlags {
  std::string model_dir, adapter, instruction, input, prompts, output, expected_field, device = "auto";
  std::string padding_side = "left";
  bool raw_prompt = false, bf16 = false, do_sample = false;
  int64_t max_new_tokens = 0, top_k = 50, batch_size = 1;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  uint64_t seed = 42;
};

// HF-style booleans: `--bf16`, `--bf16 True`, `--bf16=false` all work (CLI11 flags only take the
// `=value` form, so a following True/False word is folded into it).
std::vector<std::string> fold_bool_values(const std::vector<std::string>& args, const std::set<std::string>& flags) {
  static const std::set<std::string> words = {"true", "false", "1", "0", "yes", "no"};
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (flags.count(args[i]) && i + 1 < args.size()) {
      std::string w = args[i + 1];
      std::transform(w.begin(), w.end(), w.begin(), ::tolower);
      if (words.count(w)) {
        out.push_back(args[i] + "=" + w);
        ++i;
        continue;
      }
    }
    out.push_back(args[i]);
  }
  return out;
}

// Text of the new tokens as they come: decode everything so far and print what is new, holding
// back an incomplete UTF-8 character (a byte-level token can end mid-character).
class TextStreamer {
 public:
  explicit TextStreamer(const data::Tokenizer& tok) : tok_(tok) {}
  void put(int64_t id) {
    ids_.push_back(id);
    std::string text = tok_.decode(ids_);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.size() > printed_ && text.compare(0, printed_, text, 0, printed_) == 0) {
      std::cout << text.substr(printed_) << std::flush;
      printed_ = text.size();
    }
  }

 private:
  const data::Tokenizer& tok_;
  std::vector<int64_t> ids_;
  size_t printed_ = 0;
};

void write_file_atomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    ALPACA_CHECK(f, "cannot write " << tmp << "; check that the --output directory exists and is writable");
    f << content;
    f.flush();
    ALPACA_CHECK(f, "writing " << tmp << " failed (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    ALPACA_FAIL("cannot move " << tmp << " to " << path << ": " << ec.message());
  }
}

}  // namespace

int run_generate(const std::vector<std::string>& args_in) {
  CLI::App app{"Generate answers with a model directory (transformers' generate, in C++)", "alpaca-train generate"};
  GenerateFlags f;
  app.add_option("--model_name_or_path", f.model_dir, "HF model directory (config.json, safetensors, tokenizer)")
      ->required();
  app.add_option("--adapter", f.adapter,
                 "peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors, e.g. an "
                 "alpaca-train --use_peft output_dir) applied unmerged to the base model");
  app.add_option("--instruction", f.instruction, "One instruction; the answer streams to stdout");
  app.add_option("--input", f.input, "The instruction's input (Alpaca's second template)");
  app.add_option("--prompts", f.prompts, "Alpaca records (JSON array or JSON Lines) to answer");
  app.add_option("--output", f.output, "JSON Lines output for --prompts: each record + generation, generation_ids");
  app.add_option("--expected_field", f.expected_field,
                 "Record field to compare with the generation (adds exact_match and a summary line)");
  app.add_flag("--raw_prompt", f.raw_prompt, "Send the instruction text as is (no Alpaca template)");
  auto* o_max = app.add_option("--max_new_tokens", f.max_new_tokens,
                               "New tokens at most (default: generation_config.json's max_new_tokens, or "
                               "max_length minus the longest prompt, else 256)");
  auto* o_sample = app.add_flag("--do_sample", f.do_sample, "Sample instead of greedy decoding");
  auto* o_temp = app.add_option("--temperature", f.temperature, "Sampling temperature (> 0)");
  auto* o_topk = app.add_option("--top_k", f.top_k, "Keep the k most likely tokens when sampling (0 = off)");
  auto* o_topp = app.add_option("--top_p", f.top_p, "Nucleus sampling mass in (0, 1] (1 = off)");
  auto* o_rep = app.add_option("--repetition_penalty", f.repetition_penalty, "Penalty > 0 for seen tokens (1 = off)");
  app.add_option("--seed", f.seed, "Seed of the sampling generator")->capture_default_str();
  app.add_flag("--bf16", f.bf16, "Run the model in bfloat16 (default float32)");
  app.add_option("--batch_size", f.batch_size, "Prompts decoded together")->capture_default_str();
  app.add_option("--padding_side", f.padding_side, "left (transformers' choice for generation) or right")
      ->capture_default_str();
  app.add_option("--device", f.device, "auto (cuda when available), cpu or cuda[:N]")->capture_default_str();

  const std::vector<std::string> args =
      fold_bool_values(args_in, {"--raw_prompt", "--do_sample", "--bf16"});
  std::vector<std::string> argv(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    ALPACA_USAGE_FAIL("generate: " << e.what() << " (see alpaca-train generate --help)");
  }

  // Usage checks first: nothing is loaded or written when the command line is wrong.
  ALPACA_USAGE_CHECK(f.instruction.empty() != f.prompts.empty(),
                     "give exactly one of --instruction TEXT or --prompts FILE");
  ALPACA_USAGE_CHECK(f.input.empty() || !f.instruction.empty(), "--input goes with --instruction");
  ALPACA_USAGE_CHECK(f.prompts.empty() || !f.output.empty(), "--prompts needs --output FILE.jsonl");
  ALPACA_USAGE_CHECK(f.output.empty() || !f.prompts.empty(), "--output goes with --prompts");
  ALPACA_USAGE_CHECK(f.expected_field.empty() || !f.prompts.empty(), "--expected_field goes with --prompts");
  ALPACA_USAGE_CHECK(!(f.raw_prompt && !f.input.empty()), "--raw_prompt sends --instruction as is; drop --input");
  ALPACA_USAGE_CHECK(f.padding_side == "left" || f.padding_side == "right",
                     "--padding_side must be left or right, got " << f.padding_side);
  ALPACA_USAGE_CHECK(f.batch_size > 0, "--batch_size must be positive, got " << f.batch_size);
  ALPACA_USAGE_CHECK(!o_max->count() || f.max_new_tokens > 0, "--max_new_tokens must be positive, got " << f.max_new_tokens);
  ALPACA_USAGE_CHECK(!o_topp->count() || (f.top_p > 0 && f.top_p <= 1), "--top_p must be in (0, 1] (1 = off), got " << f.top_p);
  ALPACA_USAGE_CHECK(!o_temp->count() || f.temperature > 0, "--temperature must be positive, got " << f.temperature);
  ALPACA_USAGE_CHECK(!o_topk->count() || f.top_k >= 0, "--top_k must be >= 0 (0 = off), got " << f.top_k);
  ALPACA_USAGE_CHECK(!o_rep->count() || f.repetition_penalty > 0,
                     "--repetition_penalty must be positive (1 = off), got " << f.repetition_penalty);
  ALPACA_USAGE_CHECK(fs::is_directory(f.model_dir),
                     "--model_name_or_path " << f.model_dir << " is not a directory (an HF model directory is needed)");
  ALPACA_CHECK(fs::exists(fs::path(f.model_dir) / "config.json"),
               f.model_dir << " has no config.json; point --model_name_or_path at an HF model directory");
  ALPACA_USAGE_CHECK(f.adapter.empty() || fs::is_directory(f.adapter),
                     "--adapter " << f.adapter << " is not a directory (a peft adapter directory is needed)");
  // Read (and check) the adapter before the model loads; its tokenizer, when it has one, is the
  // one it was trained with (train.py may have added [PAD]).
  std::optional<ckpt::LoraAdapter> adapter;
  if (!f.adapter.empty()) adapter = ckpt::read_lora_adapter(f.adapter);
  const std::string tok_dir = adapter && (fs::is_regular_file(fs::path(f.adapter) / "tokenizer.json") ||
                                          fs::is_regular_file(fs::path(f.adapter) / "tokenizer.model"))
                                  ? f.adapter
                                  : f.model_dir;

  // Prompts (cheap, and their errors should not wait for the model to load).
  generate::PromptOptions popts{f.raw_prompt, f.expected_field};
  std::vector<generate::PromptRecord> records;
  if (!f.prompts.empty()) {
    records = generate::load_prompt_records(f.prompts, popts);
  } else {
    generate::PromptRecord r;
    r.prompt = f.raw_prompt ? f.instruction : generate::alpaca_prompt(f.instruction, f.input);
    records.push_back(std::move(r));
  }

  // Decoding options: flags, else generation_config.json, else transformers' defaults.
  const generate::GenerationConfig gc = generate::read_generation_config(f.model_dir);
  const model::LlamaConfig cfg = model::LlamaConfig::from_json_file((fs::path(f.model_dir) / "config.json").string());
  generate::GenerateOptions opts;
  opts.sampling.do_sample = o_sample->count() ? f.do_sample : gc.do_sample.value_or(false);
  opts.sampling.temperature = o_temp->count() ? f.temperature : gc.temperature.value_or(1.0);
  opts.sampling.top_k = o_topk->count() ? f.top_k : gc.top_k.value_or(50);
  opts.sampling.top_p = o_topp->count() ? f.top_p : gc.top_p.value_or(1.0);
  opts.sampling.repetition_penalty = o_rep->count() ? f.repetition_penalty : gc.repetition_penalty.value_or(1.0);
  try {
    generate::validate(opts.sampling);
  } catch (const Error& e) {
    ALPACA_FAIL(e.message() << " (from " << f.model_dir << "/generation_config.json)");
  }
  opts.eos_token_ids = !gc.eos_token_id.empty() ? gc.eos_token_id : cfg.eos_token_id;
  opts.padding_side = f.padding_side == "left" ? generate::PaddingSide::kLeft : generate::PaddingSide::kRight;

  data::Tokenizer tok = data::Tokenizer::load(tok_dir);
  std::vector<std::vector<int64_t>> prompt_ids;
  size_t longest = 0;
  for (const auto& r : records) {
    prompt_ids.push_back(tok.encode(r.prompt, /*add_special_tokens=*/true));
    longest = std::max(longest, prompt_ids.back().size());
  }
  ALPACA_CHECK(longest > 0, "a prompt encodes to no tokens; give a non-empty instruction");
  opts.pad_token_id = gc.pad_token_id ? *gc.pad_token_id
                      : cfg.pad_token_id ? *cfg.pad_token_id
                      : tok.pad_id() ? *tok.pad_id()
                      : opts.eos_token_ids.empty() ? 0 : opts.eos_token_ids.front();  // transformers: pad = eos
  if (o_max->count()) {
    opts.max_new_tokens = f.max_new_tokens;
  } else if (gc.max_new_tokens) {
    opts.max_new_tokens = *gc.max_new_tokens;
  } else if (gc.max_length) {
    opts.max_new_tokens = std::max<int64_t>(1, *gc.max_length - static_cast<int64_t>(longest));
  } else {
    opts.max_new_tokens = 256;
  }

  at::Device device = at::kCPU;
  if (f.device == "auto") {
    if (at::hasCUDA()) device = at::Device(at::kCUDA, 0);
  } else {
    try {
      device = at::Device(f.device);
    } catch (const std::exception&) {
      ALPACA_USAGE_FAIL("--device must be auto, cpu or cuda[:N], got " << f.device);
    }
    ALPACA_USAGE_CHECK(!device.is_cuda() || at::hasCUDA(), "--device " << f.device << ": no CUDA device here");
  }
  const auto t_load = std::chrono::steady_clock::now();
  model::LlamaForCausalLM m = io::load_hf_model(
      f.model_dir, at::TensorOptions().dtype(f.bf16 ? at::kBFloat16 : at::kFloat).device(device));
  if (adapter) {
    const int64_t n = ckpt::attach_lora_adapter(*m, *adapter, f.model_dir);
    ALPACA_INFO("generate: adapter " << f.adapter << ": LoRA on " << n << " linears (unmerged, scaling "
                << adapter->scaling << ")");
  }
  m->eval();
  ALPACA_INFO("generate: loaded " << f.model_dir << " (" << model::num_parameters(m) << " parameters, "
              << (f.bf16 ? "bf16" : "fp32") << ", " << device << ") in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count() << " s; "
              << (opts.sampling.do_sample ? "sampling" : "greedy") << ", max_new_tokens " << opts.max_new_tokens);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(f.seed);
  const auto t0 = std::chrono::steady_clock::now();
  if (f.prompts.empty()) {
    TextStreamer streamer(tok);
    generate::generate_batch(m, prompt_ids, opts, gen, [&](int64_t, int64_t id) { streamer.put(id); });
    std::cout << "\n" << std::flush;
    return 0;
  }

  std::string content;
  int64_t num_tokens = 0, num_correct = 0;
  for (size_t i = 0; i < prompt_ids.size(); i += static_cast<size_t>(f.batch_size)) {
    const size_t end = std::min(prompt_ids.size(), i + static_cast<size_t>(f.batch_size));
    std::vector<std::vector<int64_t>> batch(prompt_ids.begin() + i, prompt_ids.begin() + end);
    std::vector<generate::Generation> gens = generate::generate_batch(m, batch, opts, gen);
    for (size_t j = 0; j < gens.size(); ++j) {
      const generate::PromptRecord& rec = records[i + j];
      const std::string text = tok.decode(gens[j].ids, /*skip_special=*/true);
      std::optional<bool> match;
      if (rec.expected) {
        match = generate::exact_match(text, *rec.expected);
        num_correct += *match;
      }
      content += generate::output_line(rec, text, gens[j].ids, match) + "\n";
      num_tokens += static_cast<int64_t>(gens[j].ids.size());
    }
    ALPACA_INFO("generate: " << end << "/" << prompt_ids.size() << " prompts");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_file_atomically(f.output, content);
  ALPACA_INFO("generate: wrote " << records.size() << " lines to " << f.output << " (" << num_tokens
              << " new tokens in " << secs << " s, " << num_tokens / std::max(secs, 1e-9) << " tokens/s)");
  if (!f.expected_field.empty()) {
    std::cout << "{\"exact_match\": " << static_cast<double>(num_correct) / static_cast<double>(records.size())
              << ", \"num_correct\": " << num_correct << ", \"n\": " << records.size() << ", \"field\": \""
              << f.expected_field << "\"}\n";
  }
  return 0;
}

}  // namespace alpaca::cli
