// Chat templates come from the Hub: parse and render any template text with a fixed conversation
// (system, user, assistant with tool calls, tool result, unicode), add_generation_prompt on and
// off, under tight bounds. An input holding "\n@@CONTEXT@@\n" renders the JSON after it instead:
// the variables' side is hostile too. Errors must be alpaca::Error; generation spans must lie
// inside the text.
#include "alpaca/chat/chat_template.h"

#include "fuzz_common.h"

namespace {

const char* kContext = R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "Weather in Zürich? 🙂"},
  {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
  {"role": "tool", "content": "{\"temp\": 3}"},
  {"role": "assistant", "content": "3 °C.", "reasoning_content": "Read the tool."}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
 "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": %s})";

void check(const alpaca::chat::ChatTemplate& t, const std::string& ctx) {
  alpaca::chat::RenderOptions o;
  o.now_unix = 0;
  o.max_output_bytes = 1 << 20;
  o.max_loop_iterations = 100000;
  FUZZ_EXPECT_ALPACA_ERRORS({
    auto r = t.render(ctx, o);
    for (const auto& [a, b] : r.generation_spans)
      if (a > b || b > r.text.size()) __builtin_trap();
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input = fuzz::as_string(data, size);
  std::string ctx_json;
  const std::string marker = "\n@@CONTEXT@@\n";
  if (size_t m = input.find(marker); m != std::string::npos) {
    ctx_json = input.substr(m + marker.size());
    input.resize(m);
  }
  FUZZ_EXPECT_ALPACA_ERRORS({
    alpaca::chat::ChatTemplate t(input, "fuzzed template");
    if (!ctx_json.empty()) {
      check(t, ctx_json);
    } else {
      for (const char* agp : {"false", "true"}) {
        std::string ctx = kContext;
        ctx.replace(ctx.find("%s"), 2, agp);
        check(t, ctx);
      }
    }
  });
  return 0;
}
