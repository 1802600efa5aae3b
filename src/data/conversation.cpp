// Dataset rows -> ConversationRow: format detection and the normalisation of each format's
// messages into role/content messages that chat templates render.
#include "alpaca/data/conversation.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "alpaca/util/error.h"
#include "conversation_rows.h"

namespace alpaca::data {
namespace {

// transformers passes any role to the template; these are the ones real templates render
// (developer: gpt-oss / OpenAI; ipython: Llama-3.1's tool output). Others are likely typos.
constexpr const char* kRoles = "system, developer, user, assistant, tool, ipython";

bool is_known_role(const std::string& r) {
  return r == "system" || r == "user" || r == "assistant" || r == "tool" || r == "developer" || r == "ipython";
}

// Object members that are null are dropped at every level: Arrow and Parquet cannot say "absent"
// (a struct holds null where a JSON object had no key), so the same row must normalise the same
// from JSON and from Arrow. Array elements stay.
void drop_nulls(Row& v) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end();) {
      if (it->is_null()) {
        it = v.erase(it);
      } else {
        drop_nulls(*it);
        ++it;
      }
    }
  } else if (v.is_array()) {
    for (auto& e : v) drop_nulls(e);
  }
}

}  // namespace

// `tools` as a list (a JSON string holding the list, as LLaMA-Factory stores it, is parsed).
Row normalise_tools(const Row& tools, const std::string& where) {
  Row out = tools;
  if (tools.is_string()) {
    try {
      out = Row::parse(tools.get<std::string>());
    } catch (const Row::exception& e) {
      ALPACA_FAIL(where << ": \"tools\" is a string that is not JSON (" << e.what()
                        << "); give a list of tool schemas or its JSON text");
    }
  }
  ALPACA_CHECK(out.is_array(), where << ": \"tools\" is a " << out.type_name()
                                     << ", expected a list of tool (function) schemas");
  drop_nulls(out);
  return out;
}

namespace {

// apply_chat_template's own parameters and the variables the trainer sets: a row's
// chat_template_kwargs cannot set them (transformers would take them as arguments, not variables).
bool is_reserved_template_kwarg(const std::string& key) {
  for (const char* k : {"messages", "conversation", "add_generation_prompt", "continue_final_message", "chat_template",
                        "tokenize", "return_dict", "return_assistant_tokens_mask", "padding", "truncation",
                        "max_length", "return_tensors", "tokenizer_kwargs"})
    if (key == k) return true;
  return false;
}

}  // namespace

void add_template_variables(const Row& row, Row& ctx, const std::string& where) {
  if (const Row* tools = member(row, "tools")) ctx["tools"] = normalise_tools(*tools, where);
  const Row* kwargs = member(row, "chat_template_kwargs");
  if (!kwargs) return;
  ALPACA_CHECK(kwargs->is_object(), where << ": \"chat_template_kwargs\" is a " << kwargs->type_name()
                                          << ", expected an object of template variables (e.g. {\"enable_thinking\": "
                                             "false})");
  for (const auto& [key, value] : kwargs->items()) {
    // A null member is absent, as everywhere (Arrow structs), except that TRL's merge
    // {"tools": row tools, **chat_template_kwargs} lets a null "tools" there take the row's away.
    if (value.is_null()) {
      if (key == "tools") ctx.erase("tools");
      continue;
    }
    ALPACA_CHECK(!is_reserved_template_kwarg(key),
                 where << ": \"chat_template_kwargs\" sets \"" << key
                       << "\", which is not a template variable: the trainer sets it (the messages from the row, "
                          "add_generation_prompt where a prompt ends, the template from the model or "
                          "--chat_template); remove it from the row");
    if (key == "tools") {
      ctx["tools"] = normalise_tools(value, where);
    } else {
      Row v = value;
      drop_nulls(v);
      ctx[key] = std::move(v);
    }
  }
}

std::string row_template_variables_json(const std::string& row_json, const std::string& where) {
  const Row row = Row::parse(row_json);
  ALPACA_CHECK(row.is_object(), where << " is a " << row.type_name() << ", expected an object");
  Row vars = Row::object();
  add_template_variables(row, vars, where);
  return vars.dump();
}

