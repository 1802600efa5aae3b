// `alpaca-train [train]`: parse and validate the flags, set up rank-aware logging, print the
// effective arguments once, record them in output_dir, then hand over to the trainer.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/cli/commands.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/data/conversation.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/dist/launch.h"
#include "alpaca/model/fused_ops.h"
#include "alpaca/train/run.h"
#include "alpaca/util/cpu_features.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"
#include "alpaca/util/tensor_memory.h"
#include "alpaca/util/user_error.h"

namespace alpaca::cli {
namespace {

namespace fs = std::filesystem;

// HF: passive leaves the library default, which for a trainer's main process is info.
void setup_logging(const TrainArgs& args, int rank) {
  log::Level main_level = log::parse_level(args.log_level);
  log::Level replica_level = log::parse_level(args.log_level_replica);
  if (main_level == log::Level::kPassive) main_level = log::Level::kInfo;
  if (replica_level == log::Level::kPassive) replica_level = log::Level::kWarning;
  log::setup(rank, rank <= 0 ? main_level : replica_level, /*all_ranks_info=*/true);
}

// Written next to the run's outputs so the run can be reproduced (it reads back as --config).
// Temporary name + rename: a reader never sees half a file.
void write_args_json(const TrainArgs& args) {
  fs::path dir = args.output_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  ALPACA_USER_CHECK(!ec, "cannot create --output_dir " << dir << ": " << ec.message());
  fs::path final_path = dir / "training_args.json";
  fs::path tmp_path = dir / "training_args.json.tmp";
  {
    std::ofstream out(tmp_path);
    ALPACA_CHECK(out.good(), "cannot write " << tmp_path << "; check that --output_dir is writable");
    out << train_args_to_json(args);
    ALPACA_CHECK(out.good(), "writing " << tmp_path << " failed (disk full?)");
  }
  fs::rename(tmp_path, final_path, ec);
  ALPACA_CHECK(!ec, "cannot rename " << tmp_path << " to " << final_path << ": " << ec.message());
}

// Conversation files (each file's first row says its format) are rendered and tokenized once here,
// as the trainer will, so a bad row, a template error or an empty loss mask stops the run before
// anything is written to output_dir. Other data (alpaca, or a file whose first row cannot be read)
// is checked by the trainer as before.
void check_conversation_data(const TrainArgs& args, const tokenizer::Tokenizer& tok) {
  const auto format = data::parse_row_format(args.dataset_format, args.dataset_text_field);
  for (const std::string& paths : {args.data_path, args.eval_data_path}) {
    if (paths.empty()) continue;
    const bool packed = args.packing && paths == args.data_path;  // eval data is not packed
    const auto masks = data::run_mask_options(args.assistant_only_loss, args.completion_only_loss,
                                              args.model_max_length, packed, args.packing_strategy);
    const auto files = data::peek_dataset_formats(paths, format);
    const bool conversations = std::any_of(files.begin(), files.end(), [](const auto& f) {
      return f.second != data::DatasetFormat::kAlpaca && f.second != data::DatasetFormat::kAuto;
    });
    if (!conversations) continue;  // alpaca, or a file whose first row is unreadable: the trainer reports it
    data::load_examples(paths, format, tok, args.model_name_or_path, args.chat_template, masks);
  }
}

}  // namespace

int run_train(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    std::cout << train_help();
    return 0;
  }
  // Before the first tensor: every CPU tensor of the run is counted (log lines, OOM caps).
  util::install_counting_cpu_allocator();
  // The launch is read once, here, and passed down (the parser, the runtime).
  dist::LaunchInfo launch = dist::discover_launch();
  const int rank = launch.source == dist::LaunchSource::kSingle ? -1 : launch.rank;
  if (rank >= 0) set_process_rank(rank);  // error messages name the rank from the start
  TrainArgs args = parse_train_args(argv, launch);
  // dist::init's start-up roll call waits this long for every rank (a peer that died is named).
  launch.timeout = std::chrono::seconds(args.ddp_timeout);
  // From here on SIGUSR1/SIGTERM/SIGINT only ask the trainer to save and stop (after its first
  // step when they come during set-up): a scheduler's notice during a long model load is kept,
  // not fatal (the Trainer installs the same handlers, idempotently, and restores the defaults).
  ckpt::install_preemption_handlers();
  setup_logging(args, rank);
  const std::string cpu_name = cpu::model_name();  // reads ALPACA_CPU_ISA: a bad value stops here
  if (rank <= 0) {
    ALPACA_INFO("run " << args.run_name << ": " << format_train_args(args));
    ALPACA_INFO("CPU: " << cpu_name << ", " << std::thread::hardware_concurrency() << " CPUs"
                        << (args.bf16 ? std::string(", packed bf16 GEMM ") + model::cpu_bf16_gemm_backend() : ""));
    for (const auto& note : args.notes) ALPACA_INFO(note);
  }
  check_input_paths(args);  // before anything is written to output_dir
  // The tokenizer self-check (issue 26: an EOS that splits) and the conversation rows, before
  // output_dir is written; the trainer loads the same files the same way.
  {
    tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(args.model_name_or_path, args.use_fast_tokenizer);
    data::prepare_special_tokens(tok, args.data_path, args.eval_data_path,
                                 data::parse_row_format(args.dataset_format, args.dataset_text_field), args.eos_token,
                                 args.pad_token);
    tok.check_special_tokens();
    check_conversation_data(args, tok);
  }
  sys::keep_host_heap();  // before the first large allocation; see sys.h
  train::TrainerOptions options = trainer_options(args);
  // training_args.json once set-up has succeeded (nothing is left behind by a run refused during
  // it), with --auto_find_batch_size's choice when it made one (for reruns and resumes).
  auto written = std::make_shared<TrainArgs>(args);
  options.on_batch_size_found = [written](int64_t micro, int64_t accum) {
    written->per_device_train_batch_size = micro;
    written->gradient_accumulation_steps = accum;
  };
  options.on_ready = [written] {
    write_args_json(*written);
    ALPACA_INFO("wrote " << (fs::path(written->output_dir) / "training_args.json").string());
  };
  return train::run_training(options, launch);
}

}  // namespace alpaca::cli
