// The human- and machine-readable faces of TrainArgs, all generated from the flag table:
// grouped --help, the effective-arguments listing printed at start, and the JSON dump (which
// reads back as a --config file).
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <sstream>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"

namespace alpaca::cli {
namespace {

constexpr FlagGroup kGroupOrder[] = {FlagGroup::kModelData, FlagGroup::kOutput,    FlagGroup::kTraining,
                                     FlagGroup::kOptimizer, FlagGroup::kSchedule,  FlagGroup::kPrecision,
                                     FlagGroup::kParallel,  FlagGroup::kLogging,   FlagGroup::kEval};
constexpr size_t kWrapColumn = 100;

// Word-wraps `text` into lines starting with `indent`.
void wrap(std::ostringstream& os, const std::string& text, const std::string& indent) {
  std::istringstream words(text);
  std::string word, line;
  while (words >> word) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > kWrapColumn) {
      os << indent << line << "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) os << indent << line << "\n";
}

std::string shown_default(const FlagInfo& f) {
  if (f.type == FlagType::kString) return "\"" + f.default_text + "\"";
  return f.default_text;
}

}  // namespace

std::string train_help() {
  std::ostringstream os;
  os << "alpaca-train: fine-tune a Hugging Face LLaMA checkpoint on Alpaca-format instruction data\n"
        "(LibTorch, hand-written FSDP over MPI on CPU / NCCL on GPU).\n\n"
        "Usage:\n"
        "  alpaca-train [train] [--config FILE] --model_name_or_path DIR --data_path FILE [--FLAG VALUE ...]\n"
        "  mpirun -np N alpaca-train ...            (one rank per process; also srun, torchrun-style env)\n"
        "  alpaca-train --nproc_per_node N [--nnodes M --node_rank R --master_addr A --master_port P] <train flags>\n"
        "  alpaca-train init-model ...              (write a randomly initialised LLaMA directory)\n"
        "  alpaca-train preprocess ...              (tokenize a dataset ahead of training)\n"
        "  alpaca-train merge ...                   (merge a LoRA adapter into its base model)\n"
        "  alpaca-train consolidate CHECKPOINT OUT  (a sharded training checkpoint -> an HF model directory)\n"
        "  alpaca-train generate ...                (answer instructions with a model directory)\n"
        "  alpaca-train estimate-memory <train flags> [--num_gpus N ...]  (per-rank memory, no GPU needed)\n"
        "  alpaca-train --version                   (version, git commit, LibTorch version, CPU)\n"
        "  alpaca-train <subcommand> --help         (that subcommand's flags)\n\n"
        "Flags use Hugging Face TrainingArguments names; values follow the flag (--bf16 True, --fsdp \"full_shard\n"
        "auto_wrap\"). Booleans take True/False/true/false/1/0 or stand bare. A value in (0,1) for *_steps means a\n"
        "ratio of the total steps.\n\n"
        "General:\n"
        "  --config FILE\n"
        "      A JSON object {\"flag_name\": value, ...} read before the command line; the command line wins.\n"
        "      training_args.json from an earlier run is a valid config file.\n"
        "  -h, --help\n"
        "      Show this help.\n";
  for (FlagGroup g : kGroupOrder) {
    os << "\n" << group_title(g) << ":\n";
    for (const auto& f : train_flags()) {
      if (f.group != g) continue;
      os << "  --" << f.name << " " << type_name(f.type) << "  (default: " << shown_default(f) << ")\n";
      std::string help = f.help;
      std::string aliases;
      for (const auto& [alias, target] : train_flag_aliases())
        if (target == f.name && help.find("--" + alias) == std::string::npos)
          aliases += (aliases.empty() ? "--" : ", --") + alias;
      if (!aliases.empty()) help += (aliases.find(',') == std::string::npos ? " Alias: " : " Aliases: ") + aliases + ".";
      wrap(os, help, "      ");
    }
  }
  return os.str();
}

std::string format_train_args(const TrainArgs& args) {
  std::ostringstream os;
  os << "effective arguments (* = set on the command line or in " << (args.config_path.empty() ? "--config" : args.config_path)
     << "):\n";
  for (FlagGroup g : kGroupOrder) {
    os << "  [" << group_title(g) << "]\n";
    for (const auto& f : train_flags()) {
      if (f.group != g) continue;
      os << "  " << (args.is_set(f.name) ? "* " : "  ") << f.name << " = " << flag_value_text(args, f.name) << "\n";
    }
  }
  os << "  [derived]\n";
  os << "    fsdp options = " << (args.fsdp_words.empty() ? "(none: full replica per rank)" : args.fsdp_words) << "\n";
  os << "    fsdp_config = " << args.fsdp_config_json << "\n";
  if (args.deepspeed_zero_stage > 0) os << "    deepspeed ZeRO stage = " << args.deepspeed_zero_stage << "\n";
  return os.str();
}

std::string train_args_to_json(const TrainArgs& args) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& f : train_flags()) {
    std::string text = flag_value_text(args, f.name);
    bool none = text == "None" && f.type != FlagType::kString;
    switch (f.type) {
      case FlagType::kBool:
      case FlagType::kOptBool:
        j[f.name] = none ? nlohmann::ordered_json() : nlohmann::ordered_json(text == "True");
        break;
      case FlagType::kInt:
      case FlagType::kOptInt:
        j[f.name] = none ? nlohmann::ordered_json() : nlohmann::ordered_json(std::stoll(text));
        break;
      case FlagType::kDouble:
      case FlagType::kOptDouble:
        j[f.name] = none ? nlohmann::ordered_json() : nlohmann::ordered_json(std::stod(text));
        break;
      case FlagType::kString:
        j[f.name] = text;
        break;
    }
  }
  return j.dump(2) + "\n";
}

}  // namespace alpaca::cli
