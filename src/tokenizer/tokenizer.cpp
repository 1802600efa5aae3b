// Tokenizer: SentencePiece + HF special/added tokens, encoding as transformers' slow
// LlamaTokenizer, or a tokenizer.json run by detail::HfTokenizer (see the header). The HF json
// files are read and written here so that a saved directory round-trips through transformers'
// AutoTokenizer with the same ids.
#include "alpaca/tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "hf_tokenizer.h"
#include "tokenizer_model.h"
#include "tokenizer_class.h"
#include "tokenizer_json.h"

namespace alpaca::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSpieceUnderline = "\xE2\x96\x81";  // "▁"

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  ALPACA_CHECK(in.good(), "cannot open " << path << " for reading; check the path and permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const fs::path& path) {
  std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ALPACA_FAIL("tokenizer file " << path << " is not valid JSON (" << e.what()
                                  << "); fix or delete it");
  }
}

// A tokenizer.json document; HfTokenizer reports what is wrong inside it.
json read_json_doc(const fs::path& path) {
  std::string text = read_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ALPACA_FAIL(path.string() << ": not valid JSON (" << e.what()
                              << "); a tokenizer.json as written by the `tokenizers` library is expected");
  }
}

// HF writes a special token either as a plain string or as {"content": ..., ...} (AddedToken).
std::optional<std::string> token_string(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

// A true/false field of an AddedToken object ("special", "lstrip", "rstrip"): false when the
// token is a plain string or the field is absent; anything but a boolean is an error naming it.
bool token_flag(const json& v, const char* key, const fs::path& file) {
  if (!v.is_object() || !v.contains(key)) return false;
  ALPACA_CHECK(v[key].is_boolean(), "'" << key << "' of the added token " << v.dump() << " in " << file
                                        << " must be true or false");
  return v[key].get<bool>();
}

// Python's str.isspace (what 4.28.1's str.lstrip()/rstrip() strip beside an added token).
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point starting at s[i] and its byte length (s is UTF-8; invalid bytes count as one).
uint32_t code_point_at(const std::string& s, size_t i, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = (p[i] < 0x80) ? 1 : (p[i] >> 5) == 0x6 ? 2 : (p[i] >> 4) == 0xE ? 3 : (p[i] >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size() || n == 1) {
    *len = 1;
    return p[i];
  }
  uint32_t c = p[i] & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (p[i + k] & 0x3F);
  *len = n;
  return c;
}

void py_lstrip(std::string& s) {
  size_t i = 0, len = 0;
  while (i < s.size() && is_py_space(code_point_at(s, i, &len))) i += len;
  s.erase(0, i);
}

void py_rstrip(std::string& s) {
  while (!s.empty()) {
    size_t i = s.size() - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t len = 0;
    if (!is_py_space(code_point_at(s, i, &len)) || i + len != s.size()) break;
    s.erase(i);
  }
}

}  // namespace

struct Tokenizer::Impl {
  // Set: the tokenizer.json backend (everything SentencePiece below is unused then).
  std::unique_ptr<detail::HfTokenizer> hf;
  json hf_config = json::object();       // its tokenizer_config.json as read; save() updates it
  std::string tokenizer_class;           // the class transformers 5 builds (tokenizer_class.h)
  detail::TokenizerClassInfo cls;        // what that class's __init__ sets up
  std::string sep_token, cls_token, mask_token;  // tokenizer.json roles beyond bos/eos/unk/pad
  std::string source = "(in memory)";    // the file encoding runs from
  std::string model_bytes;               // serialized ModelProto, written back by save()
  sentencepiece::SentencePieceProcessor sp;
  // The same model with add_dummy_prefix off: what HF's non-legacy LlamaTokenizer encodes with.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_no_prefix;
  std::vector<AddedToken> added;         // every token matched before SentencePiece runs
  std::string bos_token, eos_token, unk_token;
  std::optional<std::string> pad_token;
  bool add_bos_token = true;
  bool add_eos_token = false;
  bool legacy = true;
  int64_t unk_token_length = 0;          // pieces of the unk string (non-legacy prefix trick)
  int64_t model_max_length = 0;          // 0 = not set
  std::unordered_map<std::string, int64_t> added_index;  // content -> index into `added`
  std::array<bool, 256> starts_token{};  // first bytes of added tokens: a quick split pre-check

  int64_t sp_size() const { return hf ? hf->model_size() : sp.GetPieceSize(); }

  std::optional<int64_t> sp_piece_id(const std::string& piece) const {
    if (hf) return std::nullopt;
    int id = sp.PieceToId(piece);
    if (id >= 0 && id < sp.GetPieceSize() && sp.IdToPiece(id) == piece) return id;
    return std::nullopt;
  }

