// The SentencePiece backend (backend.h): tokenizer.model plus the HF special/added tokens,
// encoding as transformers 4.28.1's slow LlamaTokenizer: the text is split on the added-token
// strings (leftmost-longest), every other chunk is encoded by SentencePiece on its own, special
// strings become their ids, BOS is prepended; save() writes the model, the HF json files and a
// tokenizer.json (tokenizer_json.h) so transformers 5 loads the directory with the same ids.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "alpaca/util/error.h"
#include "backend.h"
#include "tokenizer_json.h"
#include "tokenizer_model.h"
#include "utf8.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSpieceUnderline = "\xE2\x96\x81";  // "▁"

// Python's str.isspace (what 4.28.1's str.lstrip()/rstrip() strip beside an added token).
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// The slow tokenizer sees the text as Python does; an invalid byte is tested as its own value
// (Utf8Invalid::kByteValue, utf8.h).
uint32_t py_code_point(const std::string& s, size_t i, size_t* len) {
  return decode_utf8(s, i, len, Utf8Invalid::kByteValue);
}

void py_lstrip(std::string& s) {
  size_t i = 0, len = 0;
  while (i < s.size() && is_py_space(py_code_point(s, i, &len))) i += len;
  s.erase(0, i);
}

void py_rstrip(std::string& s) {
  while (!s.empty()) {
    const size_t i = utf8_prev(s, s.size());
    size_t len = 0;
    if (!is_py_space(py_code_point(s, i, &len)) || i + len != s.size()) break;
    s.erase(i);
  }
}

// HF non-legacy: "▁" in the text means a space, and one prefix "▁" for the whole text.
std::string non_legacy_text(const std::string& text) {
  std::string replaced;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, kSpieceUnderline) == 0) {
      replaced += ' ';
      i += 3;
    } else {
      replaced += text[i++];
    }
  }
  return kSpieceUnderline + replaced;
}

class SentencePieceBackend final : public Backend {
 public:
  std::unique_ptr<Backend> clone() const override {
    auto copy = std::make_unique<SentencePieceBackend>();
    copy->load_model(model_bytes, "(copy)");
    copy_common_state_to(*copy);
    copy->added = added;
    copy->added_index = added_index;
    copy->starts_token = starts_token;
    copy->add_bos_token = add_bos_token;
    copy->add_eos_token = add_eos_token;
    copy->legacy = legacy;
    copy->unk_token_length = unk_token_length;
    return copy;
  }

  const char* format() const override { return "sentencepiece"; }

  void configure(const json& config, const fs::path& dir) override {
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
      add_bos_token = config["add_bos_token"].get<bool>();
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
      add_eos_token = config["add_eos_token"].get<bool>();
    if (config.contains("legacy") && config["legacy"].is_boolean())
      legacy = config["legacy"].get<bool>();
    if (config.contains("add_prefix_space") && config["add_prefix_space"].is_boolean())
      ALPACA_CHECK(config["add_prefix_space"].get<bool>(),
                   "add_prefix_space: false in " << dir / "tokenizer_config.json"
                                                 << " is not supported; remove it");
    if (config.contains("model_max_length") && config["model_max_length"].is_number_integer())
      model_max_length = config["model_max_length"].get<int64_t>();
  }

  int64_t add_token(const std::string& content, bool special, std::optional<int64_t> id, bool lstrip,
                    bool rstrip) override;

  // 4.28.1's LlamaTokenizer wraps bos/eos/unk in AddedToken(lstrip=False, rstrip=False).
  void register_special_tokens() override {
    ALPACA_CHECK(!roles.bos.empty() && !roles.eos.empty() && !roles.unk.empty(),
                 "the tokenizer has no bos/eos/unk token; set them in tokenizer_config.json");
    add(roles.unk, true);
    add(roles.bos, true);
    add(roles.eos, true);
    if (roles.pad) add_plain(*roles.pad, true);
    std::vector<int> unk_ids;
    sp_no_prefix->Encode(roles.unk, &unk_ids);
    unk_token_length = static_cast<int64_t>(unk_ids.size());
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    std::vector<int64_t> ids;
    if (add_special_tokens && add_bos_token) ids.push_back(role_id(roles.bos, "bos"));
    std::vector<int64_t> body = encode_text(text);
    ids.insert(ids.end(), body.begin(), body.end());
    if (add_special_tokens && add_eos_token) ids.push_back(role_id(roles.eos, "eos"));
    return ids;
  }

