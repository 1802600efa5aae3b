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

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/chat/chat_template.h"
#include "alpaca/cli/commands.h"
#include "alpaca/cli/subcommand_flags.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/data/conversation.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/generate/generation_config.h"
#include "alpaca/generate/chat_prompt.h"
#include "alpaca/generate/generator.h"
#include "alpaca/generate/prompt_records.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/io/peft_adapter.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/user_error.h"

namespace fs = std::filesystem;

namespace alpaca::cli {
namespace {

struct GenerateFlags {
  std::string model_dir, adapter, instruction, input, prompts, output, expected_field, device = "auto";
  std::string padding_side = "left", chat_template, chat_template_kwargs;
  bool chat = false, raw_prompt = false, bf16 = false, do_sample = false;
  int64_t max_new_tokens = 0, top_k = 50, batch_size = 1;
  double temperature = 1.0, top_p = 1.0, repetition_penalty = 1.0;
  uint64_t seed = 42;
};

// Text of the new tokens as they come: decode everything so far and print what is new, holding
// back an incomplete UTF-8 character (a byte-level token can end mid-character).
class TextStreamer {
 public:
  explicit TextStreamer(const tokenizer::Tokenizer& tok) : tok_(tok) {}
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
  const tokenizer::Tokenizer& tok_;
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

// The flags' own consistency, before anything is read.
void check_flags(const GenerateFlags& f, const ParsedFlags& parsed) {
  auto given = [&](const char* name) { return parsed.was_given(name); };
  ALPACA_USAGE_CHECK(f.instruction.empty() != f.prompts.empty(),
                     "give exactly one of --instruction TEXT or --prompts FILE");
  ALPACA_USAGE_CHECK(f.input.empty() || !f.instruction.empty(), "--input goes with --instruction");
  ALPACA_USAGE_CHECK(f.prompts.empty() || !f.output.empty(), "--prompts needs --output FILE.jsonl");
  ALPACA_USAGE_CHECK(f.output.empty() || !f.prompts.empty(), "--output goes with --prompts");
  ALPACA_USAGE_CHECK(f.expected_field.empty() || !f.prompts.empty(), "--expected_field goes with --prompts");
  ALPACA_USAGE_CHECK(!(f.raw_prompt && !f.input.empty()), "--raw_prompt sends --instruction as is; drop --input");
  ALPACA_USAGE_CHECK(!(f.raw_prompt && (f.chat || !f.chat_template.empty() || !f.chat_template_kwargs.empty())),
                     "--raw_prompt sends the text as is, --chat (--chat_template, --chat_template_kwargs) through the "
                     "chat template; give one of them");
  ALPACA_USAGE_CHECK(f.chat_template.empty() || fs::is_regular_file(f.chat_template),
                     "--chat_template " << f.chat_template << " is not a file (a Jinja chat template is needed)");
  ALPACA_USAGE_CHECK(f.padding_side == "left" || f.padding_side == "right",
                     "--padding_side must be left or right, got " << f.padding_side);
  ALPACA_USAGE_CHECK(f.batch_size > 0, "--batch_size must be positive, got " << f.batch_size);
  ALPACA_USAGE_CHECK(!given("--max_new_tokens") || f.max_new_tokens > 0, "--max_new_tokens must be positive, got " << f.max_new_tokens);
  ALPACA_USAGE_CHECK(!given("--top_p") || (f.top_p > 0 && f.top_p <= 1), "--top_p must be in (0, 1] (1 = off), got " << f.top_p);
  ALPACA_USAGE_CHECK(!given("--temperature") || f.temperature > 0, "--temperature must be positive, got " << f.temperature);
  ALPACA_USAGE_CHECK(!given("--top_k") || f.top_k >= 0, "--top_k must be >= 0 (0 = off), got " << f.top_k);
  ALPACA_USAGE_CHECK(!given("--repetition_penalty") || f.repetition_penalty > 0,
                     "--repetition_penalty must be positive (1 = off), got " << f.repetition_penalty);
  ALPACA_USAGE_CHECK(fs::is_directory(f.model_dir),
                     "--model_name_or_path " << f.model_dir << " is not a directory (an HF model directory is needed)");
  ALPACA_CHECK(fs::exists(fs::path(f.model_dir) / "config.json"),
               f.model_dir << " has no config.json; point --model_name_or_path at an HF model directory");
  ALPACA_USAGE_CHECK(f.adapter.empty() || fs::is_directory(f.adapter),
                     "--adapter " << f.adapter << " is not a directory (a peft adapter directory is needed)");
}

at::Device pick_device(const std::string& flag) {
  at::Device device = at::kCPU;
  if (flag == "auto") {
    if (at::hasCUDA()) device = at::Device(at::kCUDA, 0);
  } else {
    try {
      device = at::Device(flag);
    } catch (const std::exception&) {
      ALPACA_USAGE_FAIL("--device must be auto, cpu or cuda[:N], got " << flag);
    }
    ALPACA_USAGE_CHECK(!device.is_cuda() || at::hasCUDA(), "--device " << flag << ": no CUDA device here");
  }
  return device;
}

// --prompts: every record answered in batches of --batch_size, written as JSON Lines (with
// exact_match and a summary line when --expected_field is given).
void answer_prompts(const GenerateFlags& f, const std::vector<generate::PromptRecord>& records,
                    const std::vector<std::vector<int64_t>>& prompt_ids, model::LlamaForCausalLM& m,
                    const tokenizer::Tokenizer& tok, const generate::GenerateOptions& opts, at::Generator& gen) {
  const auto t0 = std::chrono::steady_clock::now();
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
}

// The one table of generate's flags (cli/subcommand_flags.h), bound to `f`.
Subcommand generate_command(GenerateFlags& f) {
  return Subcommand{
      "generate", "Generate answers with a model directory (transformers' generate, in C++).",
      {{"--model_name_or_path", &f.model_dir, "HF model directory (config.json, safetensors, tokenizer)", true},
       {"--adapter", &f.adapter,
        "peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors, e.g. an alpaca-train "
        "--use_peft output_dir) applied unmerged to the base model"},
       {"--instruction", &f.instruction, "One instruction; the answer streams to stdout"},
       {"--input", &f.input, "The instruction's input (Alpaca's second template)"},
       {"--prompts", &f.prompts, "Alpaca records (JSON array or JSON Lines) to answer"},
       {"--output", &f.output, "JSON Lines output for --prompts: each record + generation, generation_ids"},
       {"--expected_field", &f.expected_field,
        "Record field to compare with the generation (adds exact_match and a summary line)"},
       {"--raw_prompt", &f.raw_prompt, "Send the instruction text as is (no Alpaca template)"},
       {"--chat", &f.chat,
        "Ask through the model's chat template with add_generation_prompt (as transformers' apply_chat_template): "
        "the instruction (+ input) as one user message; --prompts records with \"messages\" always are"},
       {"--chat_template", &f.chat_template,
        "Jinja chat template file used instead of the model's (chat_template.jinja / tokenizer_config.json); "
        "implies --chat"},
       {"--chat_template_kwargs", &f.chat_template_kwargs,
        "JSON object of chat template variables for every conversation, e.g. '{\"enable_thinking\": false}' "
        "(apply_chat_template's kwargs; a --prompts record's own chat_template_kwargs win); implies --chat"},
       {"--max_new_tokens", &f.max_new_tokens,
        "New tokens at most (default: generation_config.json's max_new_tokens, or max_length minus each batch's longest "
        "prompt, else 256)"},
       {"--do_sample", &f.do_sample, "Sample instead of greedy decoding (default: generation_config.json's)"},
       {"--temperature", &f.temperature, "Sampling temperature (> 0)"},
       {"--top_k", &f.top_k, "Keep the k most likely tokens when sampling (0 = off)"},
       {"--top_p", &f.top_p, "Nucleus sampling mass in (0, 1] (1 = off)"},
       {"--repetition_penalty", &f.repetition_penalty, "Penalty > 0 for seen tokens (1 = off)"},
       {"--seed", &f.seed, "Seed of the sampling generator"},
       {"--bf16", &f.bf16, "Run the model in bfloat16 (default float32)"},
       {"--batch_size", &f.batch_size, "Prompts decoded together"},
       {"--padding_side", &f.padding_side, "left (transformers' choice for generation) or right"},
       {"--device", &f.device, "auto (cuda when available), cpu or cuda[:N]"}}};
}

// Sampling: the flags given, else generation_config.json, else transformers' defaults.
generate::SamplingParams sampling_options(const GenerateFlags& f, const ParsedFlags& parsed,
                                           const generate::GenerationConfig& gc) {
  auto given = [&](const char* name) { return parsed.was_given(name); };
  generate::SamplingParams o;
  o.do_sample = given("--do_sample") ? f.do_sample : gc.do_sample.value_or(false);
  o.temperature = given("--temperature") ? f.temperature : gc.temperature.value_or(1.0);
  o.top_k = given("--top_k") ? f.top_k : gc.top_k.value_or(50);
  o.top_p = given("--top_p") ? f.top_p : gc.top_p.value_or(1.0);
  o.repetition_penalty = given("--repetition_penalty") ? f.repetition_penalty : gc.repetition_penalty.value_or(1.0);
  try {
    generate::validate(o);
  } catch (const Error& e) {
    ALPACA_FAIL(e.message() << " (from " << f.model_dir << "/generation_config.json)");
  }
  return o;
}

// --chat_template_kwargs as template variables (checked as a row's chat_template_kwargs are).
std::string flag_variables_json(const GenerateFlags& f) {
  if (f.chat_template_kwargs.empty()) return "{}";
  nlohmann::json kwargs;
  try {
    kwargs = nlohmann::json::parse(f.chat_template_kwargs);
  } catch (const nlohmann::json::parse_error& e) {
    ALPACA_USAGE_FAIL("--chat_template_kwargs is not JSON (" << e.what() << "); give an object, e.g. "
                      "'{\"enable_thinking\": false}'");
  }
  ALPACA_USAGE_CHECK(kwargs.is_object(), "--chat_template_kwargs is a JSON " << kwargs.type_name()
                                             << "; give an object of template variables, e.g. '{\"enable_thinking\": false}'");
  try {
    return data::row_template_variables_json(nlohmann::json{{"chat_template_kwargs", kwargs}}.dump(),
                                             "--chat_template_kwargs");
  } catch (const Error& e) {
    ALPACA_USAGE_FAIL(e.message());
  }
}

// Token ids of every prompt: Alpaca/raw text with the tokenizer's special tokens, a conversation
// through the chat template (loaded only when a record has one) and without them, as transformers'
// apply_chat_template(tokenize=True) does, with `flag_variables` (--chat_template_kwargs) under
// each record's own template variables.
std::vector<std::vector<int64_t>> encode_prompts(const GenerateFlags& f,
                                                 const std::vector<generate::PromptRecord>& records,
                                                 const tokenizer::Tokenizer& tok, const std::string& tok_dir,
                                                 const std::string& flag_variables) {
  std::optional<chat::ChatTemplate> tmpl;
  std::vector<std::vector<int64_t>> out;
  const auto flag_vars = nlohmann::ordered_json::parse(flag_variables);  // key order kept
  for (const auto& r : records) {
    if (!r.messages) {
      out.push_back(tok.encode(r.prompt, /*add_special_tokens=*/true));
      continue;
    }
    if (!tmpl) {
      try {
        tmpl = chat::ChatTemplate::load(tok_dir, f.chat_template);
      } catch (const Error& e) {
        ALPACA_USER_FAIL(e.message() << " (--chat and \"messages\" prompts are rendered by it; without --chat, Alpaca "
                                   "records get the Alpaca prompt)");
      }
      ALPACA_INFO("generate: chat template of " << (f.chat_template.empty() ? tok_dir : f.chat_template)
                  << ", with add_generation_prompt");
    }
    // --chat_template_kwargs for every conversation, the record's own variables over them.
    nlohmann::ordered_json vars = flag_vars;
    vars.update(nlohmann::ordered_json::parse(r.template_variables));
    out.push_back(tok.encode(generate::chat_prompt(*tmpl, *r.messages, data::template_special_tokens_json(tok), vars.dump()),
                             /*add_special_tokens=*/false));
  }
  return out;
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  GenerateFlags f;
  const ParsedFlags parsed = parse_subcommand_flags(generate_command(f), args);
  if (parsed.help) return 0;
  check_flags(f, parsed);
  // Read (and check) the adapter before the model loads; its tokenizer, when it has one, is the
  // one it was trained with (train.py may have added [PAD]).
  std::optional<io::LoraAdapter> adapter;
  if (!f.adapter.empty()) adapter = io::read_lora_adapter(f.adapter);
  const std::string tok_dir = adapter ? io::adapter_tokenizer_dir(f.adapter, f.model_dir) : f.model_dir;

  // Prompts (cheap, and their errors should not wait for the model to load).
  if (!f.chat_template.empty() || !f.chat_template_kwargs.empty()) f.chat = true;
  const std::string flag_variables = flag_variables_json(f);  // a bad one fails before the model loads
  generate::PromptOptions popts{f.raw_prompt, f.expected_field, f.chat};
  std::vector<generate::PromptRecord> records;
  if (!f.prompts.empty()) {
    records = generate::load_prompt_records(f.prompts, popts);
  } else {
    records = generate::parse_prompt_records(
        nlohmann::json({{"instruction", f.instruction}, {"input", f.input}}).dump(), "--instruction", popts);
  }

  // Decoding options: flags, else generation_config.json, else transformers' defaults.
  const generate::GenerationConfig gc = generate::read_generation_config(f.model_dir);
  if (!gc.unimplemented.empty()) {
    std::string fields;
    for (const auto& u : gc.unimplemented) fields += (fields.empty() ? "" : ", ") + u;
    ALPACA_WARN(f.model_dir << "/generation_config.json asks for " << fields << ", which alpaca-train generate does not "
                "implement (greedy or sampling with temperature, top_k, top_p, repetition_penalty only): decoding without "
                "it, so the answers can differ from transformers' generate");
  }
  const model::LlamaConfig cfg = model::LlamaConfig::from_json_file((fs::path(f.model_dir) / "config.json").string());
  generate::GenerateOptions opts;
  opts.sampling = sampling_options(f, parsed, gc);
  opts.eos_token_ids = gc.from_file ? gc.eos_token_id : cfg.eos_token_id;
  opts.padding_side = f.padding_side == "left" ? generate::PaddingSide::kLeft : generate::PaddingSide::kRight;

  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(tok_dir);
  const std::vector<std::vector<int64_t>> prompt_ids = encode_prompts(f, records, tok, tok_dir, flag_variables);
  size_t longest = 0;
  for (const auto& p : prompt_ids) longest = std::max(longest, p.size());
  ALPACA_CHECK(longest > 0, "a prompt encodes to no tokens; give a non-empty instruction");
  opts.pad_token_id = gc.pad_token_id ? *gc.pad_token_id
                      : cfg.pad_token_id ? *cfg.pad_token_id
                      : tok.pad_id() ? *tok.pad_id()
                      : opts.eos_token_ids.empty() ? 0 : opts.eos_token_ids.front();  // transformers: pad = eos
  opts.max_new_tokens = parsed.was_given("--max_new_tokens") ? f.max_new_tokens
                        : gc.max_new_tokens                  ? *gc.max_new_tokens
                        : gc.max_length ? std::max<int64_t>(1, *gc.max_length - static_cast<int64_t>(longest))
                                        : 256;
  // max_length alone: each batch's own budget (transformers: max_length - input_ids.shape[1]).
  if (!parsed.was_given("--max_new_tokens") && !gc.max_new_tokens && gc.max_length) opts.max_length = gc.max_length;

  const at::Device device = pick_device(f.device);
  const auto t_load = std::chrono::steady_clock::now();
  model::LlamaForCausalLM m = io::load_hf_model(
      f.model_dir, at::TensorOptions().dtype(f.bf16 ? at::kBFloat16 : at::kFloat).device(device));
  if (adapter) {
    const int64_t n = io::attach_lora_adapter(*m, *adapter, f.model_dir);
    ALPACA_INFO("generate: adapter " << f.adapter << ": LoRA on " << n << " linears (unmerged, scaling "
                << adapter->scaling << ")");
  }
  m->eval();
  ALPACA_INFO("generate: loaded " << f.model_dir << " (" << model::num_parameters(m) << " parameters, "
              << (f.bf16 ? "bf16" : "fp32") << ", " << device << ") in "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count() << " s; "
              << (opts.sampling.do_sample ? "sampling" : "greedy") << ", max_new_tokens " << opts.max_new_tokens);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(f.seed);
  if (f.prompts.empty()) {
    TextStreamer streamer(tok);
    generate::generate_batch(m, prompt_ids, opts, gen, [&](int64_t, int64_t id) { streamer.put(id); });
    std::cout << "\n" << std::flush;
    return 0;
  }

  answer_prompts(f, records, prompt_ids, m, tok, opts, gen);
  return 0;
}

}  // namespace alpaca::cli
