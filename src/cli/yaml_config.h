// --config FILE.yaml / FILE.yml: the YAML config files of TRL's CLI (`trl sft --config recipe.yaml`)
// and HfArgumentParser.parse_yaml_file, as JSON for the --config reader (parse_train_args.cpp).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace alpaca::cli {

// The YAML document in `text` as JSON, as PyYAML's safe_load reads it: parsed by libyaml (the
// parser under PyYAML's CSafeLoader) and plain scalars resolved by SafeLoader's YAML 1.1 rules
// (yes/no/on/off/true/false are booleans, ~/null/empty are None, integers with _, 0x, 0b or a
// leading 0, floats with a dot, .inf, .nan); quoted scalars stay strings. One step past PyYAML: a
// plain scalar that is a whole number in C's syntax ("2e-5", which PyYAML leaves a string and
// argparse converts later) is a number, so it also works inside the JSON-valued flags
// (lr_scheduler_kwargs). `path` names the file in errors (cli::UsageError): invalid YAML with its
// line and column, several documents, a non-string key, a key given twice.
nlohmann::json parse_yaml_config(const std::string& text, const std::string& path);

}  // namespace alpaca::cli
