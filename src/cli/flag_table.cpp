// The flag table generated from train_flags.inc and the text <-> field conversions every
// consumer (CLI, --config, printing, JSON) shares, so a flag parses the same way everywhere.
#include "alpaca/cli/flag_table.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <variant>

#include "alpaca/cli/usage_error.h"
#include "alpaca/util/text.h"

namespace alpaca::cli {
namespace {

using FieldPtr = std::variant<bool*, int64_t*, double*, std::string*, OptBool*, OptInt*, OptDouble*>;

template <class T> constexpr FlagType type_of();
template <> constexpr FlagType type_of<bool>() { return FlagType::kBool; }
template <> constexpr FlagType type_of<int64_t>() { return FlagType::kInt; }
template <> constexpr FlagType type_of<double>() { return FlagType::kDouble; }
template <> constexpr FlagType type_of<std::string>() { return FlagType::kString; }
template <> constexpr FlagType type_of<OptBool>() { return FlagType::kOptBool; }
template <> constexpr FlagType type_of<OptInt>() { return FlagType::kOptInt; }
template <> constexpr FlagType type_of<OptDouble>() { return FlagType::kOptDouble; }

struct Entry {
  FlagInfo info;
  FieldPtr (*field)(TrainArgs&);
};

std::string format_double(double v) {
  // The shortest text that reads back to the same double (2e-05, not 2.0000000000000002e-05).
  char buf[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // Keep floats recognisable as floats: 3 -> 3.0 (as Python prints them).
  if (std::isfinite(v) && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string field_text(FieldPtr field) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *p ? "True" : "False";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(*p);
        } else if constexpr (std::is_same_v<T, double>) {
          return format_double(*p);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, OptBool>) {
          return p->has_value() ? (**p ? "True" : "False") : "None";
        } else if constexpr (std::is_same_v<T, OptInt>) {
          return p->has_value() ? std::to_string(**p) : "None";
        } else {
          return p->has_value() ? format_double(**p) : "None";
        }
      },
      field);
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = [] {
    std::vector<Entry> t = {
#define ALPACA_FLAG(group, type, name, default_value, help) \
  Entry{FlagInfo{#name, FlagGroup::group, type_of<type>(), help, ""}, [](TrainArgs& a) -> FieldPtr { return &a.name; }},
#include "alpaca/cli/train_flags.inc"
#undef ALPACA_FLAG
    };
    TrainArgs defaults;
    for (auto& e : t) e.info.default_text = field_text(e.field(defaults));
    return t;
  }();
  return table;
}

const Entry& entry(const std::string& name) {
  for (const auto& e : entries()) {
    if (e.info.name == name) return e;
  }
  ALPACA_USAGE_FAIL("internal: no flag named --" << name);
}

bool is_none_text(const std::string& text) { return text == "None" || text == "none" || text == "null"; }

int64_t parse_int(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  ALPACA_USAGE_CHECK(!text.empty() && end && *end == '\0' && errno == 0,
                     "--" << name << " expects an integer, got '" << text << "'");
  return static_cast<int64_t>(v);
}

double parse_double(const std::string& name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  ALPACA_USAGE_CHECK(!text.empty() && end && *end == '\0' && errno == 0 && std::isfinite(v),
                     "--" << name << " expects a number, got '" << text << "'");
  return v;
}

bool parse_bool(const std::string& name, const std::string& text) {
  auto b = parse_bool_text(text);
  ALPACA_USAGE_CHECK(b.has_value(), "--" << name << " expects a boolean (True/False, true/false, 1/0), got '"
                                         << text << "'");
  return *b;
}

}  // namespace

namespace detail {
void throw_usage_error(const char* file, int line, const std::string& msg) { throw UsageError(file, line, msg); }
}  // namespace detail

const std::vector<FlagInfo>& train_flags() {
  static const std::vector<FlagInfo> infos = [] {
    std::vector<FlagInfo> v;
    for (const auto& e : entries()) v.push_back(e.info);
    return v;
  }();
  return infos;
}

const FlagInfo* find_train_flag(const std::string& name) {
  for (const auto& f : train_flags()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const std::vector<std::pair<std::string, std::string>>& train_flag_aliases() {
  // evaluation_strategy: HF's name until v4.46, used verbatim by the Alpaca README. max_length:
  // TRL SFTConfig's name of the sequence length (max_seq_length until TRL 0.20), so TRL commands
  // and configs run as they are (the default stays train.py's 512, not SFTConfig's 1024).
  // chat_template_path: SFTConfig's, a Jinja file (a tokenizer directory there clones its template
  // and special tokens: refused, --chat_template must be a file).
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"evaluation_strategy", "eval_strategy"},
      {"max_length", "model_max_length"},
      {"max_seq_length", "model_max_length"},
      {"chat_template_path", "chat_template"},  // TRL SFTConfig's name (a Jinja file)
      // transformers 5's names (gradient_checkpointing is deprecated there); null = unset.
      {"activation_checkpointing", "gradient_checkpointing"},
      {"activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"}};
  return aliases;
}

std::string group_title(FlagGroup g) {
  switch (g) {
    case FlagGroup::kModelData: return "Model and data";
    case FlagGroup::kOutput: return "Output and checkpoints";
    case FlagGroup::kTraining: return "Training length and batches";
    case FlagGroup::kOptimizer: return "Optimizer";
    case FlagGroup::kSchedule: return "Learning-rate schedule";
    case FlagGroup::kPrecision: return "Precision";
    case FlagGroup::kParallel: return "Distributed and sharding (FSDP / DeepSpeed)";
    case FlagGroup::kLogging: return "Logging";
    case FlagGroup::kEval: return "Evaluation";
  }
  return "Other";
}

std::string type_name(FlagType t) {
  switch (t) {
    case FlagType::kBool: return "bool";
    case FlagType::kInt: return "int";
    case FlagType::kDouble: return "float";
    case FlagType::kString: return "str";
    case FlagType::kOptBool: return "bool|None";
    case FlagType::kOptInt: return "int|None";
    case FlagType::kOptDouble: return "float|None";
  }
  return "?";
}

bool is_bool_type(FlagType t) { return t == FlagType::kBool || t == FlagType::kOptBool; }

std::optional<bool> parse_bool_text(const std::string& text) { return text::parse_bool_text(text); }

void set_flag_from_text(TrainArgs& args, const std::string& name, const std::string& text) {
  FieldPtr field = entry(name).field(args);
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          *p = parse_bool(name, text);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          *p = parse_int(name, text);
        } else if constexpr (std::is_same_v<T, double>) {
          *p = parse_double(name, text);
        } else if constexpr (std::is_same_v<T, std::string>) {
          *p = text;
        } else if constexpr (std::is_same_v<T, OptBool>) {
          *p = is_none_text(text) ? OptBool{} : OptBool{parse_bool(name, text)};
        } else if constexpr (std::is_same_v<T, OptInt>) {
          *p = is_none_text(text) ? OptInt{} : OptInt{parse_int(name, text)};
        } else if constexpr (std::is_same_v<T, OptDouble>) {
          *p = is_none_text(text) ? OptDouble{} : OptDouble{parse_double(name, text)};
        }
      },
      field);
}