  std::optional<int64_t> lookup(const std::string& token) const {
    if (hf) return hf->token_to_id(token);
    auto it = added_index.find(token);
    if (it != added_index.end()) return added[it->second].id;
    return sp_piece_id(token);
  }

  int64_t size() const {
    if (hf) return hf->size();
    int64_t n = sp_size();
    for (const auto& t : added) n = std::max(n, t.id + 1);
    return n;
  }

  // Registers `content` as a no-split token (HF _add_tokens): an existing piece keeps its id.
  int64_t add(const std::string& content, bool special, std::optional<int64_t> id = std::nullopt,
              bool lstrip = false, bool rstrip = false) {
    ALPACA_CHECK(!content.empty(), "cannot add an empty token to the tokenizer");
    if (hf) {
      const int64_t got = hf->add_token(content, special);
      ALPACA_CHECK(!id || *id == got, "tokenizer files disagree on the id of token '"
                                          << content << "' (" << got << " in tokenizer.json vs "
                                          << *id << "); fix tokenizer_config.json / added_tokens.json");
      return got;
    }
    auto it = added_index.find(content);
    if (it != added_index.end()) {
      AddedToken& t = added[it->second];
      ALPACA_CHECK(!id || *id == t.id, "tokenizer files disagree on the id of token '"
                                           << content << "' (" << t.id << " vs " << *id
                                           << "); fix tokenizer_config.json / added_tokens.json");
      t.special = t.special || special;
      return t.id;
    }
    int64_t new_id = id ? *id : sp_piece_id(content).value_or(size());
    ALPACA_CHECK(new_id >= 0, "token '" << content << "' has a negative id " << new_id);
    // Ids index the embedding rows and SentencePiece's int ids; one above int32 is a corrupt file
    // (and would overflow the vocabulary size).
    ALPACA_CHECK(new_id < (int64_t{1} << 31), "token '" << content << "' has the id " << new_id
                                                       << ", above any vocabulary (ids must be below 2^31); fix the tokenizer files");
    for (const auto& t : added)
      ALPACA_CHECK(t.id != new_id, "tokens '" << t.content << "' and '" << content
                                             << "' both claim id " << new_id
                                             << "; fix the tokenizer files");
    if (new_id < sp_size()) {
      ALPACA_CHECK(sp.IdToPiece(static_cast<int>(new_id)) == content,
                   "added token '" << content << "' claims id " << new_id
                                   << " which is SentencePiece piece '"
                                   << sp.IdToPiece(static_cast<int>(new_id)) << "'");
    }
    added_index[content] = static_cast<int64_t>(added.size());
    added.push_back(AddedToken{content, new_id, special, lstrip, rstrip});
    starts_token[static_cast<unsigned char>(content[0])] = true;
    return new_id;
  }

  void load_model(const std::string& bytes, const std::string& where) {
    model_bytes = bytes;
    // libsentencepiece's double-array builder (darts_clone) throws, rather than returning a
    // status, on some corrupt models (a zero-length piece): turn that into the same error.
    sentencepiece::util::Status status;
    try {
      status = sp.LoadFromSerializedProto(model_bytes);
    } catch (const std::exception& e) {
      ALPACA_FAIL("cannot load SentencePiece model " << where << ": " << e.what()
                                                      << "; the file is corrupt, use the checkpoint's tokenizer.model");
    }
    ALPACA_CHECK(status.ok(), "cannot load SentencePiece model " << where << ": "
                                  << status.ToString()
                                  << "; pass a directory holding tokenizer.model or the file");
    // A later occurrence of an embedded message merges into the earlier one (protobuf wire
    // rules), so appending normalizer_spec{add_dummy_prefix: false} (field 3 / field 3) turns
    // the dummy prefix off without needing the generated protobuf classes.
    static const std::string kNoDummyPrefix("\x1a\x02\x18\x00", 4);
    sp_no_prefix = std::make_unique<sentencepiece::SentencePieceProcessor>();
    try {
      status = sp_no_prefix->LoadFromSerializedProto(model_bytes + kNoDummyPrefix);
    } catch (const std::exception& e) {
      ALPACA_FAIL("cannot derive the no-prefix SentencePiece model from " << where << ": " << e.what());
    }
    ALPACA_CHECK(status.ok(), "cannot derive the no-prefix SentencePiece model from " << where);
  }

  void defaults_from_model() {
    auto piece = [&](int id) { return id >= 0 ? sp.IdToPiece(id) : std::string(); };
    bos_token = piece(sp.bos_id());
    eos_token = piece(sp.eos_id());
    unk_token = piece(sp.unk_id());
    if (sp.pad_id() >= 0) pad_token = piece(sp.pad_id());
  }