Row make_message(const std::string& role, const Row* content, const Row& src,
                 std::initializer_list<const char*> skip, const std::string& where, char* train) {
  ALPACA_CHECK(is_known_role(role), where << ": unknown role \"" << role << "\"; known roles: "
                                          << kRoles);
  Row m = Row::object();
  m["role"] = role;
  if (content) {
    ALPACA_CHECK(content->is_string() || content->is_array(),
                 where << ": \"content\" is a " << content->type_name()
                       << ", expected a string (or a list of content parts)");
    m["content"] = *content;
    drop_nulls(m["content"]);
  }
  *train = 1;
  for (auto it = src.begin(); it != src.end(); ++it) {
    const std::string& key = it.key();
    if (it->is_null() || std::find_if(skip.begin(), skip.end(), [&](const char* s) {
                           return key == s;
                         }) != skip.end())
      continue;
    if (key == "train") {
      ALPACA_CHECK(it->is_boolean(), where << ": \"train\" is a " << it->type_name()
                                           << ", expected true or false");
      *train = it->get<bool>() ? 1 : 0;
      continue;
    }
    m[key] = *it;
    drop_nulls(m[key]);
  }
  const bool has_calls = m.contains("tool_calls");
  ALPACA_CHECK(content || (role == "assistant" && has_calls),
               where << (role == "assistant" ? ": an assistant turn with no content (and no tool_calls); "
                                               "give it a \"content\" or drop the message"
                                             : ": message has no \"content\"; every " + role +
                                                   " message needs one"));
  return m;
}

std::string row_where(const std::string& name, int64_t index) {
  return name + ": row " + std::to_string(index);
}

