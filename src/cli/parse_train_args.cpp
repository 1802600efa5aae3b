// Command line + --config file -> TrainArgs. CLI11 tokenises argv against the flag table (every
// flag takes a value; booleans may also stand bare); the config file's keys are the same flag
// names; the command line wins over the file. Unknown names are errors with a suggestion.
#include <CLI/CLI.hpp>         // defines: CLI::App, CLI::ParseError
#include <nlohmann/json.hpp>   // defines: nlohmann::json

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "yaml_config.h"

namespace alpaca::cli {
namespace {

using nlohmann::json;

std::vector<std::string> known_spellings() {
  std::vector<std::string> names;
  for (const auto& f : train_flags()) names.push_back(f.name);
  for (const auto& [alias, target] : train_flag_aliases()) names.push_back(alias);
  names.push_back("config");
  return names;
}

// Maps an alias to its flag name; returns the input when it is not an alias.
std::string canonical_name(const std::string& name) {
  for (const auto& [alias, target] : train_flag_aliases()) {
    if (alias == name) return target;
  }
  return name;
}

// Hugging Face TrainingArguments / TRL SFTConfig, ModelConfig and ScriptArguments fields that
// alpaca-train does not take, each with the reason and what to do instead: a command or config
// written for `trl sft` or an HF script says why it stops, not only that the flag is unknown. A
// field set to a value that asks for nothing (HF's default: push_to_hub false, dtype float32,
// dataloader_pin_memory true, ...) is accepted and dropped, so TRL's recipe files, which list
// them, run unchanged.
struct UnsupportedField {
  std::string reason;
  std::vector<std::string> no_op;  // values (normalised by no_op_word) that ask for nothing
};

const std::map<std::string, UnsupportedField>& unsupported_hf_fields() {
  static const std::string kHub = "alpaca-train never uploads (no network at run time); upload output_dir yourself";
  static const std::string kData =
      "alpaca-train reads local files only: write the dataset to disk (datasets' save_to_disk, to_json or to_parquet) "
      "and give it as --data_path";
  static const std::string kDtype =
      "the trained weights are fp32 (FSDP master shards); --bf16 True or --fp16 True picks the compute dtype, in which "
      "a LoRA run also holds its frozen base";
  static const std::string kCompile = "the step is compiled C++ with its own fused kernels; there is no TorchDynamo";
  static const std::string kDdp = "alpaca-train shards with its own FSDP engine and has no DDP";
  static const std::string kLoader = "examples are tokenized in-process before training; there is no DataLoader";
  const std::vector<std::string> off = {"false"}, none = {"none"};
  static const std::map<std::string, UnsupportedField> fields = {
      {"push_to_hub", {kHub, off}}, {"hub_model_id", {kHub, none}}, {"hub_strategy", {kHub, {"every_save"}}},
      {"hub_token", {kHub, {"none", "<hub_token>"}}}, {"hub_private_repo", {kHub, {"none", "false"}}}, {"hub_always_push", {kHub, off}},
      {"hub_revision", {kHub, none}},
      {"dataset_name", {kData, none}}, {"dataset_config", {kData, none}}, {"dataset_train_split", {kData, {"train"}}},
      {"dataset_test_split", {kData, {"test"}}}, {"dataset_streaming", {kData, off}},
      {"torch_dtype", {kDtype, {"none", "float32"}}}, {"dtype", {kDtype, {"none", "float32"}}},
      {"attn_implementation", {"attention is alpaca-train's own causal, packing-aware kernel on every device; drop the flag", none}},
      {"torch_compile", {kCompile, off}}, {"torch_compile_backend", {kCompile, none}}, {"torch_compile_mode", {kCompile, none}},
      {"use_liger_kernel", {"alpaca-train's fused loss and elementwise kernels are always on; drop the flag", off}},
      {"bf16_full_eval", {"evaluation runs in the training's precision (--bf16 / --fp16)", off}},
      {"fp16_full_eval", {"evaluation runs in the training's precision (--bf16 / --fp16)", off}},
      {"optim_args", {"the optimizers here (--optim adamw_torch, adamw_torch_fused, bitsandbytes' AdamW and Lion, adafactor) take "
                      "no optim_args in transformers either; AdamW's settings are --adam_beta1, --adam_beta2, "
                      "--adam_epsilon and --weight_decay", none}},
      {"ddp_find_unused_parameters", {kDdp, {"none", "false"}}}, {"ddp_bucket_cap_mb", {kDdp, none}},
      {"ddp_broadcast_buffers", {kDdp, none}},
      {"ddp_backend", {"the backend is chosen per device: NCCL between GPUs, MPI or Gloo between CPU ranks", none}},
      {"dataloader_pin_memory", {kLoader, {"true"}}}, {"dataloader_persistent_workers", {kLoader, off}},
      {"dataloader_prefetch_factor", {kLoader, none}},
      {"trust_remote_code", {"the model code is alpaca-train's own (LLaMA, Mistral, Qwen2); nothing from the model "
                             "directory runs; drop the flag", off}},
      {"model_revision", {"models load from local directories, which have no revisions", {"main"}}},
      {"padding_free", {"--packing True gives TRL's padding-free packed batches (each document attends to itself); "
                        "without packing, batches are padded as TRL's default collator pads them", off}},
      {"activation_offloading", {"not implemented; --gradient_checkpointing saves the activation memory instead", off}},
      {"eval_accumulation_steps", {"evaluation computes losses only; no predictions accumulate", none}},
      // TrainingArguments.to_dict() writes its default AcceleratorConfig and masks tokens.
      {"accelerator_config", {"there is no Accelerate underneath; the launch is mpirun, srun or --nproc_per_node",
                              {"none", "{\"dispatch_batches\":null,\"even_batches\":true,\"gradient_accumulation_kwargs\":"
                                       "null,\"non_blocking\":false,\"split_batches\":false,\"use_seedable_sampler\":true}"}}},
      {"logging_nan_inf_filter", {"a non-finite step loss (an fp16 overflow's skipped step) is always left out of "
                                  "the logged mean, as HF's default True filters it", {"true"}}},
      {"lora_task_type", {"the adapter is always a causal-LM one (peft task_type CAUSAL_LM)", {"causal_lm"}}},
      // transformers 5 / TRL 1.x fields a dumped SFTConfig carries: their defaults ask for nothing.
      {"parallelism_config", {"FSDP is the one parallelism (--fsdp, --fsdp_config); no tensor or context parallelism", none}},
      {"dataloader_in_order", {kLoader, {"true"}}}, {"dataloader_multiprocessing_context", {kLoader, none}},
      {"ddp_static_graph", {kDdp, none}},
      {"debug", {"the debug features (underflow_overflow, tpu_metrics_debug) are not implemented", none}},
      {"do_predict", {"there is no prediction loop; alpaca-train generate answers instructions", off}},
      {"prediction_loss_only", {"evaluation computes losses only, as this asks", {"false", "true"}}},
      {"batch_eval_metrics", {"evaluation computes losses only (no compute_metrics)", off}},
      {"eval_do_concat_batches", {"evaluation computes losses only; no predictions are concatenated", {"true"}}},
      {"eval_use_gather_object", {"evaluation computes losses only; nothing is gathered as objects", off}},
      {"include_for_metrics", {"evaluation computes losses only (no compute_metrics)", none}},
      {"label_names", {"the labels are the collator's 'labels'", none}},
      {"length_column_name", {"--group_by_length measures each tokenized example itself", {"length"}}},
      {"liger_kernel_config", {"alpaca-train's fused loss and elementwise kernels are always on", none}},
      {"router_aux_loss_coef", {"LLaMA-family models have no experts (no MoE load-balancing loss)", none}},
      {"optim_target_modules", {"GaLore / APOLLO are not implemented (--optim: AdamW, bitsandbytes' AdamW and Lion, Adafactor)", none}},
      {"log_on_each_node", {"rank 0 logs, once per run", {"true"}}},
      {"save_on_each_node", {"rank 0 writes output_dir and checkpoints (a shared filesystem); each node saving to "
                             "its own disk is not implemented", off}},
      {"skip_memory_metrics", {"memory is reported alpaca-train's own way (the FSDP memory account at the start, peak "
                               "memory in the step logs), not as HF's memory metrics", {"true"}}},
      {"restore_callback_states_from_checkpoint", {"there are no callbacks", off}},
      {"enable_jit_checkpoint", {"SIGTERM/SIGUSR1 always save a checkpoint and exit 75 (docs/reliability.md)",
                                 {"false", "true"}}},
      {"project", {"Trackio is not a --report_to here (tensorboard, none)", {"huggingface"}}},
      {"trackio_space_id", {"Trackio is not a --report_to here (tensorboard, none)", none}},
      {"trackio_bucket_id", {"Trackio is not a --report_to here (tensorboard, none)", none}},
      {"trackio_static_space_id", {"Trackio is not a --report_to here (tensorboard, none)", none}},
      {"use_cache", {"training keeps no KV cache", off}},
      {"model_init_kwargs", {"the model loads from --model_name_or_path as config.json says; its dtype follows --bf16 / "
                             "--fp16", none}},
      {"dataset_kwargs", {"datasets are always prepared (tokenized) in-process", none}},
      {"truncation_mode", {"examples keep their start (TRL's only supported mode; keep_end is deprecated there)",
                           {"keep_start"}}},
      {"ignore_bias_buffers", {kDdp, off}},
      {"lora_target_parameters", {"LoRA adapts linear modules (--lora_target_modules); peft's ParamWrapper for bare "
                                  "parameters (MoE experts) has nothing to adapt in LLaMA-family models", none}},
  };
  return fields;
}

// A value as no_op compares it: none/null/~/"" -> "none", yes/true/on -> "true", no/false/off ->
// "false", a number equal to 0 -> "0", anything else lower-cased.
std::string no_op_word(const std::string& text) {
  std::string t = text;
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t.empty() || t == "none" || t == "null" || t == "~") return "none";
  if (t == "true" || t == "yes" || t == "on") return "true";
  if (t == "false" || t == "no" || t == "off") return "false";
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() && *end == '\0' && v == 0) return "0";
  return t;
}