  // A token given as a plain string (train.py's "[PAD]", added_tokens.json, a string in
  // additional_special_tokens): transformers 4.28.1's slow tokenizer strips the whitespace on both
  // sides of such a token in the text (only AddedToken objects keep their own lstrip/rstrip).
  int64_t add_plain(const std::string& content, bool special, std::optional<int64_t> id = std::nullopt) {
    return add(content, special, id, /*lstrip=*/true, /*rstrip=*/true);
  }

  // HF marks bos/eos/unk/pad as no-split special tokens, so their strings in the text become ids.
  // 4.28.1's LlamaTokenizer wraps bos/eos/unk in AddedToken(lstrip=False, rstrip=False).
  void register_special_tokens() {
    if (hf) {  // a tokenizer.json may lack roles (LLaMA-3 has no unk and no pad): add those it names,
               // in transformers' SPECIAL_TOKENS_ATTRIBUTES order, then the class's extra ones
      for (const std::string* t : {&bos_token, &eos_token, &unk_token, &sep_token})
        if (!t->empty()) add(*t, true);
      if (pad_token && !pad_token->empty()) add(*pad_token, true);
      if (!cls_token.empty()) add(cls_token, true);
      if (!mask_token.empty()) hf->add_token(mask_token, true, cls.mask_lstrip);  // Blenderbot: lstrip
      for (const auto& t : cls.extra_specials) add(t, true);
      return;
    }
    ALPACA_CHECK(!bos_token.empty() && !eos_token.empty() && !unk_token.empty(),
                 "the tokenizer has no bos/eos/unk token; set them in tokenizer_config.json");
    add(unk_token, true);
    add(bos_token, true);
    add(eos_token, true);
    if (pad_token) add_plain(*pad_token, true);
    std::vector<int> unk_ids;
    sp_no_prefix->Encode(unk_token, &unk_ids);
    unk_token_length = static_cast<int64_t>(unk_ids.size());
  }

  void append_sp(const std::string& chunk, bool no_prefix, std::vector<int64_t>* out) const {
    std::vector<int> ids;
    auto status = (no_prefix ? *sp_no_prefix : sp).Encode(chunk, &ids);
    ALPACA_CHECK(status.ok(), "SentencePiece failed to encode text: " << status.ToString());
    out->insert(out->end(), ids.begin(), ids.end());
  }

  // HF non-legacy _tokenize: a chunk that starts with a space keeps exactly that space.
  void encode_chunk(const std::string& chunk, std::vector<int64_t>* out) const {
    if (legacy) return append_sp(chunk, false, out);
    bool leading_space = chunk.rfind(kSpieceUnderline, 0) == 0 || chunk.rfind(" ", 0) == 0;
    if (!leading_space) return append_sp(chunk, true, out);
    std::vector<int64_t> ids;
    append_sp(unk_token + chunk, true, &ids);
    // HF: tokens[unk_token_length:] if len(tokens) >= unk_token_length else tokens
    const int64_t skip = static_cast<int64_t>(ids.size()) >= unk_token_length ? unk_token_length : 0;
    out->insert(out->end(), ids.begin() + skip, ids.end());
  }

