// The flags of the subcommands besides train (init-model, preprocess, merge, generate,
// estimate-memory), each declared once in a table: one parser reads it (--flag VALUE, --flag=VALUE,
// bare or True/False booleans), prints --help from it, and turns every mistake (unknown flag, with
// a did-you-mean; missing or bad value; missing required flag; one flag under two of its names)
// into a cli::UsageError, exit 2, as train's own table (train_flags.inc) does.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace alpaca::cli {

struct SubFlag {
  using Target = std::variant<std::string*, int64_t*, int*, uint64_t*, double*, bool*>;
  SubFlag(std::string name_, Target target_, std::string help_, bool required_ = false,
          std::vector<std::string> aliases_ = {})
      : name(std::move(name_)), target(target_), help(std::move(help_)), required(required_),
        aliases(std::move(aliases_)) {}
  std::string name;   // with its dashes: "--config"
  Target target;      // where the value goes; it holds the default before parsing
  std::string help;
  bool required = false;
  std::vector<std::string> aliases;  // other spellings, with their dashes (TRL's "--max_length")
};

struct Subcommand {
  Subcommand(std::string name_, std::string summary_, std::vector<SubFlag> flags_, std::string usage_tail_ = "")
      : name(std::move(name_)), summary(std::move(summary_)), flags(std::move(flags_)),
        usage_tail(std::move(usage_tail_)) {}
  std::string name;     // "init-model"
  std::string summary;  // one line
  std::vector<SubFlag> flags;
  std::string usage_tail;  // what follows the flags in the usage line, e.g. "<the train flags>"
};

struct ParsedFlags {
  bool help = false;                 // --help / -h was given (the help is printed; nothing else ran)
  std::set<std::string> given;       // flags given, by name ("--top_k")
  std::vector<std::string> rest;     // arguments not in the table (only when passing them through)
  bool was_given(const std::string& name) const { return given.count(name) > 0; }
};

// Parses `args` (argv after the subcommand) against `cmd.flags`. With pass_through, arguments the
// table does not name are returned in `rest` in order instead of being an error.
ParsedFlags parse_subcommand_flags(const Subcommand& cmd, const std::vector<std::string>& args,
                                   bool pass_through = false);
// The --help text: usage line, summary, every flag with its type, default and help.
std::string subcommand_help(const Subcommand& cmd);

}  // namespace alpaca::cli
