// Tokenizer: the facade over the two backends of backend.h (SentencePiece as transformers'
// slow LlamaTokenizer, or a tokenizer.json run by detail::HfTokenizer; see the header). The HF
// json files beside the model (tokenizer_config.json, special_tokens_map.json, added_tokens.json)
// are read here, the same way for both, so that a saved directory round-trips through
// transformers' AutoTokenizer with the same ids.
#include "alpaca/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/file.h"
#include "backend.h"
#include "json_numbers.h"
#include "tokenizer_class.h"

namespace alpaca::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& path) {
  const std::optional<std::string> text = util::read_file(path);
  ALPACA_CHECK(text, "cannot open " << path << " for reading; check the path and permissions");
  return *text;
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
    return detail::parse_json_as_serde(text);  // the library's numbers (json_numbers.h)
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

// The tokenizer file of `path` (a directory or a file): tokenizer.model when present
// (stanford_alpaca's use_fast=False), else tokenizer.json; use_fast (--use_fast_tokenizer)
// prefers tokenizer.json.
fs::path tokenizer_file(const fs::path& path, bool is_dir, bool use_fast) {
  if (!is_dir) return path;
  const bool has_model = fs::is_regular_file(path / "tokenizer.model");
  const bool has_json = fs::is_regular_file(path / "tokenizer.json");
  ALPACA_CHECK(has_model || has_json,
               "no tokenizer in " << path
                                  << ": expected tokenizer.model (SentencePiece) or tokenizer.json "
                                     "(Hugging Face tokenizers); copy the tokenizer files of the "
                                     "checkpoint into the directory");
  return has_json && (use_fast || !has_model) ? path / "tokenizer.json" : path / "tokenizer.model";
}

// tokenizer_config.json's "*_token" keys with a string value other than the seven roles, in the
// file's order (which `json` does not keep, hence the second, ordered parse).
std::vector<std::pair<std::string, std::string>> model_specific_tokens(const fs::path& config_file) {
  static const std::set<std::string> kRoles = {"bos_token", "eos_token", "unk_token", "sep_token",
                                               "pad_token", "cls_token", "mask_token"};
  std::vector<std::pair<std::string, std::string>> out;
  if (!fs::exists(config_file)) return out;
  const nlohmann::ordered_json config = nlohmann::ordered_json::parse(read_file(config_file), nullptr, false);
  if (!config.is_object()) return out;  // read_json_object reported it already
  for (const auto& [key, value] : config.items())
    if (key.size() > 6 && key.compare(key.size() - 6, 6, "_token") == 0 && !kRoles.count(key) && value.is_string() &&
        !value.get<std::string>().empty())
      out.emplace_back(key, value.get<std::string>());
  return out;
}

// The backend for `file`; a tokenizer.json in a model directory is first rewritten by
// transformers 5's class rule (a known tokenizer_class rebuilds the pipeline, tokenizer_class.h).
std::unique_ptr<detail::Backend> make_backend(const fs::path& file, const fs::path& dir, bool is_dir,
                                              const json& config, const json& special_map) {
  if (file.extension() != ".json") {
    auto backend = detail::make_sentencepiece_backend(read_file(file), file.string());
    backend->source = file.string();
    return backend;
  }
  json doc = read_json_doc(file);
  detail::TokenizerClassInfo cls;
  if (is_dir) {
    detail::ConfigExtras extras = detail::config_extras(config, special_map, dir.string());
    extras.model_specific = model_specific_tokens(dir / "tokenizer_config.json");
    if (doc.is_object() && doc.contains("model")) {
      json model_config = fs::exists(dir / "config.json") ? read_json(dir / "config.json") : json::object();
      cls = detail::apply_tokenizer_class(doc, config, model_config, extras, file.string());
    } else {  // HfTokenizer reports what the document lacks; the extras as TokenizersBackend takes them
      cls = detail::apply_tokenizer_class(doc, json::object(), json::object(), extras, file.string());
    }
  }
  return detail::make_tokenizers_backend(std::move(doc), file.string(), cls);
}

// tokenizer_config.json's added_tokens_decoder and added_tokens.json: tokens with explicit ids,
// added first so that later name-only tokens cannot take their ids.
void add_tokens_with_ids(detail::Backend& b, const json& config, const fs::path& dir) {
  if (config.contains("added_tokens_decoder")) {
    const fs::path file = dir / "tokenizer_config.json";
    const json& dec = config["added_tokens_decoder"];
    ALPACA_CHECK(dec.is_object(), "added_tokens_decoder in " << file << " must be an object");
    for (auto it = dec.begin(); it != dec.end(); ++it) {
      int64_t id = 0;
      try {
        id = std::stoll(it.key());
      } catch (const std::exception&) {
        ALPACA_FAIL("added_tokens_decoder key '" << it.key() << "' in " << file << " is not an integer id");
      }
      auto content = token_string(it.value());
      ALPACA_CHECK(content, "added_tokens_decoder[" << it.key() << "] in " << file << " has no string 'content'");
      const json& v = it.value();
      b.add(*content, token_flag(v, "special", file), id, token_flag(v, "lstrip", file), token_flag(v, "rstrip", file));
    }
  }
  if (fs::exists(dir / "added_tokens.json")) {
    json added = read_json(dir / "added_tokens.json");
    ALPACA_CHECK(added.is_object(), dir / "added_tokens.json" << " must map token -> id");
    for (auto it = added.begin(); it != added.end(); ++it) {
      ALPACA_CHECK(it.value().is_number_integer(),
                   "id of '" << it.key() << "' in " << dir / "added_tokens.json" << " is not an integer");
      b.add_plain(it.key(), false, it.value().get<int64_t>());
    }
  }
}

// The role tokens the files name (special_tokens_map.json wins over tokenizer_config.json).
void read_roles(detail::Backend& b, const json& config, const json& special_map, const fs::path& dir) {
  // Outer nullopt: the files do not name the role; inner nullopt: they name it as null.
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
  const bool json_roles = b.json_roles();
  detail::SpecialTokens& r = b.roles;
  if (auto v = role("bos_token"); v && (*v || json_roles)) r.bos = v->value_or("");
  if (auto v = role("eos_token"); v && (*v || json_roles)) r.eos = v->value_or("");
  if (auto v = role("unk_token"); v && (*v || json_roles)) r.unk = v->value_or("");
  if (auto v = role("pad_token")) r.pad = *v;
  if (auto v = role("sep_token"); v && json_roles) r.sep = v->value_or("");
  if (auto v = role("cls_token"); v && json_roles) r.cls = v->value_or("");
  if (auto v = role("mask_token"); v && json_roles) r.mask = v->value_or("");
}

// additional_special_tokens / extra_special_tokens of both files, for the SentencePiece backend
// (transformers 4.28.1's slow tokenizer). A tokenizer.json takes them through its class instead
// (config_extras, apply_tokenizer_class): transformers 5 adds them after the roles.
void add_extra_specials(detail::Backend& b, const json& config, const json& special_map, const fs::path& dir) {
  for (const json* src : {&config, &special_map}) {
    for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
      if (!src->contains(key) || !(*src)[key].is_array()) continue;  // v5 may write a role map
      for (const json& t : (*src)[key]) {
        auto s = token_string(t);
        ALPACA_CHECK(s, key << " in the tokenizer files of " << dir << " must hold strings");
        if (t.is_object()) {
          const fs::path file = dir / (src == &config ? "tokenizer_config.json" : "special_tokens_map.json");
          b.add(*s, true, std::nullopt, token_flag(t, "lstrip", file), token_flag(t, "rstrip", file));
        } else {
          b.add_plain(*s, true);
        }
      }
    }
  }
}