namespace {

// OpenAI / TRL messages: [{role, content, ...}].
void append_openai_messages(const Row& list, const std::string& where, const char* field,
                            Row& messages, std::vector<char>& train) {
  ALPACA_CHECK(list.is_array(), where << ": \"" << field << "\" is a " << list.type_name()
                                      << ", expected a list of {role, content} messages");
  for (size_t j = 0; j < list.size(); ++j) {
    const std::string mw = where + ", " + field + "[" + std::to_string(j) + "]";
    const Row& src = list[j];
    ALPACA_CHECK(src.is_object(), mw << " is a " << src.type_name()
                                     << ", expected an object {role, content}");
    const Row* role = member(src, "role");
    ALPACA_CHECK(role, mw << ": message has no \"role\" (one of " << kRoles << ")");
    ALPACA_CHECK(role->is_string(), mw << ": \"role\" is a " << role->type_name()
                                       << ", expected a string (one of " << kRoles << ")");
    char t = 1;
    messages.push_back(make_message(role->get<std::string>(), member(src, "content"), src,
                                    {"role", "content"}, mw, &t));
    train.push_back(t);
  }
}

ConversationRow messages_row(const Row& row, const std::string& name, int64_t index) {
  const std::string where = row_where(name, index);
  const Row* list = member(row, "messages");
  ALPACA_CHECK(list, where << " has no \"messages\" field; every row of a messages dataset needs "
                              "one ([{role, content}, ...])");
  ConversationRow r;
  r.format = DatasetFormat::kMessages;
  Row ctx = Row::object();
  ctx["messages"] = Row::array();
  append_openai_messages(*list, where, "messages", ctx["messages"], r.train_message);
  ALPACA_CHECK(!ctx["messages"].empty(), where << ": \"messages\" is empty");
  add_template_variables(row, ctx, where);
  r.conversation_json = ctx.dump();
  return r;
}

ConversationRow prompt_completion_row(const Row& row, const std::string& name, int64_t index) {
  const std::string where = row_where(name, index);
  const Row* prompt = member(row, "prompt");
  const Row* completion = member(row, "completion");
  ALPACA_CHECK(prompt && completion, where << " has no \"" << (prompt ? "completion" : "prompt")
                                           << "\" field; every prompt-completion row needs both");
  ConversationRow r;
  r.format = DatasetFormat::kPromptCompletion;
  if (prompt->is_string() && completion->is_string()) {
    r.prompt = prompt->get<std::string>();
    r.completion = completion->get<std::string>();
    return r;
  }
  ALPACA_CHECK(prompt->is_array() && completion->is_array(),
               where << ": \"prompt\" is a " << prompt->type_name() << " and \"completion\" a "
                     << completion->type_name()
                     << "; give both as strings or both as lists of {role, content} messages");
  Row ctx = Row::object();
  ctx["messages"] = Row::array();
  append_openai_messages(*prompt, where, "prompt", ctx["messages"], r.train_message);
  r.num_prompt_messages = static_cast<int64_t>(ctx["messages"].size());
  append_openai_messages(*completion, where, "completion", ctx["messages"], r.train_message);
  ALPACA_CHECK(static_cast<int64_t>(ctx["messages"].size()) > r.num_prompt_messages,
               where << ": \"completion\" is an empty list; it needs the assistant's message");
  add_template_variables(row, ctx, where);
  r.conversation_json = ctx.dump();
  return r;
}

// TRL's language-modelling row: {"text": "..."}, or the field --dataset_text_field names.
ConversationRow text_row(const Row& row, const std::string& field, const std::string& name, int64_t index) {
  const std::string where = row_where(name, index);
  const Row* text = member(row, field.c_str());
  ALPACA_CHECK(text, where << " has no \"" << field << "\" field; every row of a text dataset needs one"
                           << (field == "text" ? "" : " (--dataset_text_field)"));
  ALPACA_CHECK(text->is_string(), where << ": \"" << field << "\" is a " << text->type_name() << ", expected a string");
  ConversationRow r;
  r.format = DatasetFormat::kText;
  r.completion = text->get<std::string>();
  return r;
}

// A list of integers (ids, labels) or of 0/1 flags (masks; true/false too) of a tokenized row.
std::vector<int64_t> int_list(const Row& row, const char* key, const std::string& where) {
  const Row* v = member(row, key);
  ALPACA_CHECK(v && v->is_array(), where << ": \"" << key << "\" is " << (v ? std::string("a ") + v->type_name() : "missing")
                                         << ", expected a list of integers");
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (const Row& x : *v) {
    ALPACA_CHECK(x.is_number_integer() || x.is_boolean(),
                 where << ": \"" << key << "\"[" << out.size() << "] is a " << x.type_name() << ", expected an integer");
    out.push_back(x.is_boolean() ? (x.get<bool>() ? 1 : 0) : x.get<int64_t>());
  }
  return out;
}

// A row already tokenized (TRL: "input_ids" in the dataset's columns, tokenization skipped):
// {input_ids, labels?, completion_mask?, assistant_masks?}. Ids are checked against the
// tokenizer's vocabulary later, where it is known (conversation_example).
ConversationRow tokenized_row(const Row& row, const std::string& name, int64_t index) {
  const std::string where = row_where(name, index);
  for (const char* packed : {"seq_lengths", "position_ids"})
    ALPACA_CHECK(!member(row, packed), where << " has \"" << packed << "\": rows packed beforehand are not read; "
                                             "give the unpacked rows and --packing True");
  ConversationRow r;
  r.format = DatasetFormat::kTokenized;
  r.own_columns = (member(row, "prompt") ? 1 : 0) | (member(row, "completion") ? 2 : 0);
  r.token_ids = int_list(row, "input_ids", where);
  ALPACA_CHECK(!r.token_ids.empty(), where << ": \"input_ids\" is empty");
  const auto n = r.token_ids.size();
  for (size_t i = 0; i < n; ++i)
    ALPACA_CHECK(r.token_ids[i] >= 0, where << ": \"input_ids\"[" << i << "] is " << r.token_ids[i] << ", a negative id");
  if (member(row, "labels")) {
    r.token_labels = int_list(row, "labels", where);
    ALPACA_CHECK(r.token_labels.size() == n, where << ": \"labels\" has " << r.token_labels.size()
                                                   << " entries and \"input_ids\" " << n << "; give one per token");
    for (size_t i = 0; i < n; ++i)
      ALPACA_CHECK(r.token_labels[i] >= 0 || r.token_labels[i] == -100,
                   where << ": \"labels\"[" << i << "] is " << r.token_labels[i] << "; a label is an id or -100");
  }
  for (auto [key, mask] : {std::pair{"completion_mask", &r.completion_mask}, {"assistant_masks", &r.assistant_masks}}) {
    if (!member(row, key)) continue;
    const std::vector<int64_t> bits = int_list(row, key, where);
    ALPACA_CHECK(bits.size() == n, where << ": \"" << key << "\" has " << bits.size() << " entries and \"input_ids\" "
                                         << n << "; give one per token");
    for (size_t i = 0; i < n; ++i) {
      ALPACA_CHECK(bits[i] == 0 || bits[i] == 1, where << ": \"" << key << "\"[" << i << "] is " << bits[i]
                                                       << ", expected 0 or 1");
      mask->push_back(static_cast<char>(bits[i]));
    }
  }
  return r;
}

ConversationRow alpaca_row(const Row& row, const std::string& name, int64_t index) {
  ConversationRow r;
  r.format = DatasetFormat::kAlpaca;
  r.alpaca = alpaca_record_from_row(row, name, index);
  return r;
}

}  // namespace