// transformers 5's activation_checkpointing(_kwargs) set to null: unset (a dumped config writes them
// next to gradient_checkpointing). Other aliases keep their null: TRL's max_length None means "no
// truncation", which is not our default, so it stays an error rather than 512 in silence.
bool alias_unset_by_null(const std::string& name, const std::string& value) {
  return (name == "activation_checkpointing" || name == "activation_checkpointing_kwargs") && no_op_word(value) == "none";
}

// Whether `name` is an HF/TRL field we do not take, set to a value that asks for nothing.
bool is_no_op_hf_field(const std::string& name, const std::string& value) {
  const auto it = unsupported_hf_fields().find(name);
  if (it == unsupported_hf_fields().end()) return false;
  const auto& no_op = it->second.no_op;
  return std::find(no_op.begin(), no_op.end(), no_op_word(value)) != no_op.end();
}

// "unknown flag --learnig_rate; did you mean --learning_rate?" (`quote` spells names as in the source).
std::string unknown_flag_message(const std::string& what, const std::string& name, const std::string& quote) {
  std::ostringstream os;
  const std::string close = quote == "--" ? "" : quote;
  const auto unsupported = unsupported_hf_fields().find(name);
  if (unsupported != unsupported_hf_fields().end()) {
    os << what << " " << quote << name << close << ": transformers/TRL take it, alpaca-train does not: "
       << unsupported->second.reason;
    return os.str();
  }
  os << what << " " << quote << name << close;
  // TRL's SFTConfig names of what is ours under Alpaca's name (edit distance would not find them).
  static const std::map<std::string, std::string> kTrlNames = {{"max_length", "model_max_length"},
                                                               {"max_seq_length", "model_max_length"}};
  const auto trl = kTrlNames.find(name);
  std::string guess = trl != kTrlNames.end() ? trl->second : closest_name(name, known_spellings());
  if (!guess.empty()) os << "; did you mean " << quote << guess << close << "?";
  else os << "; run 'alpaca-train --help' for the list of flags";
  return os.str();
}

