// tokenizer.json reader and runner with the `tokenizers` library's semantics (see hf_tokenizer.h):
// the composition of the components, each in the file named after the crate's module.
// The pipeline of `Tokenizer::encode` in the library:
//   1. added tokens with normalized=false are split out of the raw text (leftmost-longest,
//      lstrip/rstrip/single_word applied; added_vocabulary.h);
//   2. every other piece is normalized on its own (normalizers.h), then added tokens with
//      normalized=true are split out of it (matched in their normalized form);
//   3. the pre-tokenizer splits the pieces further (pre_tokenizers.h); empty pieces are dropped
//      after every step;
//   4. the model (BPE, Unigram, WordPiece, WordLevel; tokenizer_model.h) turns each piece into ids;
//   5. with add_special_tokens the post-processor (processors.h) adds its template's special tokens.
// decode runs the decoder chain (decoders.h).
#include "hf_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <sstream>

#include "added_vocabulary.h"
#include "alpaca/util/error.h"
#include "decoders.h"
#include "json_context.h"
#include "json_numbers.h"
#include "normalizers.h"
#include "pre_tokenizers.h"
#include "processors.h"
#include "tokenizer_model.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {
namespace {

// The tokenizer.json "model": BPE (bpe.cpp), Unigram (unigram.cpp), WordPiece (wordpiece.cpp),
// WordLevel (wordlevel.cpp). A model without "type" (old files) is read as the crate's untagged
// deserializer guesses it from its fields, in its order: BPE has merges, WordPiece its prefix and
// length limit, WordLevel a {token: id} vocab, Unigram a [piece, score] list.
std::unique_ptr<TokenizerModel> parse_model(const json& j, const JsonContext& ctx) {
  if (!j.is_object()) ctx.fail("model", "must be a JSON object");
  std::string t = j.contains("type") ? ctx.str(j, "type", "model") : "";
  if (t.empty())
    t = j.contains("merges")                                      ? "BPE"
        : j.contains("max_input_chars_per_word")                  ? "WordPiece"
        : j.contains("vocab") && j.at("vocab").is_object()        ? "WordLevel"
                                                                  : "Unigram";
  if (t == "BPE") return parse_bpe(j, ctx.file());
  if (t == "Unigram") return parse_unigram(j, ctx.file());
  if (t == "WordPiece") return parse_wordpiece(j, ctx.file());
  if (t == "WordLevel") return parse_wordlevel(j, ctx.file());
  ctx.unsupported("model", "model type", t, "BPE, Unigram, WordPiece, WordLevel");
}

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  json doc;  // the document as read; to_json() refreshes its added_tokens
  std::unique_ptr<TokenizerModel> model;  // BPE, Unigram, WordPiece or WordLevel
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::optional<PostProcessor> post_processor;
  std::optional<Decoder> decoder;
  AddedVocabulary added;
  // token_bytes of every id, made on first use (masking asks it for every token of every row);
  // dropped when the added tokens change. Read and set with std::atomic_load/atomic_store.
  std::shared_ptr<const std::vector<std::string>> bytes_by_id;