DatasetFormat detect_format(const Row& first, const std::string& name, const std::string& text_field) {
  ALPACA_CHECK(first.is_object(), name << ": record 0 is a " << first.type_name()
                                       << ", expected an object (a dataset row); known formats: "
                                       << kFormatFields);
  // TRL's SFTTrainer: a dataset with an input_ids column is already processed; its other fields are not read.
  if (member(first, "input_ids")) return DatasetFormat::kTokenized;
  if (member(first, "messages")) return DatasetFormat::kMessages;
  if (member(first, "conversations")) return DatasetFormat::kShareGpt;
  if (member(first, "prompt") || member(first, "completion")) return DatasetFormat::kPromptCompletion;
  if (first.contains("instruction") || first.contains("output")) return DatasetFormat::kAlpaca;
  // After Alpaca: the hub's tatsu-lab/alpaca rows carry a formatted "text" beside their fields.
  if (member(first, text_field.c_str())) return DatasetFormat::kText;
  std::ostringstream seen;
  for (auto it = first.begin(); it != first.end(); ++it)
    seen << (it == first.begin() ? "" : ", ") << it.key();
  ALPACA_FAIL(name << ": its rows match no dataset format: row 0 has the fields [" << seen.str()
                   << "]; known formats: " << kFormatFields
                   << (text_field == "text" ? "" : " (text rows here: {" + text_field + "})")
                   << " (or name one with --dataset_format; text in another field: --dataset_text_field)");
}

ConversationRow normalise_row(const Row& row, const RowFormat& row_format, const std::string& name,
                              int64_t index) {
  const DatasetFormat format = row_format.format;
  if (format != DatasetFormat::kAlpaca)
    ALPACA_CHECK(row.is_object(), row_where(name, index) << " is a " << row.type_name()
                                                         << ", expected an object");
  ConversationRow r;
  switch (format) {
    case DatasetFormat::kAlpaca: r = alpaca_row(row, name, index); break;
    case DatasetFormat::kMessages: r = messages_row(row, name, index); break;
    case DatasetFormat::kShareGpt: r = sharegpt_row(row, name, index); break;
    case DatasetFormat::kPromptCompletion: r = prompt_completion_row(row, name, index); break;
    case DatasetFormat::kText: r = text_row(row, row_format.text_field, name, index); break;
    case DatasetFormat::kTokenized: r = tokenized_row(row, name, index); break;
    case DatasetFormat::kAuto: ALPACA_FAIL("normalise_row needs a detected format");
  }
  r.source = row_where(name, index);
  return r;
}

void settle_tokenized_columns(std::vector<ConversationRow>& rows, size_t first) {
  unsigned char columns = 0;
  for (size_t i = first; i < rows.size(); ++i) columns |= rows[i].own_columns;
  for (size_t i = first; i < rows.size(); ++i) rows[i].prompt_completion_columns = columns == 3;
}

std::vector<ConversationRow> parse_dataset_rows(const std::string& text, const std::string& name,
                                                const RowFormat& requested) {
  std::vector<ConversationRow> out;
  RowFormat format = requested;
  for_each_json_row(text, name, [&](Row&& row, int64_t index) {
    if (format.format == DatasetFormat::kAuto) format.format = detect_format(row, name, format.text_field);
    out.push_back(normalise_row(row, format, name, index));
  });
  settle_tokenized_columns(out, 0);
  return out;
}

namespace {

// The format `name` stands for ("" and "auto": kAuto), from dataset_format_name's list.
std::optional<DatasetFormat> format_named(const std::string& name) {
  if (name.empty()) return DatasetFormat::kAuto;
  for (int f = static_cast<int>(DatasetFormat::kAuto); f <= static_cast<int>(DatasetFormat::kTokenized); ++f)
    if (name == dataset_format_name(static_cast<DatasetFormat>(f))) return static_cast<DatasetFormat>(f);
  return std::nullopt;
}

}  // namespace

DatasetFormat parse_dataset_format(const std::string& name) {
  const auto format = format_named(name);
  ALPACA_CHECK(format, "unknown dataset format \"" << name << "\"; give auto (detect from the fields) or one of "
                                                   << dataset_format_names());
  return *format;
}

bool is_dataset_format_name(const std::string& name) { return format_named(name).has_value(); }

RowFormat parse_row_format(const std::string& format_name, const std::string& text_field) {
  const auto format = format_named(format_name);
  ALPACA_CHECK(format, "--dataset_format '" << format_name << "' is not a dataset format; give auto or one of "
                                            << dataset_format_names());
  ALPACA_CHECK(!text_field.empty(), "--dataset_text_field is empty; give the field that holds each row's text "
                                    "(TRL's default: text)");
  return RowFormat(*format, text_field);
}

const char* dataset_format_name(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kAuto: return "auto";
    case DatasetFormat::kAlpaca: return "alpaca";
    case DatasetFormat::kMessages: return "messages";
    case DatasetFormat::kShareGpt: return "sharegpt";
    case DatasetFormat::kPromptCompletion: return "prompt_completion";
    case DatasetFormat::kText: return "text";
    case DatasetFormat::kTokenized: return "tokenized";
  }
  return "?";
}

const char* dataset_format_names() { return "alpaca, messages, sharegpt, prompt_completion, text, tokenized"; }

}  // namespace alpaca::data