  // Splits `text` at added-token strings (leftmost, then longest match, like HF's Trie) and
  // encodes the pieces between them.
  std::vector<int64_t> encode_text(std::string text) const {
    std::vector<int64_t> out;
    if (text.empty()) return out;
    if (!legacy) {  // HF non-legacy: "▁" means a space, and one prefix space for the whole text
      std::string replaced;
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, 3, kSpieceUnderline) == 0) {
          replaced += ' ';
          i += 3;
        } else {
          replaced += text[i++];
        }
      }
      text = kSpieceUnderline + replaced;
    }
    struct Piece {
      std::string text;
      const AddedToken* token = nullptr;
    };
    std::vector<Piece> pieces;
    size_t start = 0;
    for (size_t i = 0; i < text.size();) {
      if (!starts_token[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const AddedToken* best = nullptr;
      for (const auto& t : added) {
        if (text.compare(i, t.content.size(), t.content) == 0 &&
            (!best || t.content.size() > best->content.size()))
          best = &t;
      }
      if (!best) {
        ++i;
        continue;
      }
      if (i > start) pieces.push_back({text.substr(start, i - start), nullptr});
      pieces.push_back({best->content, best});
      i += best->content.size();
      start = i;
    }
    if (start < text.size()) pieces.push_back({text.substr(start), nullptr});
    // lstrip/rstrip tokens eat the whitespace next to them.
    for (size_t i = 0; i < pieces.size(); ++i) {
      const AddedToken* t = pieces[i].token;
      if (!t) continue;
      if (t->rstrip && i + 1 < pieces.size() && !pieces[i + 1].token) py_lstrip(pieces[i + 1].text);
      if (t->lstrip && i > 0 && !pieces[i - 1].token) py_rstrip(pieces[i - 1].text);
    }
    bool first = true;
    bool drop_leading_underline = false;
    for (const auto& p : pieces) {
      if (p.token) {
        out.push_back(p.token->id);
      } else if (!p.text.empty()) {
        if (first && !legacy && p.text == kSpieceUnderline) drop_leading_underline = true;
        encode_chunk(p.text, &out);
      }
      first = false;
    }
    // HF non-legacy drops the prefix "▁" when a special token starts the text.
    if (drop_leading_underline && out.size() > 1) {
      bool next_special = false;
      for (const auto& t : added) next_special |= (t.special && t.id == out[1]);
      if (next_special) out.erase(out.begin());
    }
    return out;
  }

  // The post-processor TokenizersBackend.__init__ and the class's own __init__ leave (see
  // class_post_processor). from_pretrained drops add_bos_token / add_eos_token from
  // tokenizer_config.json whenever there is a tokenizer.json, so the config's flags do not count.
  void update_post_processor() {
    const json pp = detail::class_post_processor(cls, !hf_post_processor_json().is_null(),
                                                 {bos_token, eos_token, unk_token, sep_token, cls_token},
                                                 [&](const std::string& t) { return lookup(t); });
    if (!pp.is_null()) hf->set_post_processor(pp);
  }

  const json& hf_post_processor_json() const {
    static const json kNull;
    const json& doc = hf->document();
    return doc.contains("post_processor") ? doc.at("post_processor") : kNull;
  }

  bool is_special_id(int64_t id) const {
    if (hf) return hf->is_special(id);
    for (const auto& t : added)
      if (t.id == id && t.special) return true;
    return false;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer::Tokenizer(const Tokenizer& other) : impl_(std::make_unique<Impl>()) { *this = other; }

Tokenizer& Tokenizer::operator=(const Tokenizer& other) {
  if (this == &other) return *this;
  auto impl = std::make_unique<Impl>();
  const Impl& o = *other.impl_;
  if (o.hf) {
    impl->hf = o.hf->clone();
    impl->hf_config = o.hf_config;
    impl->tokenizer_class = o.tokenizer_class;
    impl->cls = o.cls;
    impl->source = o.source;
  } else {
    impl->load_model(other.impl_->model_bytes, "(copy)");
  }
  impl->added = o.added;
  impl->added_index = o.added_index;
  impl->starts_token = o.starts_token;
  impl->bos_token = o.bos_token;
  impl->eos_token = o.eos_token;
  impl->unk_token = o.unk_token;
  impl->pad_token = o.pad_token;
  impl->add_bos_token = o.add_bos_token;
  impl->add_eos_token = o.add_eos_token;
  impl->legacy = o.legacy;
  impl->unk_token_length = o.unk_token_length;
  impl->model_max_length = o.model_max_length;
  impl_ = std::move(impl);
  return *this;
}

Tokenizer Tokenizer::from_serialized_model(const std::string& model_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->load_model(model_bytes, "(in memory)");
  impl->defaults_from_model();
  impl->register_special_tokens();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& dir_or_file, bool use_fast) {
  fs::path path(dir_or_file);
  ALPACA_CHECK(fs::exists(path), "tokenizer path " << path << " does not exist");
  const bool is_dir = fs::is_directory(path);
  fs::path dir = is_dir ? path : path.parent_path();
  // tokenizer.model when present (stanford_alpaca's use_fast=False), else tokenizer.json;
  // use_fast (--use_fast_tokenizer) prefers tokenizer.json.
  fs::path file = path;
  if (is_dir) {
    const bool has_model = fs::is_regular_file(dir / "tokenizer.model");
    const bool has_json = fs::is_regular_file(dir / "tokenizer.json");
    ALPACA_CHECK(has_model || has_json,
                 "no tokenizer in " << dir
                                    << ": expected tokenizer.model (SentencePiece) or tokenizer.json "
                                       "(Hugging Face tokenizers); copy the tokenizer files of the "
                                       "checkpoint into the directory");
    file = has_json && (use_fast || !has_model) ? dir / "tokenizer.json" : dir / "tokenizer.model";
  }
  auto impl = std::make_unique<Impl>();
  json config = is_dir && fs::exists(dir / "tokenizer_config.json") ? read_json(dir / "tokenizer_config.json")
                                                                    : json::object();
  ALPACA_CHECK(config.is_object(), dir / "tokenizer_config.json" << " must hold a JSON object");
  detail::TokenizerClassInfo cls;
  if (file.extension() == ".json") {
    // transformers 5's class rule: a known tokenizer_class rebuilds the pipeline (tokenizer_class.h).
    json doc = read_json_doc(file);
    if (is_dir && doc.is_object() && doc.contains("model")) {
      json model_config = fs::exists(dir / "config.json") ? read_json(dir / "config.json") : json::object();
      cls = detail::apply_tokenizer_class(doc, config, model_config, file.string());
    }
    impl->hf = detail::HfTokenizer::from_json(std::move(doc), file.string());
    impl->source = file.string();
    impl->tokenizer_class = cls.name;
    impl->cls = cls;
  } else {
    impl->load_model(read_file(file), file.string());
    impl->defaults_from_model();
    impl->source = file.string();
  }
  if (!is_dir) {
    impl->register_special_tokens();
    return Tokenizer(std::move(impl));
  }

  // Explicit ids first (added_tokens_decoder, added_tokens.json) so later name-only tokens
  // cannot take their ids.
  if (impl->hf) {
    impl->hf_config = config;
    // The class's __init__ defaults for the roles the files leave out (LlamaTokenizer: <s>, </s>, <unk>).
    if (cls.bos) impl->bos_token = *cls.bos;
    if (cls.eos) impl->eos_token = *cls.eos;
    if (cls.unk) impl->unk_token = *cls.unk;
    if (cls.pad) impl->pad_token = *cls.pad;
    impl->sep_token = cls.sep.value_or("");
    impl->cls_token = cls.cls.value_or("");
    impl->mask_token = cls.mask.value_or("");
  }
  if (config.contains("added_tokens_decoder")) {
    const json& dec = config["added_tokens_decoder"];
    ALPACA_CHECK(dec.is_object(), "added_tokens_decoder in " << dir / "tokenizer_config.json"
                                                              << " must be an object");
    for (auto it = dec.begin(); it != dec.end(); ++it) {
      int64_t id = 0;
      try {
        id = std::stoll(it.key());
      } catch (const std::exception&) {
        ALPACA_FAIL("added_tokens_decoder key '" << it.key() << "' in "
                                                 << dir / "tokenizer_config.json"
                                                 << " is not an integer id");
      }
      auto content = token_string(it.value());
      ALPACA_CHECK(content, "added_tokens_decoder[" << it.key() << "] in "
                                                    << dir / "tokenizer_config.json"
                                                    << " has no string 'content'");
      const json& v = it.value();
      const fs::path file = dir / "tokenizer_config.json";
      impl->add(*content, token_flag(v, "special", file), id, token_flag(v, "lstrip", file),
                token_flag(v, "rstrip", file));
    }
  }
  if (fs::exists(dir / "added_tokens.json")) {
    json added = read_json(dir / "added_tokens.json");
    ALPACA_CHECK(added.is_object(), dir / "added_tokens.json" << " must map token -> id");
    for (auto it = added.begin(); it != added.end(); ++it) {
      ALPACA_CHECK(it.value().is_number_integer(),
                   "id of '" << it.key() << "' in " << dir / "added_tokens.json"
                             << " is not an integer");
      impl->add_plain(it.key(), false, it.value().get<int64_t>());
    }
  }
  json special_map = fs::exists(dir / "special_tokens_map.json")
                         ? read_json(dir / "special_tokens_map.json")
                         : json::object();
  ALPACA_CHECK(special_map.is_object(),
               dir / "special_tokens_map.json" << " must hold a JSON object");
  // Which special token each role names: special_tokens_map.json wins over tokenizer_config.
  auto role = [&](const char* key) -> std::optional<std::optional<std::string>> {
    for (const json* src : {&special_map, &config}) {
      if (!src->contains(key)) continue;
      const json& v = (*src)[key];
      if (v.is_null()) return std::optional<std::string>();
      auto s = token_string(v);
      ALPACA_CHECK(s, "'" << key << "' in the tokenizer files of " << dir
                          << " must be a string or an AddedToken object");
      return s;
    }
    return std::nullopt;
  };
  // tokenizer.json: an explicit null clears the class default, as a None kwarg does.
  if (auto v = role("bos_token"); v && (*v || impl->hf)) impl->bos_token = v->value_or("");
  if (auto v = role("eos_token"); v && (*v || impl->hf)) impl->eos_token = v->value_or("");
  if (auto v = role("unk_token"); v && (*v || impl->hf)) impl->unk_token = v->value_or("");
  if (auto v = role("pad_token")) impl->pad_token = *v;
  if (auto v = role("sep_token"); v && impl->hf) impl->sep_token = v->value_or("");
  if (auto v = role("cls_token"); v && impl->hf) impl->cls_token = v->value_or("");
  if (auto v = role("mask_token"); v && impl->hf) impl->mask_token = v->value_or("");
  for (const json* src : {&config, &special_map}) {
    for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
      if (!src->contains(key) || !(*src)[key].is_array()) continue;  // v5 may write a role map
      for (const json& t : (*src)[key]) {
        auto s = token_string(t);
        ALPACA_CHECK(s, key << " in the tokenizer files of " << dir << " must hold strings");
        if (t.is_object()) {
          const fs::path file = dir / (src == &config ? "tokenizer_config.json" : "special_tokens_map.json");
          impl->add(*s, true, std::nullopt, token_flag(t, "lstrip", file), token_flag(t, "rstrip", file));
        } else {
          impl->add_plain(*s, true);
        }
      }
    }
  }
  if (impl->hf) {
    impl->register_special_tokens();
    impl->update_post_processor();
    return Tokenizer(std::move(impl));
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
    impl->add_bos_token = config["add_bos_token"].get<bool>();
  if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
    impl->add_eos_token = config["add_eos_token"].get<bool>();
  if (config.contains("legacy") && config["legacy"].is_boolean())
    impl->legacy = config["legacy"].get<bool>();
  if (config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean())
    ALPACA_CHECK(config["add_prefix_space"].get<bool>(),
                 "add_prefix_space: false in " << dir / "tokenizer_config.json"
                                               << " is not supported; remove it");
  if (config.contains("model_max_length") && config["model_max_length"].is_number_integer())
    impl->model_max_length = config["model_max_length"].get<int64_t>();
  impl->register_special_tokens();
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  if (impl_->hf) return impl_->hf->encode(text, add_special_tokens);
  std::vector<int64_t> ids;
  if (add_special_tokens && impl_->add_bos_token) ids.push_back(bos_id());
  std::vector<int64_t> body = impl_->encode_text(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (add_special_tokens && impl_->add_eos_token) ids.push_back(eos_id());
  return ids;
}

std::vector<int64_t> Tokenizer::encode_truncated(const std::string& text, int64_t max_length,
                                                 bool* truncated) const {
  std::vector<int64_t> prefix, suffix;
  if (impl_->hf) {
    prefix = impl_->hf->template_prefix();
    suffix = impl_->hf->template_suffix();
  } else {
    if (impl_->add_bos_token) prefix.push_back(bos_id());
    if (impl_->add_eos_token) suffix.push_back(eos_id());
  }
  std::vector<int64_t> body = encode(text, false);
  const int64_t room = std::max<int64_t>(0, max_length - static_cast<int64_t>(prefix.size() + suffix.size()));
  const bool cut = static_cast<int64_t>(body.size()) > room;
  if (cut) body.resize(static_cast<size_t>(room));
  if (truncated) *truncated = cut;
  prefix.insert(prefix.end(), body.begin(), body.end());
  prefix.insert(prefix.end(), suffix.begin(), suffix.end());
  return prefix;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  if (impl_->hf) {
    std::string text = impl_->hf->decode(detail::class_decode_ids(impl_->cls, ids, pad_id()), skip_special);
    // TokenizersBackend._decode: clean_up_tokenization_spaces (default false) for non-BPE models.
    if (std::string(impl_->hf->model_type()) != "BPE" && impl_->hf_config.value("clean_up_tokenization_spaces", json(false)) == json(true))
      text = detail::clean_up_tokenization(std::move(text));
    if (impl_->cls.decode_suffix.empty()) return text;
    // CLIPTokenizer wraps the backend's decode: the word suffix becomes a space, then str.strip().
    const std::string& suffix = impl_->cls.decode_suffix;
    for (size_t at = text.find(suffix); at != std::string::npos; at = text.find(suffix, at + 1)) text.replace(at, suffix.size(), " ");
    const size_t b = text.find_first_not_of(" \t\n\r\f\v"), e = text.find_last_not_of(" \t\n\r\f\v");
    return b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  }
  std::string out;
  std::vector<int> run;  // consecutive SentencePiece ids, decoded together
  auto flush = [&] {
    if (run.empty()) return;
    out += impl_->sp.DecodeIds(run);
    run.clear();
  };
  const int64_t n = vocab_size();
  for (int64_t id : ids) {
    ALPACA_CHECK(id >= 0 && id < n, "token id " << id << " is outside the vocabulary [0, " << n
                                                << ")");
    bool special = impl_->is_special_id(id);
    if (special && skip_special) continue;
    auto it = std::find_if(impl_->added.begin(), impl_->added.end(),
                           [&](const AddedToken& t) { return t.id == id; });
    if (it != impl_->added.end()) {
      flush();
      out += it->content;
    } else {
      run.push_back(static_cast<int>(id));
    }
  }
  flush();
  return out;
}

std::string Tokenizer::token_bytes(int64_t id) const {
  if (impl_->hf) return impl_->hf->token_bytes(id);
  ALPACA_CHECK(id >= 0 && id < vocab_size(), "token id " << id << " is outside the vocabulary [0, " << vocab_size() << ")");
  for (const auto& t : impl_->added)
    if (t.id == id) return t.content;
  return detail::sentencepiece_piece_bytes(impl_->sp.IdToPiece(static_cast<int>(id)));
}

int64_t Tokenizer::vocab_size() const { return impl_->size(); }
int64_t Tokenizer::sp_vocab_size() const { return impl_->sp_size(); }
std::optional<int64_t> Tokenizer::pad_id() const {
  if (!impl_->pad_token) return std::nullopt;
  return impl_->lookup(*impl_->pad_token);
}
namespace {
int64_t role_id(const std::string& token, std::optional<int64_t> id, const char* role) {
  ALPACA_CHECK(!token.empty() && id, "the tokenizer has no " << role << " token"
                                                             << (token.empty() ? "" : " in its vocabulary")
                                                             << "; set " << role
                                                             << "_token in tokenizer_config.json");
  return *id;
}
}  // namespace

int64_t Tokenizer::bos_id() const { return role_id(impl_->bos_token, impl_->lookup(impl_->bos_token), "bos"); }
int64_t Tokenizer::eos_id() const { return role_id(impl_->eos_token, impl_->lookup(impl_->eos_token), "eos"); }
int64_t Tokenizer::unk_id() const { return role_id(impl_->unk_token, impl_->lookup(impl_->unk_token), "unk"); }
std::string Tokenizer::source() const { return impl_->source; }
std::string Tokenizer::tokenizer_class() const { return impl_->hf ? impl_->tokenizer_class : ""; }
std::string Tokenizer::describe_ids(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    std::optional<std::string> piece;
    if (impl_->hf) {
      piece = impl_->hf->id_to_token(id);
    } else if (id >= 0 && id < impl_->sp_size()) {
      piece = impl_->sp.IdToPiece(static_cast<int>(id));
    } else {
      for (const auto& t : impl_->added)
        if (t.id == id) piece = t.content;
    }
    out += (out.empty() ? "" : " ") + std::to_string(id) + " " + json(piece.value_or("?")).dump();
  }
  return out;
}
std::string Tokenizer::format() const { return impl_->hf ? "tokenizer.json" : "sentencepiece"; }
std::optional<std::string> Tokenizer::unk_token() const {
  if (impl_->unk_token.empty()) return std::nullopt;
  return impl_->unk_token;
}
std::string Tokenizer::bos_token() const { return impl_->bos_token; }
std::string Tokenizer::eos_token() const { return impl_->eos_token; }
std::optional<std::string> Tokenizer::pad_token() const { return impl_->pad_token; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->hf ? impl_->hf->added_tokens() : impl_->added;
}
std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  return impl_->lookup(token);
}

int64_t Tokenizer::add_special_token(const std::string& token) { return impl_->add_plain(token, true); }

void Tokenizer::set_pad_token(const std::string& token) {
  impl_->add_plain(token, true);
  impl_->pad_token = token;
}

void Tokenizer::set_model_max_length(int64_t n) { impl_->model_max_length = n; }

int64_t Tokenizer::add_missing_special_tokens() {
  Impl& m = *impl_;
  const int64_t before = vocab_size();
  // train.py: special_tokens_dict in this order, then tokenizer.add_special_tokens(dict).
  if (!m.pad_token) set_pad_token("[PAD]");
  if (m.eos_token.empty()) m.eos_token = "</s>", m.add_plain("</s>", true);
  if (m.bos_token.empty()) m.bos_token = "<s>", m.add_plain("<s>", true);
  if (m.unk_token.empty()) m.unk_token = "<unk>", m.add_plain("<unk>", true);
  return vocab_size() - before;
}

void Tokenizer::save(const std::string& dir_str) const {
  fs::path dir(dir_str);
  std::error_code ec;
  fs::create_directories(dir, ec);
  ALPACA_CHECK(!ec, "cannot create tokenizer directory " << dir << ": " << ec.message());
  const Impl& m = *impl_;
  auto write = [&](const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    ALPACA_CHECK(out.good(), "cannot write " << p);
    out << text;
    out.close();  // the last buffer is written here: a full disk shows up at close, not at <<
    ALPACA_CHECK(out.good(), "failed writing " << p << " (" << text.size()
                                               << " bytes; is the disk full?); free space and save again");
  };
  if (m.hf) {
    json config = m.hf_config;
    json decoder = json::object();
    for (const auto& t : m.hf->added_tokens())
      decoder[std::to_string(t.id)] = {{"content", t.content},   {"lstrip", t.lstrip},
                                       {"normalized", t.normalized}, {"rstrip", t.rstrip},
                                       {"single_word", t.single_word}, {"special", t.special}};
    config["added_tokens_decoder"] = decoder;
    json special_map = json::object();
    auto set_role = [&](const char* key, const std::string& token) {
      if (token.empty()) {
        config.erase(key);
      } else {
        config[key] = token;
        special_map[key] = token;
      }
    };
    set_role("bos_token", m.bos_token);
    set_role("eos_token", m.eos_token);
    set_role("unk_token", m.unk_token);
    set_role("pad_token", m.pad_token.value_or(""));
    if (m.model_max_length > 0) config["model_max_length"] = m.model_max_length;
    if (!config.contains("tokenizer_class")) config["tokenizer_class"] = "PreTrainedTokenizerFast";
    write(dir / "tokenizer.json", m.hf->to_json());
    write(dir / "tokenizer_config.json", config.dump(2) + "\n");
    write(dir / "special_tokens_map.json", special_map.dump(2) + "\n");
    return;
  }
  auto token_json = [](const std::string& content, bool special, bool lstrip, bool rstrip) {
    return json{{"content", content}, {"lstrip", lstrip},   {"normalized", !special},
                {"rstrip", rstrip},   {"single_word", false}, {"special", special}};
  };
  json decoder = json::object();
  std::vector<AddedToken> sorted = m.added;
  std::sort(sorted.begin(), sorted.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  json added_beyond = json::object();
  for (const auto& t : sorted) {
    decoder[std::to_string(t.id)] = token_json(t.content, t.special, t.lstrip, t.rstrip);
    if (t.id >= m.sp_size()) added_beyond[t.content] = t.id;
  }
  json config = {
      {"add_bos_token", m.add_bos_token},
      {"add_eos_token", m.add_eos_token},
      {"added_tokens_decoder", decoder},
      {"bos_token", m.bos_token},
      {"clean_up_tokenization_spaces", false},
      {"eos_token", m.eos_token},
      {"legacy", m.legacy},
      {"pad_token", m.pad_token ? json(*m.pad_token) : json(nullptr)},
      {"padding_side", "right"},
      {"sp_model_kwargs", json::object()},
      {"tokenizer_class", "LlamaTokenizer"},
      {"unk_token", m.unk_token},
  };
  if (m.model_max_length > 0) config["model_max_length"] = m.model_max_length;
  json special_map = {{"bos_token", m.bos_token}, {"eos_token", m.eos_token},
                      {"unk_token", m.unk_token}};
  if (m.pad_token) special_map["pad_token"] = *m.pad_token;
  json extra = json::array();
  for (const auto& t : sorted) {
    bool role = t.content == m.bos_token || t.content == m.eos_token ||
                t.content == m.unk_token || (m.pad_token && t.content == *m.pad_token);
    if (t.special && !role) extra.push_back(t.content);
  }
  if (!extra.empty()) special_map["additional_special_tokens"] = extra;

  detail::TokenizerJsonSpec spec;
  for (int i = 0; i < m.sp.GetPieceSize(); ++i) {
    spec.pieces.push_back(m.sp.IdToPiece(i));
    spec.scores.push_back(m.sp.GetScore(i));
  }
  spec.added = sorted;
  spec.unk_token = m.unk_token;
  spec.bos_token = m.bos_token;
  spec.eos_token = m.eos_token;
  spec.bos_id = bos_id();
  spec.eos_id = eos_id();
  spec.add_bos = m.add_bos_token;
  spec.add_eos = m.add_eos_token;
  spec.legacy = m.legacy;

  write(dir / "tokenizer.model", m.model_bytes);
  write(dir / "tokenizer.json", detail::make_tokenizer_json(spec));
  write(dir / "tokenizer_config.json", config.dump(2) + "\n");
  write(dir / "special_tokens_map.json", special_map.dump(2) + "\n");
  if (!added_beyond.empty()) write(dir / "added_tokens.json", added_beyond.dump(2) + "\n");
}

}  // namespace alpaca::tokenizer
