// Conversation training examples (issue 28): ids and labels token-exact with the references that
// tests/reference/conversation_masks_reference.py computes with SmolLM2's tokenizer:
//  (a) transformers' apply_chat_template(return_assistant_tokens_mask=True) for every
//      generation-tagged template of the trl wheel (and a SentencePiece tokenizer with one), (b) the Python prefix-render oracle for
//      SmolLM2's untagged template (per-message "train": false included), (c) the labels TRL 1.16's
//      SFTTrainer._prepare_dataset + DataCollatorForLanguageModeling produce with
//      assistant_only_loss and completion_only_loss, packing off and on;
// plus the truncation policy, mixed alpaca + conversation files, and bad input through the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <iterator>
#include <regex>
#include <nlohmann/json.hpp>

#include "alpaca/chat/chat_template.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/data/packing.h"
#include "alpaca/generate/chat_prompt.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace alpaca::data::test_conversation_masks {
using tokenizer::Tokenizer;
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::alpaca::testing::TempDir;

fs::path fixture() { return ::alpaca::testing::binary_dir() / "fixtures" / "conversation_masks"; }

json load_fixture() {
  std::ifstream in(fixture() / "masks.json");
  return json::parse(in);
}

const Tokenizer& smollm2_tokenizer(const json& fx) {
  static Tokenizer tok = Tokenizer::load(fx["model_dir"].get<std::string>());
  return tok;
}

ConversationRow row_of(const json& row, const std::string& name) {
  json r = {{"messages", row["messages"]}};
  auto rows = parse_dataset_rows(r.dump(), name);
  return rows.at(0);
}

std::vector<int64_t> mask_of(const Example& ex) {
  std::vector<int64_t> m;
  for (int64_t l : ex.labels) m.push_back(l != kIgnoreIndex ? 1 : 0);
  return m;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

#define SKIP_WITHOUT_FIXTURE()                                                                            \
  ASSERT_TRUE(fs::exists(fixture())) << "run the fixture first: ctest -R fixture_conversation_masks"; \
  ALPACA_SKIP_IF_FIXTURE_SKIPPED(fixture())

TEST(ConversationMasks, MatchTransformersAndThePrefixOracle) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const Tokenizer& tok = smollm2_tokenizer(fx);
  std::vector<std::unique_ptr<chat::ChatTemplate>> templates;
  for (const auto& t : fx["templates"])
    templates.push_back(std::make_unique<chat::ChatTemplate>(t["source"].get<std::string>(), t["name"].get<std::string>()));
  MaskOptions opt;
  opt.assistant_only_loss = true;
  size_t same = 0, refused = 0, tagged = 0, trained = 0;
  for (const auto& c : fx["cases"]) {
    const size_t ti = c["template"].get<size_t>();
    const std::string where = fx["templates"][ti]["name"].get<std::string>() + " / " + c["row"].get<std::string>();
    const ConversationRow row = row_of(fx["rows"][c["row"].get<std::string>()], where);
    const bool expect_error = c.contains("error") || std::count(c["mask"].begin(), c["mask"].end(), 1) == 0;
    try {
      const Example ex = conversation_example(row, tok, templates[ti].get(), opt);
      EXPECT_FALSE(expect_error) << where << ": the reference refused (" << c.value("error", "empty mask") << ")";
      EXPECT_EQ(ex.input_ids, c["input_ids"].get<std::vector<int64_t>>()) << where;
      EXPECT_EQ(mask_of(ex), c["mask"].get<std::vector<int64_t>>()) << where;
      const bool ok = !expect_error && ex.input_ids == c["input_ids"].get<std::vector<int64_t>>() &&
                      mask_of(ex) == c["mask"].get<std::vector<int64_t>>();
      same += ok;
      tagged += ok && fx["templates"][ti]["tagged"].get<bool>();
      trained += std::count(c["mask"].begin(), c["mask"].end(), 1);
    } catch (const Error& e) {
      EXPECT_TRUE(expect_error) << where << ": " << e.message();
      EXPECT_NE(e.message().find(where), std::string::npos) << "the error names the row: " << e.message();
      ++refused;
    }
  }
  std::cout << "[conversation_masks] " << fx["templates"].size() << " templates x " << fx["rows"].size() << " rows: "
            << same << " token-exact (" << tagged << " against transformers' assistant_masks, " << same - tagged
            << " against the prefix-render oracle; " << trained << " trained tokens), " << refused
            << " refused by both\n";
  EXPECT_EQ(same + refused, fx["cases"].size());
  EXPECT_GT(tagged, 80u);
  EXPECT_GE(same - tagged, 4u);
}

