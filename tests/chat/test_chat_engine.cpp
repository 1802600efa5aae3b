// The chat template engine's own contracts: where templates are loaded from, what the variables
// look like after transformers' preprocessing, errors that name the construct and the line, and
// the bounds that stop a runaway template. Byte parity with transformers is test_chat_template.
#include <gtest/gtest.h>

#include <fstream>

#include "alpaca/chat/chat_template.h"
#include "test_util.h"

namespace test_chat_engine {

namespace fs = std::filesystem;
using alpaca::chat::ChatTemplate;
using alpaca::chat::RenderOptions;
using alpaca::chat::TemplateRaised;
using alpaca::testing::TempDir;

namespace {

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string render(const std::string& tmpl, const std::string& ctx = "{}", const RenderOptions& o = {}) {
  return ChatTemplate(tmpl, "test template").render(ctx, o).text;
}

// The message of the alpaca::Error that rendering (or parsing) `tmpl` throws, or "" if none.
std::string error_of(const std::string& tmpl, const std::string& ctx = "{}", const RenderOptions& o = {}) {
  try {
    render(tmpl, ctx, o);
  } catch (const alpaca::Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST(ChatEngine, LoadsLikeTransformers) {
  TempDir dir("chat_load");
  write(dir.path() / "tokenizer_config.json", R"({"chat_template": "config {{ messages | length }}"})");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(R"({"messages": [{}]})").text, "config 1");
  write(dir.path() / "chat_template.jinja", "jinja {{ messages | length }}\n");  // one final newline goes
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(R"({"messages": [{}, {}]})").text, "jinja 2");
  write(dir.path() / "override.jinja", "override");
  EXPECT_EQ(ChatTemplate::load(dir.path(), dir.path() / "override.jinja").render("{}").text, "override");

  TempDir named("chat_named");
  write(named.path() / "tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "dflt"}]})");
  EXPECT_EQ(ChatTemplate::load(named.path()).render("{}").text, "dflt");
  write(named.path() / "tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "r"}]})");
  try {
    ChatTemplate::load(named.path());
    FAIL() << "a named list without \"default\" must be refused";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("rag"), std::string::npos) << e.message();
  }
  TempDir empty("chat_empty");
  try {
    ChatTemplate::load(empty.path());
    FAIL() << "a directory without a template must be refused";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("--chat_template"), std::string::npos) << e.message();
  }
}

TEST(ChatEngine, PreparesVariablesAsApplyChatTemplateDoes) {
  // Null keys dropped; reasoning aliased as {"thinking": r, **message, "reasoning_content": r}.
  std::string t = "{% for m in messages %}{{ m | tojson }}{% endfor %}|{{ add_generation_prompt }}|{{ tools }}|{{ documents is none }}";
  EXPECT_EQ(render(t, R"({"messages": [{"role": "user", "content": "hi", "name": null}]})"),
            R"({"role": "user", "content": "hi"}|False|None|True)");
  EXPECT_EQ(render("{{ messages[0] | tojson }}", R"({"messages": [{"role": "assistant", "reasoning": "r", "content": "c"}]})"),
            R"({"thinking": "r", "role": "assistant", "reasoning": "r", "content": "c", "reasoning_content": "r"})");
}

TEST(ChatEngine, RaiseExceptionTextIsVerbatim) {
  try {
    render("line one\n{{ raise_exception('Bad role: ' ~ messages[0].role) }}", R"({"messages": [{"role": "x"}]})");
    FAIL() << "raise_exception must throw";
  } catch (const TemplateRaised& e) {
    EXPECT_EQ(e.message(), "Bad role: x");
  }
}

TEST(ChatEngine, ErrorsNameTheConstructAndLine) {
  std::string inc = error_of("a\nb\n{% include 'other.jinja' %}");
  EXPECT_NE(inc.find("line 3"), std::string::npos) << inc;
  EXPECT_NE(inc.find("include"), std::string::npos) << inc;
  std::string filt = error_of("\n{{ 'x' | wordwrap }}");
  EXPECT_NE(filt.find("line 2"), std::string::npos) << filt;
  EXPECT_NE(filt.find("wordwrap"), std::string::npos) << filt;
  std::string syntax = error_of("{% for m in messages %}\n{{ m }\n{% endfor %}");
  EXPECT_NE(syntax.find("line 2"), std::string::npos) << syntax;
  std::string unterminated = error_of("{% if true %}never closed");
  EXPECT_NE(unterminated.find("endif"), std::string::npos) << unterminated;
  std::string undefined_attr = error_of("{{ nothing.here }}");
  EXPECT_NE(undefined_attr.find("'nothing' is undefined"), std::string::npos) << undefined_attr;
  EXPECT_NE(error_of("{% set xs = [] %}{{ xs.append(1) }}").find("append"), std::string::npos);
}

TEST(ChatEngine, BoundsStopRunawayTemplates) {
  RenderOptions small;
  small.max_loop_iterations = 1000;
  small.max_output_bytes = 4096;
  EXPECT_NE(error_of("{% for i in range(5000) %}{% endfor %}", "{}", small).find("loop iterations"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100) %}{{ 'x' * 100 }}{% endfor %}", "{}", small).find("bytes"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000 }}").find("64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nest deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nesting"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(ChatEngine, GenerationSpansAreByteOffsets) {
  auto r = ChatTemplate("é{% generation %}ab{{ 'ü' }}{% endgeneration %}-{% generation %}{% endgeneration %}")
               .render("{}");
  EXPECT_EQ(r.text, "éabü-");
  ASSERT_EQ(r.generation_spans.size(), 2u);
  EXPECT_EQ(r.generation_spans[0], std::make_pair(size_t{2}, size_t{6}));
  EXPECT_EQ(r.generation_spans[1], std::make_pair(size_t{7}, size_t{7}));
  EXPECT_TRUE(ChatTemplate("{%- generation -%}{%- endgeneration -%}").has_generation_blocks());
  EXPECT_FALSE(ChatTemplate("plain").has_generation_blocks());
}

TEST(ChatEngine, StrftimeNowReadsThePinnedClock) {
  RenderOptions o;
  o.now_unix = 0;
  setenv("TZ", "UTC", 1);
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H') }}", "{}", o), "1970-01-01 00");
}

}  // namespace test_chat_engine