std::string flag_value_text(const TrainArgs& args, const std::string& name) {
  // The accessor takes a non-const TrainArgs; reading through it does not modify.
  return field_text(entry(name).field(const_cast<TrainArgs&>(args)));
}

std::string read_flag_file(const std::string& flag, const std::string& path, const std::string& what) {
  std::error_code ec;
  ALPACA_USAGE_CHECK(!std::filesystem::is_directory(path, ec),
                     "--" << flag << " " << path << " is a directory; give " << what << " (a file)");
  std::ifstream in(path);
  ALPACA_USAGE_CHECK(in.good(), "--" << flag << " " << path << ": cannot open the file; give " << what);
  std::stringstream ss;
  ss << in.rdbuf();
  ALPACA_USAGE_CHECK(!in.bad(), "--" << flag << " " << path << ": cannot read the file");
  return ss.str();
}

std::string underscore_flag_spelling(const std::string& arg) {
  if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0 || arg[2] == '-') return arg;
  std::string out = arg;
  const size_t end = std::min(out.find('='), out.size());
  for (size_t i = 2; i < end; ++i)
    if (out[i] == '-') out[i] = '_';
  return out;
}

std::string closest_name(const std::string& unknown, const std::vector<std::string>& known) {
  return text::closest_name(unknown, known);
}

}  // namespace alpaca::cli