// A json file of the model directory, or {} when absent; it must hold an object.
json read_json_object(const fs::path& path) {
  json j = fs::exists(path) ? read_json(path) : json::object();
  ALPACA_CHECK(j.is_object(), path << " must hold a JSON object");
  return j;
}

}  // namespace

namespace detail {

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  ALPACA_CHECK(out.good(), "cannot write " << path);
  out << text;
  out.close();  // the last buffer is written here: a full disk shows up at close, not at <<
  ALPACA_CHECK(out.good(), "failed writing " << path << " (" << text.size()
                                             << " bytes; is the disk full?); free space and save again");
}

int64_t Backend::role_id(const std::string& token, const char* role) const {
  const std::optional<int64_t> id = lookup(token);
  ALPACA_CHECK(!token.empty() && id, "the tokenizer has no " << role << " token"
                                                             << (token.empty() ? "" : " in its vocabulary")
                                                             << "; set " << role
                                                             << "_token in tokenizer_config.json");
  return *id;
}

}  // namespace detail

struct Tokenizer::Impl {
  std::unique_ptr<detail::Backend> backend;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer::Tokenizer(const Tokenizer& other) : impl_(std::make_unique<Impl>()) { *this = other; }

Tokenizer& Tokenizer::operator=(const Tokenizer& other) {
  if (this == &other) return *this;
  auto impl = std::make_unique<Impl>();
  impl->backend = other.impl_->backend->clone();
  impl_ = std::move(impl);
  return *this;
}

Tokenizer Tokenizer::from_serialized_model(const std::string& model_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->backend = detail::make_sentencepiece_backend(model_bytes, "(in memory)");
  impl->backend->register_special_tokens();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& dir_or_file, bool use_fast) {
  fs::path path(dir_or_file);
  ALPACA_CHECK(fs::exists(path), "tokenizer path " << path << " does not exist");
  const bool is_dir = fs::is_directory(path);
  const fs::path dir = is_dir ? path : path.parent_path();
  const fs::path file = tokenizer_file(path, is_dir, use_fast);
  const json config = is_dir ? read_json_object(dir / "tokenizer_config.json") : json::object();
  const json special_map = is_dir ? read_json_object(dir / "special_tokens_map.json") : json::object();
  auto impl = std::make_unique<Impl>();
  impl->backend = make_backend(file, dir, is_dir, config, special_map);
  detail::Backend& b = *impl->backend;
  if (is_dir) {
    add_tokens_with_ids(b, config, dir);
    // transformers 5 reads special_tokens_map.json only for a config without added_tokens_decoder
    // (from_pretrained's legacy branch); 4.28.1's slow tokenizer always does.
    const bool legacy_map = !b.json_roles() || !config.contains("added_tokens_decoder");
    read_roles(b, config, legacy_map ? special_map : json::object(), dir);
    if (!b.json_roles()) add_extra_specials(b, config, special_map, dir);
    b.configure(config, dir);
  }
  b.register_special_tokens();
  if (is_dir) b.update_post_processor();
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  return impl_->backend->encode(text, add_special_tokens);
}

std::vector<int64_t> Tokenizer::encode_truncated(const std::string& text, int64_t max_length,
                                                 bool* truncated) const {
  std::vector<int64_t> prefix, suffix;
  impl_->backend->affixes(&prefix, &suffix);
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
  return impl_->backend->decode(ids, skip_special);
}

std::string Tokenizer::token_bytes(int64_t id) const { return impl_->backend->token_bytes(id); }
int64_t Tokenizer::vocab_size() const { return impl_->backend->size(); }
int64_t Tokenizer::sp_vocab_size() const { return impl_->backend->model_size(); }
std::optional<int64_t> Tokenizer::pad_id() const {
  const auto& pad = impl_->backend->roles.pad;
  if (!pad) return std::nullopt;
  return impl_->backend->lookup(*pad);
}
int64_t Tokenizer::bos_id() const { return impl_->backend->role_id(impl_->backend->roles.bos, "bos"); }
int64_t Tokenizer::eos_id() const { return impl_->backend->role_id(impl_->backend->roles.eos, "eos"); }
int64_t Tokenizer::unk_id() const { return impl_->backend->role_id(impl_->backend->roles.unk, "unk"); }
std::string Tokenizer::source() const { return impl_->backend->source; }
std::string Tokenizer::tokenizer_class() const { return impl_->backend->tokenizer_class(); }
std::string Tokenizer::describe_ids(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    const std::optional<std::string> piece = impl_->backend->id_to_piece(id);
    if (!out.empty()) out += ' ';
    out += std::to_string(id);
    out += ' ';
    out += json(piece.value_or("?")).dump();
  }
  return out;
}
std::string Tokenizer::format() const { return impl_->backend->format(); }
std::optional<std::string> Tokenizer::unk_token() const {
  if (impl_->backend->roles.unk.empty()) return std::nullopt;
  return impl_->backend->roles.unk;
}
std::string Tokenizer::bos_token() const { return impl_->backend->roles.bos; }
std::string Tokenizer::eos_token() const { return impl_->backend->roles.eos; }
std::optional<std::string> Tokenizer::pad_token() const { return impl_->backend->roles.pad; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->backend->added_tokens(); }
std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  return impl_->backend->lookup(token);
}

