// ShareGPT rows ({conversations: [{from, value}], system?, tools?}) -> role/content messages.
//
// The tags and their meaning are LLaMA-Factory's defaults (data/README.md, `tags` of
// dataset_info.json; SharegptDatasetConverter in src/llamafactory/data/converter.py):
//   human -> user, gpt -> assistant, system -> system (only as the first message; else the row's
//   `system` column), observation -> tool (a tool's result), function_call -> assistant (a tool
//   call: `value` is JSON {"name", "arguments"} or a list of them, which becomes the
//   transformers-style `tool_calls: [{"type": "function", "function": {name, arguments}}]`).
// As there, after the system message the turns alternate: human/observation at even positions,
// gpt/function_call at odd ones; LLaMA-Factory drops a row that breaks this with a warning, we
// refuse it naming the row (a silently shorter dataset is how masks go wrong unnoticed).
#include "alpaca/util/error.h"
#include "conversation_rows.h"

namespace alpaca::data {
namespace {

constexpr const char* kTags = "human (or user), gpt (or assistant), system, observation, function_call";

// function_call's value -> tool_calls.
Row tool_calls_from(const Row& value, const std::string& where) {
  Row calls;
  try {
    calls = value.is_string() ? Row::parse(value.get<std::string>()) : value;
  } catch (const Row::exception& e) {
    ALPACA_FAIL(where << ": a function_call's value is not JSON (" << e.what()
                      << "); give {\"name\": ..., \"arguments\": {...}} or a list of them");
  }
  if (calls.is_object()) calls = Row::array({calls});
  ALPACA_CHECK(calls.is_array() && !calls.empty(),
               where << ": a function_call's value must be {\"name\", \"arguments\"} or a list of them");
  Row out = Row::array();
  for (const Row& c : calls) {
    ALPACA_CHECK(c.is_object() && c.contains("name") && c["name"].is_string(),
                 where << ": a function call has no \"name\"; give {\"name\": ..., \"arguments\": {...}}");
    Row fn = Row::object();
    fn["name"] = c["name"];
    fn["arguments"] = c.contains("arguments") ? c["arguments"] : Row::object();
    out.push_back(Row{{"type", "function"}, {"function", fn}});
  }
  return out;
}

// One non-system message; `turn` is its position after the system message (alternation rule).
Row sharegpt_message(const Row& src, const std::string& from, size_t turn, const std::string& mw, char* train) {
  // TRL's maybe_convert_to_chatml example writes the roles themselves ("user", "assistant").
  const std::string tag = from == "user" ? "human" : from == "assistant" ? "gpt" : from;
  const Row* value = member(src, "value");
  const bool even = turn % 2 == 0;
  if (tag == "human" || tag == "observation") {
    ALPACA_CHECK(even, mw << ": \"" << tag << "\" where an answer (gpt or function_call) belongs; "
                          "sharegpt turns alternate human/observation with gpt/function_call");
    ALPACA_CHECK(value, mw << ": message has no \"value\"");
    return make_message(tag == "human" ? "user" : "tool", value, src, {"from", "value"}, mw, train);
  }
  if (tag == "gpt" || tag == "function_call") {
    ALPACA_CHECK(!even, mw << ": \"" << tag << "\" where a human or observation turn belongs; "
                           "sharegpt turns alternate human/observation with gpt/function_call");
    if (tag == "gpt") {
      ALPACA_CHECK(value, mw << ": an assistant turn (gpt) with no \"value\"");
      return make_message("assistant", value, src, {"from", "value"}, mw, train);
    }
    ALPACA_CHECK(value, mw << ": a function_call with no \"value\"");
    Row with_calls = src;
    with_calls["tool_calls"] = tool_calls_from(*value, mw);
    return make_message("assistant", nullptr, with_calls, {"from", "value"}, mw, train);
  }
  ALPACA_FAIL(mw << ": unknown role (\"from\") \"" << tag << "\"; known: " << kTags);
}

}  // namespace

ConversationRow sharegpt_row(const Row& row, const std::string& name, int64_t index) {
  const std::string where = row_where(name, index);
  const Row* list = member(row, "conversations");
  ALPACA_CHECK(list, where << " has no \"conversations\" field; every row of a sharegpt dataset needs "
                              "one ([{from, value}, ...])");
  ALPACA_CHECK(list->is_array() && !list->empty(),
               where << ": \"conversations\" must be a non-empty list of {from, value} messages");
  ConversationRow r;
  r.format = DatasetFormat::kShareGpt;
  Row messages = Row::array();
  const Row* system = member(row, "system");
  for (size_t j = 0; j < list->size(); ++j) {
    const std::string mw = where + ", conversations[" + std::to_string(j) + "]";
    const Row& src = (*list)[j];
    ALPACA_CHECK(src.is_object(), mw << " is a " << src.type_name() << ", expected {from, value}");
    const Row* from = member(src, "from");
    ALPACA_CHECK(from && from->is_string(), mw << ": message has no \"from\" string (one of " << kTags << ")");
    if (from->get<std::string>() == "system") {
      ALPACA_CHECK(j == 0, mw << ": a system message is only allowed first (LLaMA-Factory's sharegpt)");
      system = member(src, "value");
      ALPACA_CHECK(system, mw << ": the system message has no \"value\"");
      continue;
    }
    char train = 1;
    messages.push_back(sharegpt_message(src, from->get<std::string>(), messages.size(), mw, &train));
    r.train_message.push_back(train);
  }
  ALPACA_CHECK(!messages.empty(), where << ": \"conversations\" holds only a system message");
  if (system) {
    ALPACA_CHECK(system->is_string(), where << ": \"system\" is a " << system->type_name()
                                            << ", expected a string");
    Row sys = Row{{"role", "system"}, {"content", *system}};
    messages.insert(messages.begin(), sys);
    r.train_message.insert(r.train_message.begin(), 1);
  }
  Row ctx = Row::object();
  ctx["messages"] = std::move(messages);
  add_template_variables(row, ctx, where);
  r.conversation_json = ctx.dump();
  return r;
}

}  // namespace alpaca::data