// A JSON config value as the text the same flag takes on the command line.
std::string json_value_text(const std::string& file, const std::string& key, const json& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  // Unsigned first: 2^64-1 read as int64 would turn into -1 ("not set" for max_steps).
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    std::ostringstream os;
    os.precision(17);
    os << v.get<double>();
    return os.str();
  }
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) return v.dump();  // inline JSON: fsdp_config, deepspeed, lr_scheduler_kwargs
  if (v.is_array()) {
    // Word lists (fsdp, report_to, fsdp_transformer_layer_cls_to_wrap) as HF's space-separated text.
    std::string out;
    for (const auto& item : v) {
      ALPACA_USAGE_CHECK(item.is_string(), "config file " << file << ": key '" << key
                                                           << "' holds a list with a non-string item " << item.dump());
      out += (out.empty() ? "" : " ") + item.get<std::string>();
    }
    return out;
  }
  ALPACA_USAGE_FAIL("config file " << file << ": key '" << key << "' has an unsupported value " << v.dump());
}

// Reads --config: a JSON object whose keys are flag names (without --), or the same as YAML
// (*.yaml, *.yml: TRL's `trl sft --config` recipes and HfArgumentParser.parse_yaml_file's files).
std::map<std::string, std::string> read_config_file(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  const bool yaml = ext == ".yaml" || ext == ".yml";
  const std::string text = read_flag_file(
      "config", path, yaml ? "a YAML file of flag_name: value lines" : "a JSON file of {\"flag_name\": value, ...}");
  json doc;
  if (yaml) {
    doc = parse_yaml_config(text, path);
  } else {
    try {
      doc = json::parse(text, nullptr, true, /*ignore_comments=*/true);
    } catch (const json::exception& e) {
      ALPACA_USAGE_FAIL("--config " << path << " is not valid JSON: " << e.what());
    }
  }
  ALPACA_USAGE_CHECK(doc.is_object(), "--config " << path << " must hold "
                                                  << (yaml ? "a YAML mapping of flag_name: value"
                                                           : "a JSON object {\"flag_name\": value, ...}"));
  std::map<std::string, std::string> values;
  for (const auto& [key, v] : doc.items()) {
    std::string name = key.rfind("--", 0) == 0 ? key.substr(2) : key;
    ALPACA_USAGE_CHECK(name != "config", "config file " << path << ": a config file cannot name another --config");
    std::string flag = canonical_name(name);
    if (!find_train_flag(flag) && is_no_op_hf_field(name, json_value_text(path, name, v))) continue;
    ALPACA_USAGE_CHECK(find_train_flag(flag), unknown_flag_message("config file " + path + ": unknown key", name, "'"));
    // null for a flag whose default is unset (HF/TRL dumps write fsdp: null, deepspeed: null): unset.
    const std::string& default_text = find_train_flag(flag)->default_text;
    if (v.is_null() && (default_text.empty() || default_text == "None")) continue;
    const std::string text = json_value_text(path, name, v);
    // An alias left unset (a dumped transformers 5 config has activation_checkpointing: null next to
    // gradient_checkpointing, or both with one value, as its __post_init__ keeps them in step).
    if (alias_unset_by_null(name, text)) continue;
    if (values.count(flag)) {
      ALPACA_USAGE_CHECK(no_op_word(values[flag]) == no_op_word(text),
                         "config file " << path << ": '" << flag << "' is given twice (once as an alias) with "
                                        << "different values: '" << values[flag] << "' and '" << text << "'");
      if (flag == name) values[flag] = text;
      continue;
    }
    values[flag] = text;
  }
  return values;
}