// Where a template has {% generation %} markers and is prefix-stable, both ways of finding the
// assistant tokens apply, and they must agree token for token, with the allowances
// test_chat_template makes for the spans: the markers may start earlier (a header the generation
// prompt also writes, "<think>\n" or gpt-oss's "<|start|>assistant", glued to the front of the
// turn), and prefix rendering may take more after the turn (a whitespace separator the markers
// leave out). One more at token level: where a template closes and reopens its marker right after
// a character that byte-level BPE splits (an emoji), transformers' char_to_token rule drops the
// character's later pieces; prefix rendering, one span, keeps them.
// The prefix side renders the same template with its markers turned into `if true` blocks (the
// same whitespace control), so only the span source differs.
bool markers_and_prefix_agree(const Example& gen, const Example& pre, const Tokenizer& tok, std::string* diff) {
  bool ok = true;
  for (size_t i = 0; i < gen.labels.size(); ++i) {
    const bool g = gen.labels[i] != kIgnoreIndex, p = pre.labels[i] != kIgnoreIndex;
    if (g == p) continue;
    const std::string b = tok.token_bytes(gen.input_ids[i]);
    bool allowed;
    if (g) {  // markers only: part of a run that runs into the prefix span
      size_t j = i;
      while (j < gen.labels.size() && gen.labels[j] != kIgnoreIndex && pre.labels[j] == kIgnoreIndex) ++j;
      allowed = j < gen.labels.size() && pre.labels[j] != kIgnoreIndex;
    } else {  // prefix only: whitespace, or the later piece of a split character
      allowed = std::all_of(b.begin(), b.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }) ||
                (!b.empty() && (static_cast<unsigned char>(b[0]) & 0xC0) == 0x80);
    }
    ok = ok && allowed;
    if (!allowed) *diff += (g ? " markers-only " : " prefix-only ") + tok.describe_ids({gen.input_ids[i]});
  }
  return ok;
}

TEST(ConversationMasks, GenerationMarkersAndPrefixRenderingAgreeOnTokens) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const Tokenizer& tok = smollm2_tokenizer(fx);
  const std::regex open(R"(\{%(-?)\s*generation\s*(-?)%\})"), close(R"(\{%(-?)\s*endgeneration\s*(-?)%\})");
  MaskOptions opt;
  opt.assistant_only_loss = true;
  size_t agree = 0, refused = 0, compared = 0;
  for (const auto& t : fx["templates"]) {
    if (!t["tagged"].get<bool>()) continue;
    const std::string src = t["source"].get<std::string>();
    const chat::ChatTemplate tagged(src, t["name"].get<std::string>());
    const chat::ChatTemplate plain(std::regex_replace(std::regex_replace(src, open, "{%$1 if true $2%}"), close,
                                                      "{%$1 endif $2%}"),
                                   t["name"].get<std::string>() + " (markers as if)");
    ASSERT_FALSE(plain.has_generation_blocks());
    for (const auto& [name, row_json] : fx["rows"].items()) {
      if (name == "train_false_first") continue;
      const ConversationRow row = row_of(row_json, name);
      Example gen, pre;
      try {
        gen = conversation_example(row, tok, &tagged, opt);
        pre = conversation_example(row, tok, &plain, opt);
      } catch (const Error&) {
        ++refused;  // the template refuses the row, or is not prefix-stable
        continue;
      }
      ++compared;
      ASSERT_EQ(gen.input_ids, pre.input_ids) << t["name"] << " / " << name;
      std::string diff;
      const bool same = markers_and_prefix_agree(gen, pre, tok, &diff);
      agree += same;
      EXPECT_TRUE(same) << t["name"] << " / " << name << ": the markers and prefix rendering disagree:" << diff;
    }
  }
  std::cout << "[conversation_masks] markers vs prefix rendering: " << agree << "/" << compared
            << " rows agree token for token, " << refused << " not comparable (the template refuses the row or is not prefix-stable)\n";
  EXPECT_GT(compared, 50u);
}

