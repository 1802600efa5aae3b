// Rows of every dataset format -> {input_ids, labels}, TRL SFTTrainer's way (see the header).
#include "alpaca/data/conversation_example.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "alpaca/chat/chat_template.h"
#include "alpaca/data/packing.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"
#include "parallel_for.h"

namespace alpaca::data {
namespace {

using json = nlohmann::ordered_json;  // rows keep their keys in file order, as transformers renders them
using Ranges = std::vector<std::pair<size_t, size_t>>;

struct Span {
  int64_t message = -1;  // index into messages; -1 when not known
  size_t begin = 0, end = 0;
};

// A rendered row: its template context and rendering, its ids and (once with_spans() ran) its
// assistant spans and token ranges.
struct Rendered {
  std::string ctx;
  chat::RenderResult render;
  std::vector<int64_t> ids;
  std::vector<Span> spans;
  Ranges ranges;
  bool has_spans = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t common_prefix_length(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<int64_t>(n);
}

json template_special_tokens(const tokenizer::Tokenizer& tok);

// The template context of `row` with its first `num_messages` messages (all when < 0), as
// transformers passes it: the special tokens, add_generation_prompt, the row's tools and
// chat_template_kwargs.
std::string context(const ConversationRow& row, int64_t num_messages, bool add_generation_prompt,
                    const tokenizer::Tokenizer& tok) {
  json ctx = json::parse(row.conversation_json);
  if (num_messages >= 0) {
    json& msgs = ctx["messages"];
    msgs.erase(msgs.begin() + std::min<int64_t>(num_messages, static_cast<int64_t>(msgs.size())), msgs.end());
  }
  ctx["add_generation_prompt"] = add_generation_prompt;
  const json special = template_special_tokens(tok);  // a named local: items() refers to it
  // The row's chat_template_kwargs win over the special tokens (transformers:
  // {**special_tokens_map, **kwargs}).
  for (const auto& [name, token] : special.items())
    if (!ctx.contains(name)) ctx[name] = token;
  return ctx.dump();
}

// The assistant spans of a rendering: its {% generation %} blocks (the k-th block is the k-th
// assistant message), else prefix rendering.
std::vector<Span> assistant_spans(const chat::ChatTemplate& tmpl, const std::string& ctx,
                                  const chat::RenderResult& full, const ConversationRow& row) {
  std::vector<Span> out;
  if (tmpl.has_generation_blocks()) {
    const json msgs = json::parse(row.conversation_json)["messages"];
    std::vector<int64_t> assistant;
    for (size_t i = 0; i < msgs.size(); ++i)
      if (msgs[i].value("role", "") == "assistant") assistant.push_back(static_cast<int64_t>(i));
    const bool matched = assistant.size() == full.generation_spans.size();
    for (size_t k = 0; k < full.generation_spans.size(); ++k)
      out.push_back({matched ? assistant[k] : -1, full.generation_spans[k].first, full.generation_spans[k].second});
    return out;
  }
  for (const auto& s : chat::assistant_char_spans(tmpl, ctx)) out.push_back({static_cast<int64_t>(s.message_index), s.begin, s.end});
  return out;
}

bool any_untrained_message(const ConversationRow& row) {
  return std::find(row.train_message.begin(), row.train_message.end(), 0) != row.train_message.end();
}

bool message_trained(const ConversationRow& row, const Span& s) {
  if (!any_untrained_message(row)) return true;
  ALPACA_CHECK(s.message >= 0, "a message has \"train\": false, but the chat template's {% generation %} blocks do "
                               "not pair one to one with the assistant messages, so the block of that message is unknown");
  return s.message >= static_cast<int64_t>(row.train_message.size()) || row.train_message[s.message] != 0;
}

// Renders `row` (messages[:num_messages], all when < 0) and tokenizes without special tokens.
Rendered render_row(const ConversationRow& row, const chat::ChatTemplate& tmpl, const tokenizer::Tokenizer& tok,
                    int64_t num_messages, bool add_generation_prompt) {
  Rendered r;
  r.ctx = context(row, num_messages, add_generation_prompt, tok);
  r.render = tmpl.render(r.ctx);
  r.ids = tok.encode(r.render.text, /*add_special_tokens=*/false);
  return r;
}

void with_spans(Rendered& r, const chat::ChatTemplate& tmpl, const tokenizer::Tokenizer& tok, const ConversationRow& row) {
  if (r.has_spans) return;
  r.spans = assistant_spans(tmpl, r.ctx, r.render, row);
  r.ranges = token_byte_ranges(tok, r.render.text, r.ids);
  r.has_spans = true;
}

// Calls fn(t) for each token of span `s` by transformers' rule (apply_chat_template's
// assistant_masks): from char_to_token(first character) to char_to_token(last character), each
// the first token holding a byte of that character. A token straddling either edge counts; the
// later pieces of a last character split across tokens (an emoji in byte-level BPE) do not.
template <typename Fn>
void for_tokens_in(const Ranges& ranges, const Span& s, const std::string& text, Fn&& fn) {
  if (s.end <= s.begin) return;
  size_t last = s.end - 1;  // the first byte of the span's last UTF-8 character
  while (last > s.begin && (static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
  auto holding = [&](size_t byte) {
    return std::lower_bound(ranges.begin(), ranges.end(), byte,
                            [](const std::pair<size_t, size_t>& r, size_t b) { return r.second <= b; });
  };
  const auto first = holding(s.begin), stop = holding(last);
  if (first == ranges.end() || first->first >= s.end) return;  // no token holds the span's text
  for (auto it = first; it != ranges.end() && it <= stop; ++it) fn(static_cast<size_t>(it - ranges.begin()));
}

// Labels of a rendered conversation: every token, or (assistant_only) the assistant tokens; the
// tokens of spans whose message says "train": false are left out either way (a token straddling
// a kept and a left-out span is left out).
std::vector<int64_t> conversation_labels(const Rendered& r, const ConversationRow& row, bool assistant_only) {
  if (!assistant_only && !any_untrained_message(row)) return r.ids;
  std::vector<char> kept(r.ids.size(), assistant_only ? 0 : 1), dropped(r.ids.size(), 0);
  for (const Span& s : r.spans) {
    auto& mark = message_trained(row, s) ? kept : dropped;
    for_tokens_in(r.ranges, s, r.render.text, [&](size_t t) { mark[t] = 1; });
  }
  std::vector<int64_t> labels(r.ids.size(), kIgnoreIndex);
  for (size_t t = 0; t < labels.size(); ++t)
    if (kept[t] && !dropped[t]) labels[t] = r.ids[t];
  return labels;
}

// keep_start truncation; when the cut falls outside every assistant span, the labels after the
// last span's end go too (the trailing turn, whose header may be cut).
void truncate(Example& ex, const Rendered& r, int64_t max_len) {
  const size_t n = static_cast<size_t>(max_len);
  if (!r.ranges.empty()) {
    const size_t cut = r.ranges[n].first;
    bool inside = false;
    size_t last_end = 0;
    for (const Span& s : r.spans) {
      inside = inside || (s.begin < cut && cut < s.end);
      if (s.end <= cut) last_end = std::max(last_end, s.end);
    }
    if (!inside)
      for (size_t t = 0; t < n; ++t)
        if (r.ranges[t].first >= last_end) ex.labels[t] = kIgnoreIndex;
  }
  ex.input_ids.resize(n);
  ex.labels.resize(n);
}

void check_not_empty(const Example& ex, const ConversationRow& row, const MaskOptions& opt) {
  const bool any = std::any_of(ex.labels.begin(), ex.labels.end(), [](int64_t l) { return l != kIgnoreIndex; });
  ALPACA_USER_CHECK(any, row.source << ": no token of this row is trained ("
                                    << (ex.input_ids.empty() ? "the chat template renders it as empty text"
                                        : opt.assistant_only_loss
                                            ? "--assistant_only_loss True and the chat template marks no assistant "
                                              "token in it: no assistant message, every one \"train\": false, or a "
                                              "template whose {% generation %} blocks are missing there"
                                            : "every trained part of it is left out (\"train\": false or the prompt)")
                                    << "); fix or drop the row");
}

// prompt_completion with strings: tokenizer(prompt), tokenizer(prompt + completion + EOS). A text
// row is one with an empty prompt, trained whole (TRL: tokenizer(text + EOS), labels = input_ids).
Example string_prompt_completion(const ConversationRow& row, const tokenizer::Tokenizer& tok, bool completion_only) {
  std::string completion = row.completion;
  if (!ends_with(completion, tok.eos_token())) completion += tok.eos_token();
  Example ex;
  const auto prompt_ids = tok.encode(row.prompt, true);
  ex.input_ids = tok.encode(row.prompt + completion, true);
  ex.labels = ex.input_ids;
  if (completion_only)
    std::fill_n(ex.labels.begin(), common_prefix_length(prompt_ids, ex.input_ids), kIgnoreIndex);
  return ex;
}

// A special token's text in a tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// The named tokens transformers reads from a tokenizer's config files that Tokenizer has no role
// for: sep/cls/mask, other `*_token` keys and a named extra_special_tokens object.
json config_special_tokens(const std::filesystem::path& dir) {
  auto read = [&](const char* name) {
    std::ifstream in(dir / name);
    json j = in ? json::parse(in, nullptr, /*allow_exceptions=*/false) : json::object();
    return j.is_object() ? j : json::object();
  };
  json cfg = read("tokenizer_config.json");
  const json map = cfg.contains("added_tokens_decoder") ? json::object() : read("special_tokens_map.json");
  for (const auto& [k, v] : map.items())  // transformers' legacy path: the map file's values win
    if (!v.is_array()) cfg[k] = v;
  json out = json::object();
  static const char* const kRoles[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
  for (const auto& [k, v] : cfg.items()) {
    const bool role = std::find(std::begin(kRoles), std::end(kRoles), k) != std::end(kRoles);
    const auto text = token_text(v);
    if (!role && ends_with(k, "_token") && text) out[k] = *text;
  }
  if (cfg.contains("extra_special_tokens") && cfg["extra_special_tokens"].is_object())
    for (const auto& [k, v] : cfg["extra_special_tokens"].items())
      if (const auto text = token_text(v)) out[k] = *text;
  return out;
}

}  // namespace

namespace {

// template_special_tokens_json as a json object; the config part is read once per tokenizer file
// (a hit costs a lock and a map lookup: this runs for every rendering).
json template_special_tokens(const tokenizer::Tokenizer& tok) {
  static std::mutex mu;
  static std::map<std::string, json> by_file;
  json out;
  {
    const std::string file = tok.source();
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_file.find(file);
    if (it == by_file.end()) {
      std::error_code ec;  // "(in memory)" and the like: no config beside it
      const bool on_disk = std::filesystem::is_regular_file(file, ec);
      it = by_file.emplace(file, on_disk ? config_special_tokens(std::filesystem::path(file).parent_path())
                                         : json::object()).first;
    }
    out = it->second;
  }
  out["bos_token"] = tok.bos_token();
  out["eos_token"] = tok.eos_token();
  if (const auto unk = tok.unk_token()) out["unk_token"] = *unk;
  if (const auto pad = tok.pad_token()) out["pad_token"] = *pad;
  return out;
}

}  // namespace

std::string template_special_tokens_json(const tokenizer::Tokenizer& tok) { return template_special_tokens(tok).dump(); }

namespace {

// The untruncated example of a conversation row (messages, sharegpt, prompt-completion lists).
Example conversation_rows_example(const ConversationRow& row, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& tmpl,
                                  const MaskOptions& opt, bool completion_only, Rendered& r) {
  r = render_row(row, tmpl, tok, -1, false);
  if (opt.assistant_only_loss || any_untrained_message(row)) with_spans(r, tmpl, tok, row);
  Example ex;
  ex.input_ids = r.ids;
  ex.labels = conversation_labels(r, row, opt.assistant_only_loss);
  if (completion_only) {
    const Rendered prompt = render_row(row, tmpl, tok, row.num_prompt_messages, true);
    std::fill_n(ex.labels.begin(), common_prefix_length(prompt.ids, ex.input_ids), kIgnoreIndex);
  }
  return ex;
}

// Runs fn; errors that do not name the row yet are prefixed with it (template errors included).
template <typename Fn>
auto naming_row(const ConversationRow& row, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const chat::TemplateRaised& e) {
    ALPACA_USER_FAIL(row.source << ": the chat template raised an error: " << e.message());
  } catch (const Error& e) {
    if (e.message().rfind(row.source, 0) == 0) throw;
    ALPACA_USER_FAIL(row.source << ": " << e.message());
  }
}

// A tokenized row as SFTTrainer prepares a processed dataset: the ids as given (no EOS added), the
// labels as given or input_ids masked where assistant_masks is 0 and, with completion_only_loss
// (None: True when the file has `prompt` and `completion` columns, SFTTrainer's test on its
// first row), where completion_mask is 0;
// then (conversation_example) the start kept up to max_length. A row left with nothing to train is
// dropped by the caller, as TRL's filter drops it, not refused.
Example tokenized_example(const ConversationRow& row, const tokenizer::Tokenizer& tok, const MaskOptions& opt) {
  const int64_t vocab = tok.vocab_size();
  for (size_t i = 0; i < row.token_ids.size(); ++i)
    ALPACA_USER_CHECK(row.token_ids[i] < vocab, row.source << ": \"input_ids\"[" << i << "] is " << row.token_ids[i]
                                                           << ", outside the tokenizer's " << vocab
                                                           << " ids; were the rows tokenized with another tokenizer?");
  Example ex;
  ex.input_ids = row.token_ids;
  if (!row.token_labels.empty()) {
    ex.labels = row.token_labels;
  } else {
    ex.labels = ex.input_ids;
    const bool completion_only = opt.completion_only_loss.value_or(row.prompt_completion_columns) && !row.completion_mask.empty();
    for (size_t i = 0; i < ex.labels.size(); ++i)
      if ((completion_only && !row.completion_mask[i]) || (!row.assistant_masks.empty() && !row.assistant_masks[i]))
        ex.labels[i] = kIgnoreIndex;
  }
  return ex;
}

}  // namespace

Example conversation_example(const ConversationRow& row, const tokenizer::Tokenizer& tok, const chat::ChatTemplate* tmpl,
                             const MaskOptions& opt, bool* truncated) {
  ALPACA_CHECK(row.format != DatasetFormat::kAlpaca, row.source << ": alpaca rows go through tokenize_alpaca");
  Rendered r;
  Example ex;
  if (row.format == DatasetFormat::kTokenized) {
    ex = tokenized_example(row, tok, opt);  // nothing left to train is not an error there (TRL drops it)
  } else {
    ALPACA_USER_CHECK(tmpl || !row.is_conversational(), row.source << ": a conversation row needs the model's chat "
                                                                     "template (chat_template.jinja, or give "
                                                                     "--chat_template FILE)");
    const bool completion_only =
        row.format == DatasetFormat::kPromptCompletion && opt.completion_only_loss.value_or(true);
    ex = naming_row(row, [&] {
      return row.is_conversational() ? conversation_rows_example(row, tok, *tmpl, opt, completion_only, r)
                                     : string_prompt_completion(row, tok, completion_only);
    });
    check_not_empty(ex, row, opt);
  }
  const bool cut = opt.model_max_length > 0 && opt.truncate_conversations &&
                   static_cast<int64_t>(ex.input_ids.size()) > opt.model_max_length;
  if (truncated) *truncated = cut;
  if (cut) {
    if (row.is_conversational() && (opt.assistant_only_loss || any_untrained_message(row))) {
      naming_row(row, [&] { with_spans(r, *tmpl, tok, row); });
    } else if (row.is_conversational()) {
      // The spans only refine where a fully trained row's labels end (no partial header trained).
      // A template they cannot be found in (not prefix-stable: Phi-3 multi-turn, Mistral v0.3 with
      // a system message) takes TRL's plain keep_start cut instead of stopping the run.
      try {
        with_spans(r, *tmpl, tok, row);
      } catch (const Error&) {
        r.spans.clear();
        r.ranges.clear();
      }
    }
    truncate(ex, r, opt.model_max_length);
  }
  return ex;
}

std::vector<Example> tokenize_rows(const std::vector<ConversationRow>& rows, const tokenizer::Tokenizer& tok,
                                   const chat::ChatTemplate* tmpl, const MaskOptions& opt, int num_threads,
                                   MaskStats* stats) {
  tok.check_special_tokens();
  std::vector<AlpacaRecord> alpaca;
  std::vector<size_t> alpaca_at;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].format == DatasetFormat::kAlpaca) {
      alpaca.push_back(rows[i].alpaca);
      alpaca_at.push_back(i);
    }
  std::vector<Example> examples(rows.size());
  TokenizeStats astats;
  if (!alpaca.empty()) {
    auto done = tokenize_alpaca(alpaca, tok, opt.model_max_length, num_threads, &astats);
    for (size_t k = 0; k < done.size(); ++k) examples[alpaca_at[k]] = std::move(done[k]);
  }
  std::vector<char> cut(rows.size(), 0);
  detail::parallel_for(static_cast<int64_t>(rows.size()), num_threads, [&](int64_t i) {
    if (rows[i].format == DatasetFormat::kAlpaca) return;
    bool c = false;
    examples[i] = conversation_example(rows[i], tok, tmpl, opt, &c);
    cut[i] = c ? 1 : 0;
  });
  MaskStats st;
  st.num_rows = static_cast<int64_t>(rows.size());
  st.num_truncated = astats.num_truncated + std::count(cut.begin(), cut.end(), 1);
  st.num_no_label = astats.num_no_label_tokens;
  std::vector<Example> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const int64_t trained = std::count_if(examples[i].labels.begin(), examples[i].labels.end(),
                                          [](int64_t l) { return l != kIgnoreIndex; });
    if (trained == 0 && rows[i].format != DatasetFormat::kAlpaca) {
      // TRL drops the rows truncation leaves fully masked, but not when it packs.
      ++(opt.packing ? st.num_kept_no_label : st.num_dropped);
      if (!opt.packing) continue;
    }
    st.num_tokens += static_cast<int64_t>(examples[i].input_ids.size());
    st.num_trained += trained;
    out.push_back(std::move(examples[i]));
  }
  if (stats) *stats = st;
  return out;
}

std::vector<Example> load_examples(const std::string& paths, const RowFormat& format,
                                   const tokenizer::Tokenizer& tok, const std::filesystem::path& model_dir,
                                   const std::filesystem::path& chat_template, const MaskOptions& opt, int num_threads, MaskStats* stats) {
  const Dataset dataset = load_dataset(paths, format);
  // TRL's SFTTrainer raises here too ("the dataset is not conversational"): the flag would do nothing.
  // Tokenized rows carry their own masks (assistant_masks), as in TRL, which does not check them.
  const bool any_tokenized = std::any_of(dataset.rows.begin(), dataset.rows.end(), [](const ConversationRow& r) {
    return r.format == DatasetFormat::kTokenized;
  });
  ALPACA_USER_CHECK(!opt.assistant_only_loss || needs_chat_template(dataset.rows) || any_tokenized,
                    paths << ": --assistant_only_loss True needs conversation rows (messages, sharegpt conversations, "
                             "or prompt/completion message lists), but every row is plain text or an Alpaca record; "
                             "drop the flag (prompt-completion rows train only the completion already, Alpaca rows "
                             "only the response)");
  std::optional<chat::ChatTemplate> tmpl;
  if (needs_chat_template(dataset.rows)) tmpl.emplace(chat::ChatTemplate::load(model_dir, chat_template));
  return tokenize_rows(dataset.rows, tok, tmpl ? &*tmpl : nullptr, opt, num_threads, stats);
}

MaskOptions run_mask_options(bool assistant_only_loss, std::optional<bool> completion_only_loss,
                             int64_t model_max_length, bool packing, const std::string& packing_strategy) {
  MaskOptions m{assistant_only_loss, completion_only_loss, model_max_length};
  m.packing = packing;
  m.truncate_conversations = !packing || parse_packing_strategy(packing_strategy) == PackingStrategy::kBfd;
  return m;
}

bool needs_chat_template(const std::vector<ConversationRow>& rows) {
  return std::any_of(rows.begin(), rows.end(), [](const ConversationRow& r) { return r.is_conversational(); });
}

std::string describe_mask_stats(const MaskStats& s, int64_t model_max_length) {
  std::ostringstream os;
  os << "trained " << s.num_trained << " of " << s.num_tokens << " tokens ("
     << (s.num_tokens ? 100.0 * static_cast<double>(s.num_trained) / static_cast<double>(s.num_tokens) : 0.0)
     << "%) in " << s.num_rows - s.num_dropped << " examples from " << s.num_rows << " rows; " << s.num_truncated
     << " truncated to " << model_max_length << " tokens, " << s.num_dropped
     << " dropped with no label left after truncation";
  if (s.num_kept_no_label)
    os << ", " << s.num_kept_no_label << " kept with no label left after truncation (packing keeps them, as TRL)";
  os << ", " << s.num_no_label << " alpaca rows with no response token left";
  return os.str();
}

}  // namespace alpaca::data
