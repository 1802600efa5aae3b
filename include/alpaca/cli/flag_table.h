// The flag table behind TrainArgs, built from train_flags.inc: each flag's name, group, type,
// default and help, and typed access to its field by name. Parsing, --config, --help, printing
// and the JSON dump all walk this one table, so a flag added to train_flags.inc appears in each.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "alpaca/cli/train_args.h"

namespace alpaca::cli {

enum class FlagType { kBool, kInt, kDouble, kString, kOptBool, kOptInt, kOptDouble };

struct FlagInfo {
  std::string name;
  FlagGroup group;
  FlagType type;
  std::string help;
  std::string default_text;  // the default as printed ("None" for an unset optional)
};

// Every flag, in declaration order.
const std::vector<FlagInfo>& train_flags();
// The flag named `name`, or nullptr.
const FlagInfo* find_train_flag(const std::string& name);
// Other spellings accepted for a flag (HF's deprecated evaluation_strategy, ...): alias -> name.
const std::vector<std::pair<std::string, std::string>>& train_flag_aliases();

std::string group_title(FlagGroup g);
std::string type_name(FlagType t);   // "bool", "int", "float", "str", "bool|None", ...
bool is_bool_type(FlagType t);

// Sets the field of flag `name` from its command-line text. Booleans take True/False/true/false/
// 1/0 (and yes/no); optionals take None. Throws UsageError naming the flag and the expected type.
void set_flag_from_text(TrainArgs& args, const std::string& name, const std::string& text);
// The field of flag `name` as text, as it would be given on the command line ("None" if unset).
std::string flag_value_text(const TrainArgs& args, const std::string& name);

// Parses the boolean forms the CLI accepts; nullopt when `text` is none of them.
std::optional<bool> parse_bool_text(const std::string& text);

// The text of the file a flag names (--config, --deepspeed, --fsdp_config); a usage error naming
// the flag when it is missing, unreadable or a directory. `what` says what it should be.
std::string read_flag_file(const std::string& flag, const std::string& path, const std::string& what);

// A command-line argument with a flag's '-' turned into '_' ("--learning-rate=1" ->
// "--learning_rate=1"), as HfArgumentParser accepts both; anything else (values, "--") unchanged.
std::string underscore_flag_spelling(const std::string& arg);

// The known name closest to `unknown` by edit distance, or "" if none is plausibly meant.
std::string closest_name(const std::string& unknown, const std::vector<std::string>& known);

}  // namespace alpaca::cli