// The SentencePiece side of laying tokens back onto the text ("▁" pieces, byte fallback): the
// repository's data/tokenizer with trl's qwen2_5_training template, against transformers.
TEST(ConversationMasks, MatchTransformersWithASentencePieceTokenizer) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const Tokenizer tok = Tokenizer::load((::alpaca::testing::source_dir() / "data/tokenizer").string());
  ASSERT_EQ(tok.format(), "sentencepiece");
  std::ifstream in(fixture() / fx["trl_template"].get<std::string>());
  const chat::ChatTemplate tmpl(std::string(std::istreambuf_iterator<char>(in), {}), "qwen2_5_training");
  MaskOptions opt;
  opt.assistant_only_loss = true;
  ASSERT_GE(fx["sentencepiece_cases"].size(), 3u);
  for (const auto& c : fx["sentencepiece_cases"]) {
    const std::string name = c["row"].get<std::string>();
    const Example ex = conversation_example(row_of(fx["rows"][name], name), tok, &tmpl, opt);
    EXPECT_EQ(ex.input_ids, c["input_ids"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(mask_of(ex), c["mask"].get<std::vector<int64_t>>()) << name;
  }
}

// Tokens that do not spell the text (an <unk>, an NFC normalizer on decomposed text, lowercasing) are
// laid back where the following tokens spell it again: the masks transformers' offsets give.
TEST(ConversationMasks, MatchTransformersWhereTokensRewriteTheText) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  std::ifstream in(fixture() / fx["trl_template"].get<std::string>());
  const chat::ChatTemplate tmpl(std::string(std::istreambuf_iterator<char>(in), {}), "qwen2_5_training");
  MaskOptions opt;
  opt.assistant_only_loss = true;
  std::map<std::string, Tokenizer> toks;
  size_t with_unk = 0;
  ASSERT_EQ(fx["rewriting_cases"].size(), 9u);
  for (const auto& c : fx["rewriting_cases"]) {
    const std::string name = c["tokenizer"].get<std::string>() + "/" + c["row"].get<std::string>();
    const std::string dir = (fixture() / "rewriting" / c["tokenizer"].get<std::string>()).string();
    const Tokenizer& tok = toks.try_emplace(dir, Tokenizer::load(dir)).first->second;
    const Example ex = conversation_example(row_of(c, name), tok, &tmpl, opt);
    EXPECT_EQ(ex.input_ids, c["input_ids"].get<std::vector<int64_t>>()) << name;
    const std::vector<int64_t> got = mask_of(ex), want = c["mask"].get<std::vector<int64_t>>();
    std::string where;
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      if (got[i] != want[i]) where += " " + std::to_string(i) + " (" + tok.describe_ids({ex.input_ids[i]}) + ")";
    EXPECT_EQ(got, want) << name << ": tokens differing:" << where;
    with_unk += c["unk"].get<bool>() ? 1 : 0;
  }
  EXPECT_GE(with_unk, 2u) << "the Unigram rows must hold <unk> tokens";
}

// Segment ids of a TRL row: the k-th of its seq_lengths documents is segment k (one for unpacked rows).
std::vector<int64_t> segments_of(const json& seq_lengths) {
  std::vector<int64_t> seg;
  int64_t k = 0;
  for (int64_t n : seq_lengths.get<std::vector<int64_t>>()) seg.insert(seg.end(), static_cast<size_t>(n), k++);
  return seg;
}

// `got` equals TRL's rows `want` ({input_ids, labels, position_ids, seq_lengths} after its collator)
// one for one, in order; packed blocks also in position and segment ids.
void expect_same_rows(const std::vector<Example>& got, const json& want, bool packed, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].input_ids, want[i]["input_ids"].get<std::vector<int64_t>>()) << where << " row " << i;
    EXPECT_EQ(got[i].labels, want[i]["labels"].get<std::vector<int64_t>>()) << where << " row " << i;
    if (!packed) continue;
    EXPECT_EQ(got[i].position_ids, want[i]["position_ids"].get<std::vector<int64_t>>()) << where << " row " << i;
    EXPECT_EQ(got[i].segment_ids, segments_of(want[i]["seq_lengths"])) << where << " row " << i;
  }
}

