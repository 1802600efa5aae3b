// Chat template rendering against transformers (fixture: tests/reference/chat_template_reference.py):
// SmolLM2's template, every template in the trl wheel and the construct templates in
// tests/fixtures/chat_templates/, over the reference's case list, byte for byte; the
// {% generation %} spans against transformers' return_assistant_tokens_mask spans; the error
// text of raise_exception verbatim.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "alpaca/chat/chat_template.h"
#include "test_util.h"

namespace test_chat_template {

namespace fs = std::filesystem;
using alpaca::chat::ChatTemplate;
using alpaca::chat::RenderOptions;
using alpaca::chat::TemplateRaised;
using alpaca::testing::binary_dir;
using json = nlohmann::ordered_json;

namespace {

fs::path fixture_file() { return binary_dir() / "fixtures" / "chat_templates" / "chat_templates.json"; }

json load_fixture() {
  std::ifstream in(fixture_file());
  return json::parse(in);
}

// Render options with the fixture's clock ("now"), as its reference renders ran.
RenderOptions fixture_options(const json& fx) {
  RenderOptions opts;
  opts.now_unix = fx["now"].get<int64_t>();
  return opts;
}

// First differing byte, with context, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto around = [&](const std::string& s) {
    return json(s.substr(i < 40 ? 0 : i - 40, 80)).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  return "at byte " + std::to_string(i) + "\n  want " + around(want) + "\n  got  " + around(got);
}

// One case; returns "" when ours matches the reference, else what differs.
std::string check_case(const ChatTemplate& tmpl, const json& c, const RenderOptions& opts, bool* spans_checked) {
  std::string ctx = c["context"].dump();
  if (c.contains("error")) {
    try {
      auto r = tmpl.render(ctx, opts);
      return "transformers raised (" + c["error_kind"].get<std::string>() + ": " + c["error"].get<std::string>() +
             ") but we rendered " + json(r.text.substr(0, 200)).dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (const TemplateRaised& e) {
      if (c["error_kind"] != "raised") return "";  // both refused; the reference's text is Python's
      if (e.message() != c["error"].get<std::string>())
        return "raise_exception text differs: want " + c["error"].dump() + " got " + json(e.message()).dump();
      return "";
    } catch (const alpaca::Error& e) {
      if (c["error_kind"] == "raised")
        return "want raise_exception(" + c["error"].dump() + "), got error: " + e.message();
      return "";
    }
  }
  alpaca::chat::RenderResult r;
  try {
    r = tmpl.render(ctx, opts);
  } catch (const alpaca::Error& e) {
    return std::string("we failed: ") + e.message();
  }
  const std::string want = c["text"].get<std::string>();
  if (r.text != want) return "text differs " + first_difference(want, r.text);
  if (c.contains("spans")) {
    *spans_checked = true;
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& s : c["spans"]) spans.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    if (spans != r.generation_spans) return "generation spans differ (" + c["spans"].dump() + ")";
  }
  return "";
}

}  // namespace

TEST(ChatTemplate, MatchesTransformersOnEveryTemplateAndCase) {
  ASSERT_TRUE(fs::exists(fixture_file())) << "run the fixture first: ctest -R chat_templates";
  json fx = load_fixture();
  const RenderOptions opts = fixture_options(fx);
  std::vector<std::unique_ptr<ChatTemplate>> templates;
  for (const auto& t : fx["templates"]) {
    try {
      templates.push_back(std::make_unique<ChatTemplate>(t["source"].get<std::string>(), t["name"].get<std::string>()));
    } catch (const alpaca::Error& e) {
      ADD_FAILURE() << t["name"] << " does not parse: " << e.message();
      templates.push_back(nullptr);
    }
  }
  size_t num_cases = 0, num_diff = 0, num_errors = 0, num_span_cases = 0;
  std::map<std::string, size_t> per_template_cases;
  for (const auto& c : fx["cases"]) {
    size_t ti = c["template"].get<size_t>();
    const std::string name = fx["templates"][ti]["name"].get<std::string>();
    ++num_cases;
    ++per_template_cases[name];
    num_errors += c.contains("error");
    if (!templates[ti]) {
      ++num_diff;
      continue;
    }
    bool spans = false;
    std::string diff = check_case(*templates[ti], c, opts, &spans);
    num_span_cases += spans;
    if (!diff.empty()) {
      ++num_diff;
      ADD_FAILURE() << name << " / " << c["case"].get<std::string>() << ": " << diff;
    }
  }
  std::cout << "[chat_template] " << templates.size() << " templates x " << num_cases / std::max<size_t>(1, templates.size())
            << " cases = " << num_cases << " renderings (" << num_errors << " expected errors, " << num_span_cases
            << " with generation spans): " << num_diff << " differences\n";
  EXPECT_EQ(num_diff, 0u);
  EXPECT_GE(templates.size(), 70u) << "the trl wheel ships 73 templates; fewer means the fixture lost some";
  // The model directory scripts/make_smollm2.py writes (when present) holds the same template.
  fs::path smol = alpaca::testing::source_dir() / "models" / "smollm2-135m-instruct";
  if (fs::exists(smol / "chat_template.jinja") && fx["templates"][0]["name"] == "smollm2") {
    EXPECT_EQ(ChatTemplate::load(smol).source(), fx["templates"][0]["source"].get<std::string>());
    std::cout << "[chat_template] " << smol.string() << "/chat_template.jinja is the template compared above\n";
  }
}

