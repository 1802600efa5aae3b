// The tokenizer.json backend (backend.h): detail::HfTokenizer run as transformers 5's
// TokenizersBackend runs it, with the class's own rules (tokenizer_class.h): its role defaults,
// the post-processor it leaves, its decode-time clean-up. save() writes the document back with
// the added tokens and roles brought up to date.
#include "alpaca/util/error.h"
#include "backend.h"
#include "hf_tokenizer.h"
#include "regex.h"
#include "tokenizer_model.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class TokenizersBackend final : public Backend {
 public:
  // Roles start as the class's __init__ defaults (LlamaTokenizer: <s>, </s>, <unk>); the HF files
  // beside the tokenizer.json override them.
  TokenizersBackend(std::unique_ptr<HfTokenizer> hf, TokenizerClassInfo cls)
      : hf_(std::move(hf)), cls_(std::move(cls)) {
    if (cls_.bos) roles.bos = *cls_.bos;
    if (cls_.eos) roles.eos = *cls_.eos;
    if (cls_.unk) roles.unk = *cls_.unk;
    if (cls_.pad) roles.pad = *cls_.pad;
    roles.sep = cls_.sep.value_or("");
    roles.cls = cls_.cls.value_or("");
    roles.mask = cls_.mask.value_or("");
  }

  std::unique_ptr<Backend> clone() const override {
    auto copy = std::make_unique<TokenizersBackend>(hf_->clone(), cls_);
    copy_common_state_to(*copy);
    copy->config_ = config_;
    return copy;
  }

  const char* format() const override { return "tokenizer.json"; }
  std::string tokenizer_class() const override { return cls_.name; }
  bool json_roles() const override { return true; }

  void configure(const json& config, const fs::path&) override { config_ = config; }

  // lstrip/rstrip are the slow tokenizer's: the tokenizer.json keeps its own flags.
  int64_t add_token(const std::string& content, bool special, std::optional<int64_t> id, bool, bool) override {
    ALPACA_CHECK(!content.empty(), "cannot add an empty token to the tokenizer");
    const int64_t got = hf_->add_token(content, special);
    ALPACA_CHECK(!id || *id == got, "tokenizer files disagree on the id of token '"
                                        << content << "' (" << got << " in tokenizer.json vs "
                                        << *id << "); fix tokenizer_config.json / added_tokens.json");
    return got;
  }

  // TokenizersBackend.__init__ (tokenization_utils_tokenizers.py): after the file's added tokens,
  // the special-token map's values not yet added, in its order (the roles as
  // SPECIAL_TOKENS_ATTRIBUTES lists them, then the class's model-specific "*_token" kwargs), then
  // the extra special tokens (the class's and the config's, combined by apply_tokenizer_class). A
  // token in the vocabulary keeps its id; a token new to it takes the next one; a repeat is skipped.
  void register_special_tokens() override {
    for (const std::string* t : {&roles.bos, &roles.eos, &roles.unk, &roles.sep})
      if (!t->empty()) add(*t, true);
    if (roles.pad && !roles.pad->empty()) add(*roles.pad, true);
    if (!roles.cls.empty()) add(roles.cls, true);
    // The class's AddedToken(mask, lstrip=True) (Blenderbot, the fairseq classes). New here and
    // repeated as a plain string among the extra tokens, both go to one add_tokens call, and the
    // crate keeps the later one's flags: no lstrip.
    const bool mask_new = !roles.mask.empty() && !lookup_added(roles.mask);
    if (!roles.mask.empty()) hf_->add_token(roles.mask, true, cls_.mask_lstrip);
    for (const auto& t : cls_.named_specials) add(t, true);
    for (const auto& t : cls_.extra_specials) hf_->add_token(t, true, false, mask_new && cls_.mask_lstrip && t == roles.mask);
  }

  bool lookup_added(const std::string& content) const {
    for (const AddedToken& t : hf_->added_tokens())
      if (t.content == content) return true;
    return false;
  }

  // The post-processor TokenizersBackend.__init__ and the class's own __init__ leave (see
  // class_post_processor). from_pretrained drops add_bos_token / add_eos_token from
  // tokenizer_config.json whenever there is a tokenizer.json, so the config's flags do not count.
  void update_post_processor() override {
    const json& doc = hf_->document();
    const bool file_has_one = doc.contains("post_processor") && !doc.at("post_processor").is_null();
    const json pp = class_post_processor(cls_, file_has_one, {roles.bos, roles.eos, roles.unk, roles.sep, roles.cls},
                                         [&](const std::string& t) { return lookup(t); });
    if (!pp.is_null()) hf_->set_post_processor(pp);
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    return hf_->encode(text, add_special_tokens);
  }

  void affixes(std::vector<int64_t>* prefix, std::vector<int64_t>* suffix) const override {
    *prefix = hf_->template_prefix();
    *suffix = hf_->template_suffix();
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override {
    // A class's own decode step first (Lasr's CTC: repeated ids merged, the pad id dropped); every
    // other class decodes the ids as given, without a copy.
    std::string text = cls_.ctc_decode
                           ? hf_->decode(class_decode_ids(cls_, ids, roles.pad ? lookup(*roles.pad) : std::nullopt), skip_special)
                           : hf_->decode(ids, skip_special);
    // TokenizersBackend._decode: clean_up_tokenization_spaces (default false) for non-BPE models.
    if (std::string(hf_->model_type()) != "BPE" && config_.value("clean_up_tokenization_spaces", json(false)) == json(true))
      text = clean_up_tokenization(std::move(text));
    if (cls_.decode_suffix.empty()) return text;
    // CLIPTokenizer wraps the backend's decode: the word suffix becomes a space, then str.strip().
    text = Pattern{cls_.decode_suffix, nullptr}.replace_all(text, " ");
    const size_t b = text.find_first_not_of(" \t\n\r\f\v"), e = text.find_last_not_of(" \t\n\r\f\v");
    return b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
  }

  std::string token_bytes(int64_t id) const override { return hf_->token_bytes(id); }
  int64_t size() const override { return hf_->size(); }
  int64_t model_size() const override { return hf_->model_size(); }
  std::optional<int64_t> lookup(const std::string& token) const override { return hf_->token_to_id(token); }
  std::optional<std::string> id_to_piece(int64_t id) const override { return hf_->id_to_token(id); }
  const std::vector<AddedToken>& added_tokens() const override { return hf_->added_tokens(); }

  // tokenizer.json (as read, added tokens brought up to date), tokenizer_config.json (as read,
  // roles and added_tokens_decoder updated) and special_tokens_map.json.
  void save(const fs::path& dir) const override {
    json config = config_;
    json decoder = json::object();
    for (const auto& t : hf_->added_tokens())
      decoder[std::to_string(t.id)] = {{"content", t.content},   {"lstrip", t.lstrip},
                                       {"normalized", t.normalized}, {"rstrip", t.rstrip},
                                       {"single_word", t.single_word}, {"special", t.special}};
    config["added_tokens_decoder"] = decoder;
    json special_map = json::object();
    auto set_role = [&](const char* key, const std::string& token) {
      if (token.empty()) {  // None: an explicit null stays (it overrides the class's default), else absent
        if (config.contains(key)) config[key] = nullptr;
      } else {
        config[key] = token;
        special_map[key] = token;
      }
    };
    set_role("bos_token", roles.bos);
    set_role("eos_token", roles.eos);
    set_role("unk_token", roles.unk);
    set_role("pad_token", roles.pad.value_or(""));
    if (model_max_length > 0) config["model_max_length"] = model_max_length;
    if (!config.contains("tokenizer_class")) config["tokenizer_class"] = "PreTrainedTokenizerFast";
    write_text_file(dir / "tokenizer.json", hf_->to_json());
    write_text_file(dir / "tokenizer_config.json", config.dump(2) + "\n");
    write_text_file(dir / "special_tokens_map.json", special_map.dump(2) + "\n");
  }

 private:
  std::unique_ptr<HfTokenizer> hf_;
  TokenizerClassInfo cls_;            // what the class transformers 5 builds sets up
  json config_ = json::object();      // tokenizer_config.json as read; save() updates it
};

}  // namespace

std::unique_ptr<Backend> make_tokenizers_backend(json doc, const std::string& file, const TokenizerClassInfo& cls) {
  auto backend = std::make_unique<TokenizersBackend>(HfTokenizer::from_json(std::move(doc), file), cls);
  backend->source = file;
  return backend;
}

}  // namespace alpaca::tokenizer::detail