int64_t Tokenizer::add_special_token(const std::string& token) { return impl_->backend->add_plain(token, true); }

void Tokenizer::set_pad_token(const std::string& token) {
  impl_->backend->add_plain(token, true);
  impl_->backend->roles.pad = token;
}

void Tokenizer::set_eos_token(const std::string& token) {
  ALPACA_USER_CHECK(token_to_id(token), "the eos token '" << token << "' is not in the vocabulary of " << source()
                                                          << "; give a token the tokenizer has");
  impl_->backend->roles.eos = token;
}

void Tokenizer::set_model_max_length(int64_t n) { impl_->backend->model_max_length = n; }

int64_t Tokenizer::add_missing_special_tokens() {
  detail::Backend& b = *impl_->backend;
  const int64_t before = vocab_size();
  // train.py: special_tokens_dict in this order, then tokenizer.add_special_tokens(dict).
  if (!b.roles.pad) set_pad_token("[PAD]");
  if (b.roles.eos.empty()) b.roles.eos = "</s>", b.add_plain("</s>", true);
  if (b.roles.bos.empty()) b.roles.bos = "<s>", b.add_plain("<s>", true);
  if (b.roles.unk.empty()) b.roles.unk = "<unk>", b.add_plain("<unk>", true);
  return vocab_size() - before;
}

int64_t Tokenizer::use_eos_as_missing_pad() {
  detail::Backend& b = *impl_->backend;
  ALPACA_CHECK(!b.roles.eos.empty(), source() << " has no eos token, which conversation data needs (TRL pads with it and "
                                              "chat templates end turns with it); set eos_token in tokenizer_config.json");
  if (!b.roles.pad) set_pad_token(b.roles.eos);
  return 0;
}

void Tokenizer::save(const std::string& dir_str) const {
  fs::path dir(dir_str);
  std::error_code ec;
  fs::create_directories(dir, ec);
  ALPACA_CHECK(!ec, "cannot create tokenizer directory " << dir << ": " << ec.message());
  impl_->backend->save(dir);
}

}  // namespace alpaca::tokenizer