namespace {

// The generation spans with adjacent ones joined (a template may close and reopen its block
// between content and terminator).
std::vector<std::pair<size_t, size_t>> merged(const json& spans) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& s : spans) {
    size_t a = s[0].get<size_t>(), b = s[1].get<size_t>();
    if (!out.empty() && out.back().second == a) out.back().second = b;
    else out.emplace_back(a, b);
  }
  return out;
}

// Prefix span P agrees with the template's markers when a generation span G holds it
// (G may start earlier: headers like "<think>\n\n</think>" that the generation prompt adds) and
// ends where P ends or only whitespace after it (a separator the template leaves untrained).
bool agrees(const std::string& text, std::pair<size_t, size_t> p, const std::vector<std::pair<size_t, size_t>>& gen) {
  for (const auto& g : gen) {
    if (g.first > p.first || g.second > p.second || g.second <= p.first) continue;
    bool ws = true;
    for (size_t i = g.second; i < p.second; ++i) ws = ws && std::isspace(static_cast<unsigned char>(text[i]));
    if (ws) return true;
  }
  return false;
}

// Where prefix rendering and the template's own markers legitimately differ: in diffusion_gemma,
// a tool response continues the model's turn, so the text a tool call turn adds
// ("<|tool_response>") and the resumed "<|turn>model\n" header fall to the assistant by
// prefix rendering but outside {% generation %}. A template with markers should use them.
bool known_disagreement(const std::string& name, const std::string& c) {
  return name == "trl/diffusion_gemma_training.jinja" && c.rfind("tool_calls/", 0) == 0;
}

}  // namespace

TEST(ChatTemplate, PrefixRenderSpansMatchTheOracleAndAgreeWithGenerationSpans) {
  ASSERT_TRUE(fs::exists(fixture_file())) << "run the fixture first: ctest -R chat_templates";
  json fx = load_fixture();
  const RenderOptions opts = fixture_options(fx);
  std::map<size_t, std::unique_ptr<ChatTemplate>> templates;
  size_t num_cases = 0, num_refused = 0, num_diff = 0, num_both = 0, num_agree = 0, num_known = 0;
  for (const auto& c : fx["cases"]) {
    if (!c.contains("prefix_spans") && !c.contains("prefix_error")) continue;
    size_t ti = c["template"].get<size_t>();
    const std::string name = fx["templates"][ti]["name"].get<std::string>();
    if (!templates.count(ti)) templates[ti] = std::make_unique<ChatTemplate>(fx["templates"][ti]["source"].get<std::string>(), name);
    ++num_cases;
    std::vector<alpaca::chat::AssistantSpan> ours;
    std::string err;
    try {
      ours = alpaca::chat::assistant_char_spans(*templates[ti], c["context"].dump(), opts);
    } catch (const alpaca::Error& e) {
      err = e.message();
    }
    if (c.contains("prefix_error")) {
      ++num_refused;
      if (err.empty()) {
        ++num_diff;
        ADD_FAILURE() << name << " / " << c["case"] << ": the oracle refused (" << c["prefix_error"] << "), we did not";
      }
      continue;
    }
    json got = json::array();
    for (const auto& s : ours) got.push_back({s.message_index, s.begin, s.end});
    if (!err.empty() || got != c["prefix_spans"]) {
      ++num_diff;
      ADD_FAILURE() << name << " / " << c["case"] << ": prefix spans " << got.dump() << " want "
                    << c["prefix_spans"].dump() << " " << err;
      continue;
    }
    if (!c.contains("spans")) continue;
    ++num_both;
    auto gen = merged(c["spans"]);
    bool all = true;
    for (const auto& s : ours) all = all && agrees(c["text"].get<std::string>(), {s.begin, s.end}, gen);
    if (!all && known_disagreement(name, c["case"].get<std::string>())) {
      ++num_known;
      std::cout << "[chat_template] known disagreement: " << name << " / " << c["case"].get<std::string>() << "\n";
      continue;
    }
    num_agree += all;
    if (!all) ADD_FAILURE() << name << " / " << c["case"] << ": prefix spans " << got.dump()
                            << " disagree with generation spans " << c["spans"].dump();
  }
  std::cout << "[chat_template] prefix-render spans: " << num_cases << " cases (" << num_refused
            << " not prefix-stable, refused by both), " << num_diff << " differences from the Python oracle; "
            << num_agree << "/" << num_both << " generation-tagged cases agree with the template's markers ("
            << num_known << " known disagreements)\n";
  EXPECT_EQ(num_diff, 0u);
  EXPECT_EQ(num_agree + num_known, num_both);
  EXPECT_LE(num_known, 2u);
  EXPECT_GT(num_both, 100u);
}

}  // namespace test_chat_template