  void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const override {
    if (add_bos_token) prefix->push_back(role_id(roles.bos, "bos"));
    if (add_eos_token) suffix->push_back(role_id(roles.eos, "eos"));
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;

  std::string token_bytes(int64_t id) const override {
    ALPACA_CHECK(id >= 0, "token id " << id << " is negative");
    if (id >= size()) return "";  // past the vocabulary: decodes as nothing
    for (const auto& t : added)
      if (t.id == id) return t.content;
    return sentencepiece_piece_bytes(sp.IdToPiece(static_cast<int>(id)));
  }

  int64_t size() const override {
    int64_t n = model_size();
    for (const auto& t : added) n = std::max(n, t.id + 1);
    return n;
  }
  int64_t model_size() const override { return sp.GetPieceSize(); }

  std::optional<int64_t> lookup(const std::string& token) const override {
    auto it = added_index.find(token);
    if (it != added_index.end()) return added[static_cast<size_t>(it->second)].id;
    return sp_piece_id(token);
  }

  std::optional<std::string> id_to_piece(int64_t id) const override {
    if (id >= 0 && id < model_size()) return sp.IdToPiece(static_cast<int>(id));
    std::optional<std::string> piece;
    for (const auto& t : added)
      if (t.id == id) piece = t.content;
    return piece;
  }

  const std::vector<AddedToken>& added_tokens() const override { return added; }

  void save(const fs::path& dir) const override;

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
    roles.bos = piece(sp.bos_id());
    roles.eos = piece(sp.eos_id());
    roles.unk = piece(sp.unk_id());
    if (sp.pad_id() >= 0) roles.pad = piece(sp.pad_id());
  }

 private:
  std::string model_bytes;               // serialized ModelProto, written back by save()
  sentencepiece::SentencePieceProcessor sp;
  // The same model with add_dummy_prefix off: what HF's non-legacy LlamaTokenizer encodes with.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_no_prefix;
  std::vector<AddedToken> added;         // every token matched before SentencePiece runs
  bool add_bos_token = true;
  bool add_eos_token = false;
  bool legacy = true;
  int64_t unk_token_length = 0;          // pieces of the unk string (non-legacy prefix trick)
  std::unordered_map<std::string, int64_t> added_index;  // content -> index into `added`
  std::array<bool, 256> starts_token{};  // first bytes of added tokens: a quick split pre-check

  struct Piece {
    std::string text;
    const AddedToken* token = nullptr;
  };

  std::optional<int64_t> sp_piece_id(const std::string& piece) const {
    int id = sp.PieceToId(piece);
    if (id >= 0 && id < sp.GetPieceSize() && sp.IdToPiece(id) == piece) return id;
    return std::nullopt;
  }

  bool is_special_id(int64_t id) const {
    for (const auto& t : added)
      if (t.id == id && t.special) return true;
    return false;
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
    append_sp(roles.unk + chunk, true, &ids);
    // HF: tokens[unk_token_length:] if len(tokens) >= unk_token_length else tokens
    const int64_t skip = static_cast<int64_t>(ids.size()) >= unk_token_length ? unk_token_length : 0;
    out->insert(out->end(), ids.begin() + skip, ids.end());
  }


  // Splits `text` at added-token strings (leftmost, then longest match, like HF's Trie);
  // lstrip/rstrip tokens eat the whitespace next to them.
  std::vector<Piece> split_at_added(const std::string& text) const {
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
    for (size_t i = 0; i < pieces.size(); ++i) {
      const AddedToken* t = pieces[i].token;
      if (!t) continue;
      if (t->rstrip && i + 1 < pieces.size() && !pieces[i + 1].token) py_lstrip(pieces[i + 1].text);
      if (t->lstrip && i > 0 && !pieces[i - 1].token) py_rstrip(pieces[i - 1].text);
    }
    return pieces;
  }

