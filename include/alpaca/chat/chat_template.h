// Hugging Face chat templates, rendered in C++ the way transformers 5 renders them
// (`tokenizer.apply_chat_template(..., tokenize=False)`): a Jinja engine of our own (src/chat/:
// lexer, parser, evaluator) configured like transformers' ImmutableSandboxedEnvironment
// (trim_blocks, lstrip_blocks, loopcontrols, `{% generation %}`, `raise_exception`,
// `strftime_now`, a `tojson` that matches json.dumps). The boundary is JSON text, so callers
// (data/, generate/) share no types with the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "alpaca/util/error.h"

namespace alpaca::chat {

// raise_exception(message) called by the template: message() is the template's text exactly
// (transformers raises jinja2.TemplateError(message)). Other template errors (syntax, an
// unsupported construct, a type error) are plain alpaca::Error naming the template line.
class TemplateRaised : public alpaca::Error {
 public:
  TemplateRaised(const char* file, int line, const std::string& msg) : alpaca::Error(file, line, msg) {}
};

struct RenderResult {
  std::string text;  // UTF-8, byte-identical to transformers' rendering
  // Byte offsets [begin, end) into `text` of what each {% generation %} block rendered, in order
  // (transformers' return_assistant_tokens_mask spans, in bytes instead of characters).
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

struct RenderOptions {
  // strftime_now() reads this clock (seconds since the epoch, local time) when set: tests pin it.
  std::optional<int64_t> now_unix;
  size_t max_output_bytes = size_t{64} << 20;  // a template that writes more is an error
  size_t max_loop_iterations = 1'000'000;      // over all loops of one render
};

struct Template;  // src/chat: the parsed template

class ChatTemplate {
 public:
  // Parses `source` (the template text). Throws alpaca::Error naming the line on a syntax error
  // or a construct the engine does not support.
  explicit ChatTemplate(std::string source, std::string origin = "chat template");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The model's template, as transformers 5 finds it: `override_path` when non-empty (a Jinja
  // file), else `<model_dir>/chat_template.jinja`, else `chat_template` in
  // `<model_dir>/tokenizer_config.json` (a string, or a list of {name, template}: the one named
  // "default"). Throws naming the files it looked at when there is none.
  static ChatTemplate load(const std::filesystem::path& model_dir,
                           const std::filesystem::path& override_path = {});

  // Renders with the variables in `context_json`, an object: `messages` (a list of message
  // objects), `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, `documents` and any
  // template kwargs. As transformers does: message keys whose value is null are dropped, a
  // message's reasoning is aliased to `reasoning_content`/`thinking`, and `tools`, `documents`
  // are none and `add_generation_prompt` false when absent.
  RenderResult render(std::string_view context_json, const RenderOptions& options = {}) const;

  const std::string& source() const;
  bool has_generation_blocks() const;

 private:
  std::unique_ptr<Template> impl_;
};

// What to train on in a template without {% generation %} markers, by prefix rendering (as
// Megatron-Bridge does): for each assistant message i, the text between
// render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]) — its content and
// its turn terminator, never its role header. Offsets are bytes into
// render(messages, add_generation_prompt=False), the text these spans index.
struct AssistantSpan {
  size_t message_index;
  size_t begin, end;
};
// Throws alpaca::Error naming the message when the template is not prefix-stable there (an earlier
// rendering is not a prefix of a later one, e.g. a template that rewrites past turns), since the
// spans would then index text that is not in the full rendering.
std::vector<AssistantSpan> assistant_char_spans(const ChatTemplate& tmpl, std::string_view context_json,
                                                const RenderOptions& options = {});

}  // namespace alpaca::chat