struct CommandLine {
  std::map<std::string, std::string> values;  // flag -> text, aliases resolved
  std::string config_path;
};

CommandLine parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{"alpaca-train"};
  app.set_help_flag();      // --help is handled before parsing (train_help lists the groups)
  app.allow_extras();       // collected below into errors that suggest the closest flag
  app.allow_windows_style_options(false);

  std::map<std::string, CLI::Option*> options;  // spelling -> option
  for (const auto& f : train_flags()) {
    CLI::Option* opt = app.add_option("--" + f.name, f.help);
    // A bool may stand bare (--bf16) or take a value (--bf16 True); other flags take one value.
    // --fsdp may stand bare too (HF: nargs="?", const=True, meaning full_shard).
    opt->expected(is_bool_type(f.type) || f.name == "fsdp" ? 0 : 1, 1);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    options[f.name] = opt;
  }
  std::map<std::string, CLI::Option*> negations;  // HF adds --no_<flag> for booleans that default to True
  for (const auto& f : train_flags()) {
    if (f.type == FlagType::kBool && f.default_text == "True") negations[f.name] = app.add_flag("--no_" + f.name);
  }
  for (const auto& [alias, target] : train_flag_aliases()) {
    CLI::Option* opt = app.add_option("--" + alias);
    opt->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    options[alias] = opt;
  }
  std::string config_path;
  app.add_option("--config", config_path);

  // HfArgumentParser also takes every flag spelled with '-' (--learning-rate, --no-save-safetensors).
  std::vector<std::string> reversed;  // CLI11 consumes from the back
  // CLI11 reports a bare flag (--bf16) as an empty result, so an empty argument ("" from a
  // script's unset variable) travels as a marker and becomes "" again below.
  static const std::string kEmptyValue = "\x01(empty)";
  // The list-typed flags (HfArgumentParser/TRL: nargs="+") take every word up to the next flag:
  // `--lora_target_modules q_proj v_proj` is the list "q_proj v_proj", as a quoted value is.
  static const std::set<std::string> kListFlags = {"--lora_target_modules", "--lora_modules_to_save", "--report_to"};
  std::vector<std::string> args;
  for (size_t i = 0; i < argv.size(); ++i) {
    args.push_back(argv[i].empty() ? kEmptyValue : underscore_flag_spelling(argv[i]));
    if (!kListFlags.count(args.back())) continue;
    std::string words;
    for (; i + 1 < argv.size() && !argv[i + 1].empty() && argv[i + 1][0] != '-'; ++i)
      words += (words.empty() ? "" : " ") + argv[i + 1];
    if (!words.empty()) args.push_back(words);
  }
  for (auto it = args.rbegin(); it != args.rend(); ++it) reversed.push_back(*it);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // CLI11 says "--learning_rate: 1 required TEXT missing"; say it in our words.
    std::string what = e.what();
    if (what.find("required") != std::string::npos && what.find("missing") != std::string::npos && what.find(':') != std::string::npos) {
      ALPACA_USAGE_FAIL(what.substr(0, what.find(':')) << " needs a value, e.g. " << what.substr(0, what.find(':')) << " VALUE");
    }
    ALPACA_USAGE_FAIL(what);
  }

  // CLI11 hands a following "--flag" to an option that takes a value; never take a flag as a value.
  // Checked before the leftovers: `--learning_rate --max_steps 2` leaves "2" over, and the missing
  // value is what to name.
  for (const auto& [spelling, opt] : options)
    for (const auto& r : opt->results())
      ALPACA_USAGE_CHECK(r.rfind("--", 0) != 0, "--" << spelling << " needs a value, but the next argument is the flag "
                                                     << r << "; give --" << spelling << " VALUE");

  const std::vector<std::string> extras = app.remaining();
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& extra = extras[i];
    if (extra.rfind("-", 0) == 0) {
      std::string name = extra.substr(extra.find_first_not_of('-'));
      const size_t eq = name.find('=');
      // An HF/TRL field we do not take, given a value that asks for nothing: dropped with it.
      const bool has_next = i + 1 < extras.size() && extras[i + 1].rfind("-", 0) != 0;
      const std::string value = eq != std::string::npos ? name.substr(eq + 1)
                                : has_next ? (extras[i + 1] == kEmptyValue ? std::string() : extras[i + 1])
                                           : std::string("true");
      name = name.substr(0, eq);
      if (is_no_op_hf_field(name, value)) {
        if (eq == std::string::npos && has_next) ++i;
        continue;
      }
      ALPACA_USAGE_FAIL(unknown_flag_message("unknown flag", name, "--"));
    }
    ALPACA_USAGE_FAIL("unexpected argument '" << (extra == kEmptyValue ? std::string() : extra) << "': every value belongs to a --flag; quote values "
                      "that hold spaces, e.g. --fsdp \"full_shard auto_wrap\"");
  }

  CommandLine cl;
  cl.config_path = config_path;
  // One flag given under two names (an alias and its flag, or two aliases): name them, aliases first.
  std::map<std::string, std::vector<std::string>> spellings;
  for (const auto& [spelling, opt] : options)
    if (opt->count() != 0) spellings[canonical_name(spelling)].push_back(spelling);
  for (auto& [flag, names] : spellings) {
    std::stable_partition(names.begin(), names.end(), [&, f = flag](const std::string& n) { return n != f; });
    ALPACA_USAGE_CHECK(names.size() == 1, "--" << names[0] << " and --" << names[1]
                                                << " are the same flag; give only --" << flag);
  }
  for (const auto& [spelling, opt] : options) {
    if (opt->count() == 0) continue;
    std::string flag = canonical_name(spelling);
    const auto& results = opt->results();
    if (!results.empty() && alias_unset_by_null(spelling, results.back())) continue;  // an alias left unset
    // A bare flag (--bf16, --fsdp) means true; an empty value ("" from a script's unset variable)
    // stays empty, as in HfArgumentParser: --resume_from_checkpoint "" does not resume.
    cl.values[flag] = results.empty() || results.back().empty() ? "true"
                      : results.back() == kEmptyValue               ? std::string()
                                                                    : results.back();
  }
  for (const auto& [flag, opt] : negations) {
    if (opt->count() == 0) continue;
    ALPACA_USAGE_CHECK(!cl.values.count(flag), "--" << flag << " and --no_" << flag << " contradict; give one");
    cl.values[flag] = "false";
  }
  return cl;
}

}  // namespace

TrainArgs parse_train_args(const std::vector<std::string>& argv, const dist::LaunchInfo& launch) {
  CommandLine cl = parse_command_line(argv);
  TrainArgs args;
  if (!cl.config_path.empty()) {
    args.config_path = cl.config_path;
    for (const auto& [flag, text] : read_config_file(cl.config_path)) {
      try {
        set_flag_from_text(args, flag, text);
      } catch (const UsageError& e) {
        ALPACA_USAGE_FAIL("config file " << cl.config_path << ": " << e.message());
      }
      args.explicit_flags.insert(flag);
    }
  }
  for (const auto& [flag, text] : cl.values) {  // the command line wins over the config file
    set_flag_from_text(args, flag, text);
    args.explicit_flags.insert(flag);
    args.command_line_flags.insert(flag);
  }
  validate_train_args(args, launch);
  return args;
}

bool wants_help(const std::vector<std::string>& argv) {
  return std::any_of(argv.begin(), argv.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
}

}  // namespace alpaca::cli