  // The text's own ids: the pieces between added tokens encoded on their own.
  std::vector<int64_t> encode_text(std::string text) const {
    std::vector<int64_t> out;
    if (text.empty()) return out;
    if (!legacy) text = non_legacy_text(text);
    bool first = true;
    bool drop_leading_underline = false;
    for (const auto& p : split_at_added(text)) {
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

  json config_json() const;
  TokenizerJsonSpec tokenizer_json_spec() const;
};

}  // namespace

int64_t SentencePieceBackend::add_token(const std::string& content, bool special, std::optional<int64_t> id,
                                        bool lstrip, bool rstrip) {
  ALPACA_CHECK(!content.empty(), "cannot add an empty token to the tokenizer");
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
  if (new_id < model_size()) {
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

std::string SentencePieceBackend::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string out;
  std::vector<int> run;  // consecutive SentencePiece ids, decoded together
  auto flush = [&] {
    if (run.empty()) return;
    out += sp.DecodeIds(run);
    run.clear();
  };
  const int64_t n = size();
  for (int64_t id : ids) {
    ALPACA_CHECK(id >= 0, "token id " << id << " is negative");
    if (id >= n) continue;  // past the vocabulary (a model's padded rows): transformers decodes it as nothing
    bool special = is_special_id(id);
    if (special && skip_special) continue;
    auto it = std::find_if(added.begin(), added.end(),
                           [&](const AddedToken& t) { return t.id == id; });
    if (it != added.end()) {
      flush();
      out += it->content;
    } else {
      run.push_back(static_cast<int>(id));
    }
  }
  flush();
  return out;
}

namespace {

json token_json(const AddedToken& t) {
  return json{{"content", t.content}, {"lstrip", t.lstrip},   {"normalized", !t.special},
              {"rstrip", t.rstrip},   {"single_word", false}, {"special", t.special}};
}

std::vector<AddedToken> sorted_by_id(std::vector<AddedToken> tokens) {
  std::sort(tokens.begin(), tokens.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return tokens;
}

}  // namespace

// tokenizer_config.json as transformers 4.28.1's LlamaTokenizer.save_pretrained writes it.
json SentencePieceBackend::config_json() const {
  json decoder = json::object();
  for (const auto& t : sorted_by_id(added)) decoder[std::to_string(t.id)] = token_json(t);
  json config = {
      {"add_bos_token", add_bos_token},
      {"add_eos_token", add_eos_token},
      {"added_tokens_decoder", decoder},
      {"bos_token", roles.bos},
      {"clean_up_tokenization_spaces", false},
      {"eos_token", roles.eos},
      {"legacy", legacy},
      {"pad_token", roles.pad ? json(*roles.pad) : json(nullptr)},
      {"padding_side", "right"},
      {"sp_model_kwargs", json::object()},
      {"tokenizer_class", "LlamaTokenizer"},
      {"unk_token", roles.unk},
  };
  if (model_max_length > 0) config["model_max_length"] = model_max_length;
  return config;
}

TokenizerJsonSpec SentencePieceBackend::tokenizer_json_spec() const {
  TokenizerJsonSpec spec;
  for (int i = 0; i < sp.GetPieceSize(); ++i) {
    spec.pieces.push_back(sp.IdToPiece(i));
    spec.scores.push_back(sp.GetScore(i));
  }
  spec.added = sorted_by_id(added);
  spec.unk_token = roles.unk;
  spec.bos_token = roles.bos;
  spec.eos_token = roles.eos;
  spec.bos_id = role_id(roles.bos, "bos");
  spec.eos_id = role_id(roles.eos, "eos");
  spec.add_bos = add_bos_token;
  spec.add_eos = add_eos_token;
  spec.legacy = legacy;
  return spec;
}

void SentencePieceBackend::save(const fs::path& dir) const {
  const json config = config_json();
  // special_tokens_map.json as 4.28.1's save_pretrained writes it, which is what 4.28.1 reads back
  // over the config: an AddedToken object for a token that keeps its own lstrip/rstrip (the roles
  // LlamaTokenizer wraps), a plain string for one given as a string (train.py's "[PAD]"), around
  // which the slow tokenizer strips whitespace. A plain "</s>" would make 4.28.1 strip the spaces
  // before every "</s>" of the text when it loads this directory.
  auto token_entry = [&](const std::string& content) -> json {
    for (const auto& t : added) {
      if (t.content != content) continue;
      if (t.lstrip && t.rstrip) return content;  // add_plain: a string
      return json{{"content", content}, {"lstrip", t.lstrip}, {"normalized", true}, {"rstrip", t.rstrip},
                  {"single_word", false}};
    }
    return content;
  };
  json special_map = {{"bos_token", token_entry(roles.bos)}, {"eos_token", token_entry(roles.eos)},
                      {"unk_token", token_entry(roles.unk)}};
  if (roles.pad) special_map["pad_token"] = token_entry(*roles.pad);
  json extra = json::array();
  json added_beyond = json::object();  // added_tokens.json: the tokens beyond the model's pieces
  for (const auto& t : sorted_by_id(added)) {
    bool role = t.content == roles.bos || t.content == roles.eos || t.content == roles.unk ||
                (roles.pad && t.content == *roles.pad);
    if (t.special && !role) extra.push_back(token_entry(t.content));
    if (t.id >= model_size()) added_beyond[t.content] = t.id;
  }
  if (!extra.empty()) special_map["additional_special_tokens"] = extra;
  const std::string tokenizer_json = make_tokenizer_json(tokenizer_json_spec());

  write_text_file(dir / "tokenizer.model", model_bytes);
  write_text_file(dir / "tokenizer.json", tokenizer_json);
  write_text_file(dir / "tokenizer_config.json", config.dump(2) + "\n");
  write_text_file(dir / "special_tokens_map.json", special_map.dump(2) + "\n");
  if (!added_beyond.empty()) write_text_file(dir / "added_tokens.json", added_beyond.dump(2) + "\n");
}

std::unique_ptr<Backend> make_sentencepiece_backend(const std::string& model_bytes, const std::string& where) {
  auto backend = std::make_unique<SentencePieceBackend>();
  backend->load_model(model_bytes, where);
  backend->defaults_from_model();
  return backend;
}

}  // namespace alpaca::tokenizer::detail