  void rebuild() {
    std::atomic_store(&bytes_by_id, std::shared_ptr<const std::vector<std::string>>());
    added.rebuild(normalizer ? &*normalizer : nullptr);
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special) const {
    std::vector<Piece> pieces{Piece{text, -1, true}};
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) { added.split(p, false, sub); });
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& sub) {
      if (normalizer) normalizer->normalize(p.s);
      added.split(p, true, sub);
    });
    if (pre_tokenizer) pre_tokenizer->apply(pieces);
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const auto& p : pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        model->tokenize(p.s, &ids);
      }
    }
    if (add_special && post_processor) post_processor->apply(ids);
    return ids;
  }

  std::optional<int64_t> token_to_id(const std::string& t) const {
    auto it = added.index.find(t);
    if (it != added.index.end()) return added.tokens[it->second].id;
    return model->lookup(t);
  }

  int64_t size() const {
    int64_t n = static_cast<int64_t>(model->id_to_token().size());
    if (!added.tokens.empty()) n = std::max(n, added.tokens.back().id + 1);
    return n;
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ALPACA_CHECK(in.good(), "cannot open " << path << " for reading; check the path and permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_string(ss.str(), path);
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json_string(const std::string& text,
                                                           const std::string& source) {
  json doc;
  try {
    doc = detail::parse_json_as_serde(text);  // the library's numbers (json_numbers.h)
  } catch (const json::exception& e) {
    ALPACA_FAIL(source << ": not valid JSON (" << e.what()
                       << "); a tokenizer.json as written by the `tokenizers` library is expected");
  }
  return from_json(std::move(doc), source);
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(json doc, const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  JsonContext ctx(source);
  impl->doc = std::move(doc);
  const json& d = impl->doc;
  ALPACA_CHECK(d.is_object() && d.contains("model"),
               source << ": not a tokenizer.json (a JSON object with \"model\", \"added_tokens\", "
                         "\"normalizer\", \"pre_tokenizer\", \"post_processor\", \"decoder\")");
  for (const char* k : {"truncation", "padding"})
    if (d.contains(k) && !d.at(k).is_null())
      ctx.fail(k, "is not supported in tokenizer.json (expected null; transformers sets these per call)");
  impl->model = parse_model(d.at("model"), ctx);
  if (d.contains("normalizer") && !d.at("normalizer").is_null())
    impl->normalizer = Normalizer::parse(d.at("normalizer"), ctx, "normalizer");
  if (d.contains("pre_tokenizer") && !d.at("pre_tokenizer").is_null())
    impl->pre_tokenizer = PreTokenizer::parse(d.at("pre_tokenizer"), ctx, "pre_tokenizer");
  if (d.contains("post_processor") && !d.at("post_processor").is_null())
    impl->post_processor = PostProcessor::parse(d.at("post_processor"), ctx, "post_processor");
  if (d.contains("decoder") && !d.at("decoder").is_null())
    impl->decoder = Decoder::parse(d.at("decoder"), ctx, "decoder");
  impl->added.parse(impl->doc, ctx);
  impl->rebuild();
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

std::unique_ptr<HfTokenizer> HfTokenizer::clone() const {
  return from_json_string(to_json(), impl_->source);
}

void HfTokenizer::set_post_processor(const json& processor) {
  impl_->post_processor = PostProcessor::parse(processor, JsonContext(impl_->source), "post_processor");
  impl_->doc["post_processor"] = processor;
}

const std::string& HfTokenizer::source() const { return impl_->source; }
const json& HfTokenizer::document() const { return impl_->doc; }

std::vector<int64_t> HfTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  const int64_t n = size();
  for (int64_t id : ids) {
    ALPACA_CHECK(id >= 0, "token id " << id << " is negative");
    if (id >= n) continue;  // past the vocabulary (a model's padded rows): `tokenizers` decodes it as nothing
    auto it = impl_->added.by_id.find(id);
    if (it != impl_->added.by_id.end()) {
      const AddedToken& t = impl_->added.tokens[it->second];
      if (skip_special && t.special) continue;
      auto nf = impl_->added.normalized_form.find(id);
      tokens.push_back(nf != impl_->added.normalized_form.end() ? nf->second : t.content);
      continue;
    }
    if (static_cast<size_t>(id) >= impl_->model->id_to_token().size() ||
        impl_->model->id_to_token()[static_cast<size_t>(id)].empty())
      continue;  // a hole in the vocabulary: the library skips it
    const std::string& piece = impl_->model->id_to_token()[static_cast<size_t>(id)];
    if (skip_special) {  // the library skips by content: a vocabulary id whose piece is a special added token too
      auto a = impl_->added.index.find(piece);
      if (a != impl_->added.index.end() && impl_->added.tokens[a->second].special) continue;
    }
    tokens.push_back(piece);
  }
  if (!impl_->decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  impl_->decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string sentencepiece_piece_bytes(const std::string& piece) {
  if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>' &&
      std::isxdigit(static_cast<unsigned char>(piece[3])) && std::isxdigit(static_cast<unsigned char>(piece[4])))
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  static const std::string kUnderline = "\xE2\x96\x81";  // "▁"
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kUnderline.size(), kUnderline) == 0) {
      out.push_back(' ');
      i += kUnderline.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

std::string HfTokenizer::token_bytes(int64_t id) const {
  ALPACA_CHECK(id >= 0, "token id " << id << " is negative");
  if (id >= size()) return "";  // past the vocabulary: decodes as nothing
  auto table = std::atomic_load(&impl_->bytes_by_id);
  if (!table) {  // two threads may both make it: the same table either way
    auto made = std::make_shared<std::vector<std::string>>(static_cast<size_t>(size()));
    for (int64_t i = 0; i < size(); ++i) (*made)[static_cast<size_t>(i)] = compute_token_bytes(i);
    table = made;
    std::atomic_store(&impl_->bytes_by_id, table);
  }
  return (*table)[static_cast<size_t>(id)];
}

std::string HfTokenizer::compute_token_bytes(int64_t id) const {
  auto it = impl_->added.by_id.find(id);
  if (it != impl_->added.by_id.end()) return impl_->added.tokens[it->second].content;
  if (static_cast<size_t>(id) >= impl_->model->id_to_token().size()) return {};
  const std::string& piece = impl_->model->id_to_token()[static_cast<size_t>(id)];
  if (impl_->decoder && impl_->decoder->has_byte_level()) {
    const auto& table = char_to_byte();
    std::string bytes;
    for (size_t i = 0, len = 0; i < piece.size(); i += len) {
      auto b = table.find(decode_utf8(piece, i, &len));
      if (b == table.end()) return piece;  // not a byte-level piece: as written
      bytes.push_back(static_cast<char>(b->second));
    }
    return bytes;
  }
  if (std::string(impl_->model->type()) == "WordPiece")  // a word's text; "##" (the prefix) marks a continuation
    return piece.compare(0, 2, "##") == 0 ? piece.substr(2) : piece;
  return sentencepiece_piece_bytes(piece);
}

int64_t HfTokenizer::size() const { return impl_->size(); }
const char* HfTokenizer::model_type() const { return impl_->model->type(); }
int64_t HfTokenizer::model_size() const {
  return static_cast<int64_t>(impl_->model->id_to_token().size());
}

std::optional<int64_t> HfTokenizer::token_to_id(const std::string& token) const {
  return impl_->token_to_id(token);
}

std::optional<std::string> HfTokenizer::id_to_token(int64_t id) const {
  auto it = impl_->added.by_id.find(id);
  if (it != impl_->added.by_id.end()) return impl_->added.tokens[it->second].content;
  if (id >= 0 && static_cast<size_t>(id) < impl_->model->id_to_token().size() &&
      !impl_->model->id_to_token()[static_cast<size_t>(id)].empty())
    return impl_->model->id_to_token()[static_cast<size_t>(id)];
  return std::nullopt;
}

bool HfTokenizer::is_special(int64_t id) const {
  auto it = impl_->added.by_id.find(id);
  return it != impl_->added.by_id.end() && impl_->added.tokens[it->second].special;
}

const std::vector<AddedToken>& HfTokenizer::added_tokens() const { return impl_->added.tokens; }

int64_t HfTokenizer::add_token(const std::string& content, bool special, bool lstrip, bool replace_flags) {
  ALPACA_CHECK(!content.empty(), "cannot add an empty token to the tokenizer");
  auto it = impl_->added.index.find(content);
  if (it != impl_->added.index.end()) {
    AddedToken& t = impl_->added.tokens[it->second];
    if (replace_flags) {
      t.special = special, t.normalized = !special, t.lstrip = lstrip, t.rstrip = false, t.single_word = false;
      impl_->rebuild();
    } else if (special && !t.special) {  // re-adding with other properties replaces them
      t.special = true;
      t.normalized = false;
      impl_->rebuild();
    }
    return t.id;
  }
  AddedToken t;
  t.content = content;
  t.special = special;
  t.normalized = !special;
  t.lstrip = lstrip;
  t.id = impl_->model->lookup(content).value_or(impl_->size());
  impl_->added.tokens.push_back(t);
  impl_->rebuild();
  return t.id;
}

std::vector<int64_t> HfTokenizer::template_prefix() const {
  std::vector<int64_t> pre, post;
  if (impl_->post_processor) impl_->post_processor->affixes(&pre, &post);
  return pre;
}

std::vector<int64_t> HfTokenizer::template_suffix() const {
  std::vector<int64_t> pre, post;
  if (impl_->post_processor) impl_->post_processor->affixes(&pre, &post);
  return post;
}

std::string HfTokenizer::to_json() const {
  json doc = impl_->doc;
  json list = json::array();
  for (const auto& t : impl_->added.tokens) {
    json o = json::object();
    o["id"] = t.id;
    o["content"] = t.content;
    o["single_word"] = t.single_word;
    o["lstrip"] = t.lstrip;
    o["rstrip"] = t.rstrip;
    o["normalized"] = t.normalized;
    o["special"] = t.special;
    list.push_back(o);
  }
  doc["added_tokens"] = list;
  return doc.dump(-1, ' ', false, json::error_handler_t::strict) + "\n";
}

}  // namespace alpaca::tokenizer::detail