// TRL 1.16's labels: SFTTrainer._prepare_dataset (+ pack_dataset with packing) and its collator, on
// the same rows: ids, labels and (packing) the blocks themselves, in TRL's order.
TEST(ConversationMasks, MatchTrlSftTrainerLabels) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  Tokenizer tok = Tokenizer::load(fx["model_dir"].get<std::string>());
  tok.add_missing_special_tokens();  // as train and preprocess do
  size_t num_rows = 0, num_packed_sets = 0;
  for (const auto& s : fx["trl"]) {
    Tokenizer set_tok = tok;
    // SFTConfig.eos_token (--eos_token): the tokenizer's eos for the set.
    if (s.contains("eos_token") && !s["eos_token"].is_null()) set_tok.set_eos_token(s["eos_token"].get<std::string>());
    const bool packing = s["packing"].get<bool>();
    const std::string strategy = s["packing_strategy"].get<std::string>();
    const std::string where = s["name"].get<std::string>() + (packing ? " (packing " + strategy + ")" : "");
    std::optional<bool> col;
    if (!s["completion_only_loss"].is_null()) col = s["completion_only_loss"].get<bool>();
    const int64_t max_len = s["max_length"].get<int64_t>();
    const MaskOptions opt = run_mask_options(s["assistant_only_loss"].get<bool>(), col, max_len, packing, strategy);
    MaskStats st;
    // SFTConfig's dataset_text_field (text rows in another field: --dataset_text_field).
    const RowFormat format(DatasetFormat::kAuto, s.value("dataset_text_field", std::string("text")));
    auto examples = load_examples((fixture() / s["data"].get<std::string>()).string(), format, set_tok,
                                  fx["model_dir"].get<std::string>(), fixture() / s.value("template", fx["trl_template"].get<std::string>()),
                                  opt, 1, &st);
    if (packing) {
      examples = pack_examples(examples, max_len, nullptr, parse_packing_strategy(strategy));
      ++num_packed_sets;
    }
    expect_same_rows(examples, s["examples"], packing, where);
    if (packing) {
      EXPECT_EQ(st.num_dropped, 0) << where;  // kept instead, as TRL keeps them
    }
    num_rows += s["examples"].size();
  }
  std::cout << "[conversation_masks] TRL SFTTrainer labels: " << fx["trl"].size() << " sets (" << num_packed_sets
            << " packed), " << num_rows << " rows/blocks token-exact\n";
}

// The packer alone against TRL's pack_dataset + collator over 2,300 rows (three map batches of
// 1,000), bfd and wrapped: every block, in order.
TEST(ConversationMasks, PackingMatchesTrlPackDataset) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const json& pd = fx["pack_dataset"];
  std::vector<Example> rows(pd["rows"]["input_ids"].size());
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].input_ids = pd["rows"]["input_ids"][i].get<std::vector<int64_t>>();
    rows[i].labels = pd["rows"]["labels"][i].get<std::vector<int64_t>>();
  }
  const int64_t seq_length = pd["seq_length"].get<int64_t>();
  for (const char* name : {"bfd", "wrapped"}) {
    PackingStats st;
    const auto blocks = pack_examples(rows, seq_length, &st, parse_packing_strategy(name));
    expect_same_rows(blocks, pd["packed"][name], true, name);
    std::cout << "[conversation_masks] pack_dataset " << name << ": " << rows.size() << " rows -> " << st.num_blocks
              << " blocks identical to TRL's (" << st.num_truncated << " truncated, fill " << st.fill_ratio << ")\n";
  }
  EXPECT_THROW(parse_packing_strategy("bfd_split"), Error);
  EXPECT_THROW(parse_packing_strategy("greedy"), Error);
}

