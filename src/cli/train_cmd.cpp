// `alpaca-train [train]`: parse and validate the flags, set up rank-aware logging, print the
// effective arguments once, record them in output_dir, then hand over to the trainer.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/dist/launch.h"
#include "alpaca/train/run.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"

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
  ALPACA_CHECK(!ec, "cannot create --output_dir " << dir << ": " << ec.message());
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

}  // namespace

int run_train(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    std::cout << train_help();
    return 0;
  }
  // The launch is read once, here, and passed down (the parser, the runtime).
  const dist::LaunchInfo launch = dist::discover_launch();
  const int rank = launch.source == dist::LaunchSource::kSingle ? -1 : launch.rank;
  if (rank >= 0) set_process_rank(rank);  // error messages name the rank from the start
  TrainArgs args = parse_train_args(argv, launch);
  setup_logging(args, rank);
  if (rank <= 0) {
    ALPACA_INFO("run " << args.run_name << ": " << format_train_args(args));
    for (const auto& note : args.notes) ALPACA_INFO(note);
  }
  check_input_paths(args);  // before anything is written to output_dir
  if (rank <= 0) {
    write_args_json(args);
    ALPACA_INFO("wrote " << (fs::path(args.output_dir) / "training_args.json").string());
  }
  sys::keep_host_heap();  // before the first large allocation; see sys.h
  return train::run_training(trainer_options(args), launch);
}

}  // namespace alpaca::cli
