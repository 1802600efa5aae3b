// One parser for the subcommands' flag tables; see include/alpaca/cli/subcommand_flags.h.
#include "alpaca/cli/subcommand_flags.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/usage_error.h"

namespace alpaca::cli {
namespace {

const char* type_of(const SubFlag::Target& t) {
  switch (t.index()) {
    case 0: return "str";
    case 1: case 2: case 3: return "int";
    case 4: return "float";
    default: return "bool";
  }
}

std::string default_of(const SubFlag::Target& t) {
  std::ostringstream os;
  std::visit([&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, bool>) os << (*p ? "True" : "False");
    else if constexpr (std::is_same_v<T, std::string>) os << '"' << *p << '"';
    else os << *p;
  }, t);
  return os.str();
}

// Sets `flag` from its text; a usage error naming the flag and the expected type otherwise.
void assign(const Subcommand& cmd, const SubFlag& flag, const std::string& text) {
  auto bad = [&] {
    const std::string type = type_of(flag.target);
    ALPACA_USAGE_FAIL(cmd.name << ": " << flag.name << " needs "
                      << (type == "int" ? "an integer" : type == "float" ? "a number" : "a boolean (True/False)")
                      << ", got '" << text << "' (see alpaca-train " << cmd.name << " --help)");
  };
  std::visit([&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    char* end = nullptr;
    errno = 0;
    if constexpr (std::is_same_v<T, std::string>) {
      *p = text;
    } else if constexpr (std::is_same_v<T, bool>) {
      auto b = parse_bool_text(text);
      if (!b) bad();
      *p = *b;
    } else if constexpr (std::is_same_v<T, double>) {
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || errno != 0) bad();
      *p = v;
    } else {
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno != 0) bad();
      if constexpr (std::is_same_v<T, uint64_t>) {
        if (v < 0) bad();
      }
      *p = static_cast<T>(v);
    }
  }, flag.target);
}

const SubFlag* find(const Subcommand& cmd, const std::string& name) {
  for (const auto& f : cmd.flags) {
    if (f.name == name) return &f;
    for (const auto& a : f.aliases)
      if (a == name) return &f;
  }
  return nullptr;
}

}  // namespace

ParsedFlags parse_subcommand_flags(const Subcommand& cmd, const std::vector<std::string>& args, bool pass_through) {
  ParsedFlags out;
  std::map<std::string, std::string> spelled;  // flag -> the name it was given under
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = underscore_flag_spelling(args[i]), value;
    const size_t eq = name.find('=');
    const bool inline_value = name.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "--help" || name == "-h") {
      std::cout << subcommand_help(cmd);
      out.help = true;
      return out;
    }
    const SubFlag* flag = find(cmd, name);
    if (!flag) {
      if (pass_through) {
        out.rest.push_back(args[i]);
        continue;
      }
      std::vector<std::string> names;
      for (const auto& f : cmd.flags) {
        names.push_back(f.name);
        names.insert(names.end(), f.aliases.begin(), f.aliases.end());
      }
      const std::string guess = name.rfind("--", 0) == 0 ? closest_name(name, names) : std::string();
      ALPACA_USAGE_FAIL(cmd.name << ": " << (name.rfind("-", 0) == 0 ? "unknown flag " : "unexpected argument ")
                        << args[i] << (guess.empty() ? "" : "; did you mean " + guess + "?")
                        << " (see alpaca-train " << cmd.name << " --help)");
    }
    if (!inline_value) {
      const bool is_bool = std::holds_alternative<bool*>(flag->target);
      if (is_bool && (i + 1 >= args.size() || !parse_bool_text(args[i + 1]))) {
        value = "true";  // a bare boolean flag
      } else {
        ALPACA_USAGE_CHECK(i + 1 < args.size(),
                           cmd.name << ": " << name << " needs a value (see alpaca-train " << cmd.name << " --help)");
        value = args[++i];
      }
    }
    // One flag under two of its names: say which, aliases first (as train does).
    const auto [it, first_time] = spelled.emplace(flag->name, name);
    if (!first_time && it->second != name) {
      const std::string& a = it->second == flag->name ? name : it->second;
      const std::string& b = it->second == flag->name ? it->second : name;
      ALPACA_USAGE_FAIL(cmd.name << ": " << a << " and " << b << " are the same flag; give only " << flag->name);
    }
    assign(cmd, *flag, value);
    out.given.insert(flag->name);
  }
  for (const auto& f : cmd.flags)
    ALPACA_USAGE_CHECK(!f.required || out.given.count(f.name),
                       cmd.name << ": " << f.name << " is required (see alpaca-train " << cmd.name << " --help)");
  return out;
}

std::string subcommand_help(const Subcommand& cmd) {
  std::ostringstream os;
  os << "Usage: alpaca-train " << cmd.name;
  for (const auto& f : cmd.flags)
    if (f.required) os << " " << f.name << " " << type_of(f.target);
  os << " [options]" << (cmd.usage_tail.empty() ? "" : " " + cmd.usage_tail) << "\n\n" << cmd.summary << "\n\nFlags:\n";
  for (const auto& f : cmd.flags) {
    os << "  " << f.name << " " << type_of(f.target);
    if (f.required) os << "  (required)";
    else os << "  (default: " << default_of(f.target) << ")";
    os << "\n      " << f.help;
    for (size_t i = 0; i < f.aliases.size(); ++i)
      os << (i ? ", " : (f.help.empty() || f.help.back() == '.' ? " " : ". ")) << (i ? "" : f.aliases.size() == 1 ? "Alias: " : "Aliases: ")
         << f.aliases[i];
    os << (f.aliases.empty() ? "" : ".") << "\n";
  }
  os << "  -h, --help\n      Show this help.\n";
  return os.str();
}

}  // namespace alpaca::cli