// Every named special token transformers passes to the template (special_tokens_map: unk, pad,
// sep, cls, mask, model-specific), as train renders rows and generate --chat renders prompts.
TEST(ConversationMasks, TemplatesGetEveryNamedSpecialToken) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  json r = {{"messages", fx["special_tokens"]["messages"]}};
  const ConversationRow row = parse_dataset_rows(r.dump(), "special").at(0);
  for (const auto& c : fx["special_tokens"]["cases"]) {
    const Tokenizer tok = Tokenizer::load(c["dir"].get<std::string>());
    const chat::ChatTemplate tmpl(c["template"].get<std::string>(), "special tokens");
    const json got = json::parse(template_special_tokens_json(tok));
    EXPECT_EQ(got, c["special_tokens_map"]) << c["dir"];
    const bool agp = c["add_generation_prompt"].get<bool>();
    json ctx = got;
    ctx["messages"] = fx["special_tokens"]["messages"];
    ctx["add_generation_prompt"] = agp;
    EXPECT_EQ(tmpl.render(ctx.dump()).text, c["text"].get<std::string>()) << c["dir"];
    if (agp) {  // generate --chat's prompt
      EXPECT_EQ(generate::chat_prompt(tmpl, ctx["messages"].dump(), template_special_tokens_json(tok)),
                c["text"].get<std::string>())
          << c["dir"];
    } else {  // training renders without the generation prompt
      EXPECT_EQ(conversation_example(row, tok, &tmpl, {}).input_ids, c["input_ids"].get<std::vector<int64_t>>())
          << c["dir"];
    }
  }
}

// The truncation policy (conversation_example.h), whole-sequence mode: a cut in a user turn drops
// the labels after the last assistant span; a cut inside an assistant turn keeps them.
TEST(ConversationMasks, TruncationNeverTrainsAPartialTurn) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const Tokenizer& tok = smollm2_tokenizer(fx);
  const chat::ChatTemplate tmpl(fx["templates"][0]["source"].get<std::string>(), "smollm2");
  const ConversationRow row = row_of(fx["rows"]["system_two_turns"], "two turns");
  MaskOptions assistant;
  assistant.assistant_only_loss = true;
  const Example a = conversation_example(row, tok, &tmpl, assistant);
  const Example all = conversation_example(row, tok, &tmpl, {});
  ASSERT_EQ(all.labels, all.input_ids);  // TRL's default: every token
  // First assistant span: its last trained token; the second: its first.
  size_t end1 = 0, begin2 = 0;
  for (size_t t = 1; t < a.labels.size(); ++t) {
    if (a.labels[t] != kIgnoreIndex && a.labels[t - 1] == kIgnoreIndex && end1) begin2 = t;
    if (a.labels[t] == kIgnoreIndex && a.labels[t - 1] != kIgnoreIndex && !end1) end1 = t - 1;
  }
  ASSERT_GT(end1, 0u);
  ASSERT_GT(begin2, end1 + 6);
  for (int64_t len : {static_cast<int64_t>(end1) + 4, static_cast<int64_t>(begin2) - 1}) {  // in the user turn, in the header
    bool cut = false;
    const Example ex = conversation_example(row, tok, &tmpl, {false, std::nullopt, len}, &cut);
    ASSERT_TRUE(cut);
    ASSERT_EQ(ex.input_ids, std::vector<int64_t>(all.input_ids.begin(), all.input_ids.begin() + len));
    for (int64_t t = 0; t < len; ++t)
      EXPECT_EQ(ex.labels[t], t <= static_cast<int64_t>(end1) ? ex.input_ids[t] : kIgnoreIndex) << "len " << len << " t " << t;
    const Example ea = conversation_example(row, tok, &tmpl, {true, std::nullopt, len});
    EXPECT_EQ(ea.labels, std::vector<int64_t>(a.labels.begin(), a.labels.begin() + len));  // TRL keep_start
  }
  const int64_t inside = static_cast<int64_t>(begin2) + 2;  // in the second answer: everything kept trains
  const Example ex = conversation_example(row, tok, &tmpl, {false, std::nullopt, inside});
  EXPECT_EQ(ex.labels, ex.input_ids);
}

TEST(ConversationMasks, MixedAlpacaAndConversationFiles) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  Tokenizer tok = Tokenizer::load(fx["model_dir"].get<std::string>());
  tok.add_missing_special_tokens();
  TempDir dir("mixed_masks");
  write(dir.path() / "a.json", R"([{"instruction": "Add 2 and 2.", "input": "", "output": "4"},
                                   {"instruction": "Name a colour.", "input": "sky", "output": "Blue."}])");
  write(dir.path() / "m.jsonl", json({{"messages", fx["rows"]["one_turn"]["messages"]}}).dump() + "\n");
  const std::string paths = (dir.path() / "a.json").string() + "," + (dir.path() / "m.jsonl").string();
  MaskStats st;
  const auto got = load_examples(paths, DatasetFormat::kAuto, tok, fx["model_dir"].get<std::string>(), {},
                                 {true, std::nullopt, 512}, 2, &st);
  ASSERT_EQ(got.size(), 3u);
  const auto alpaca = tokenize_alpaca(load_dataset((dir.path() / "a.json").string()).alpaca_records(), tok, 512, 1);
  EXPECT_EQ(got[0].input_ids, alpaca[0].input_ids);
  EXPECT_EQ(got[0].labels, alpaca[0].labels);
  EXPECT_EQ(got[1].labels, alpaca[1].labels);
  const chat::ChatTemplate tmpl = chat::ChatTemplate::load(fx["model_dir"].get<std::string>());
  const Example conv = conversation_example(row_of(fx["rows"]["one_turn"], "m"), tok, &tmpl, {true, std::nullopt, 512});
  EXPECT_EQ(got[2].labels, conv.labels);
  EXPECT_EQ(st.num_rows, 3);
  EXPECT_EQ(st.num_tokens, static_cast<int64_t>(got[0].input_ids.size() + got[1].input_ids.size() + got[2].input_ids.size()));
  EXPECT_NE(describe_mask_stats(st, 512).find("trained " + std::to_string(st.num_trained) + " of " +
                                              std::to_string(st.num_tokens) + " tokens"),
            std::string::npos);
}

// Bad input through `alpaca-train preprocess` and `alpaca-train train`: a non-zero exit, an error
// naming the row or the template line, and nothing written.
struct BadCase {
  const char* name;
  const char* jsonl;
  const char* extra;  // flags
  const char* expect;
};

TEST(ConversationMasks, BadInputIsAClearErrorAndWritesNothing) {
  SKIP_WITHOUT_FIXTURE();
  const json fx = load_fixture();
  const std::string model = fx["model_dir"].get<std::string>();
  TempDir dir("bad_masks");
  write(dir.path() / "broken.jinja", "{% for m in messages %}{{ m.content }}\n{% if %}{% endfor %}");
  const std::string broken = " --chat_template " + (dir.path() / "broken.jinja").string();
  const BadCase cases[] = {
      {"unknown_role", R"({"messages": [{"role": "robot", "content": "beep"}]})", "", "unknown role \"robot\""},
      {"no_content", R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]})", "",
       "an assistant turn with no content"},
      {"empty_mask", R"({"messages": [{"role": "user", "content": "Hi"}]})", " --assistant_only_loss True",
       "row 0: no token of this row is trained"},
      {"all_train_false",
       R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "train": false}]})",
       " --assistant_only_loss True", "row 0: no token of this row is trained"},
      {"template_error", R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})",
       broken.c_str(), "line 2"},
  };
  for (const auto& c : cases) {
    const fs::path data = dir.path() / (std::string(c.name) + ".jsonl");
    write(data, std::string(c.jsonl) + "\n");
    const fs::path out = dir.path() / (std::string(c.name) + "_out");
    std::string log;
    int rc = ::alpaca::testing::run_command(::alpaca::testing::train_bin() + " preprocess --data_path " + data.string() +
                                                " --model_name_or_path " + model + " --output " + out.string() + c.extra,
                                            &log);
    EXPECT_NE(rc, 0) << c.name << "\n" << log;
    EXPECT_NE(log.find(c.expect), std::string::npos) << c.name << ": " << log;
    EXPECT_FALSE(fs::exists(out)) << c.name;
    rc = ::alpaca::testing::run_command(::alpaca::testing::train_bin() + " train --data_path " + data.string() +
                                            " --model_name_or_path " + model + " --output_dir " + out.string() +
                                            " --max_steps 1" + c.extra,
                                        &log);
    EXPECT_NE(rc, 0) << c.name << "\n" << log;
    EXPECT_NE(log.find(c.expect), std::string::npos) << c.name << ": " << log;
    EXPECT_TRUE(!fs::exists(out) || fs::is_empty(out)) << c.name << ": train wrote into its output_dir";
  }
}

}  // namespace
}  // namespace alpaca::data::test_conversation_masks

// A module's test files compile as one unit (tests/CMakeLists.txt): this file's macros end here.
#undef SKIP_WITHOUT_FIXTURE
