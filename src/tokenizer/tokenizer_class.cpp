// transformers 5's class rule for tokenizer.json (see tokenizer_class.h). Sources, in the pinned
// transformers 5.23 wheel: models/auto/tokenization_auto.py (AutoTokenizer.from_pretrained: the
// "Fast" suffix is dropped, tokenizer_class_from_name, the LlamaTokenizer-with-ByteLevel
// fallback, MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), tokenization_utils_tokenizers.py
// (TokenizersBackend.convert_to_native_format: a class defining __init__ gets vocab, merges and
// the file's post_processor; __init__: update_post_processor when add_bos_token/add_eos_token are
// given or there is no post-processor), and each class's __init__ (models/*/tokenization_*.py).
#include "tokenizer_class.h"

#include <algorithm>
#include <map>
#include <set>

#include "alpaca/util/error.h"

namespace alpaca::tokenizer::detail {
namespace {

using nlohmann::json;

// Every tokenizer_class (without "Fast") that transformers 5.23 resolves to a TokenizersBackend
// subclass defining its own __init__, and that class. tests/reference/llama2_tokenizer_variants_
// reference.py lists them from the installed transformers; the test compares the two lists.
const std::map<std::string, std::string>& rebuilt_classes() {
  static const std::map<std::string, std::string> m = [] {
    std::map<std::string, std::string> t;
    for (const char* n :
         {"Albert", "Barthez", "Bert", "BigBird", "Blenderbot", "CLIP", "Camembert", "CodeGen",
          "CodeLlama", "Cohere", "DPRContextEncoder", "DPRQuestionEncoder", "DPRReader", "Deberta",
          "DebertaV2", "DistilBert", "Esmc", "Funnel", "GPT2", "GPTNeoX", "Gemma", "Herbert", "Lasr",
          "LayoutLMv2", "LayoutLMv3", "LayoutXLM", "Llama", "Luke", "MBart50", "MBart", "MLuke",
          "MPNet", "MarkupLM", "Nllb", "Nougat", "OpenAIGPT", "Pegasus", "Qwen2", "Qwen3_5",
          "Reformer", "RemBert", "RoFormer", "Roberta", "SeamlessM4T", "Siglip2", "Splinter", "T5",
          "Tipsv2", "Udop", "VideoPrism", "Whisper", "XGLM", "XLMRoberta", "XLNet"})
      t[std::string(n) + "Tokenizer"] = std::string(n) + "Tokenizer";
    for (const char* n : {"Bart", "LED", "Mvp"}) t[std::string(n) + "Tokenizer"] = "RobertaTokenizer";
    for (const char* n : {"Lxmert", "MobileBert", "SqueezeBert"})
      t[std::string(n) + "Tokenizer"] = "BertTokenizer";
    return t;
  }();
  return m;
}

// model_type -> the tokenizer class transformers 5.23 registers for it (TOKENIZER_MAPPING_NAMES,
// after tokenization_auto.py adds TokenizersBackend for MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS).
// config.json's model_type can override the tokenizer_config's class (resolve_class below).
constexpr const char* kRegisteredTable =
      "EvollaModel=TokenizersBackend aimv2=CLIPTokenizer albert=AlbertTokenizer align=BertTokenizer "
      "arctic=TokenizersBackend aria=TokenizersBackend audioflamingo3=Qwen2Tokenizer "
      "aya_vision=CohereTokenizer bark=BertTokenizer bart=RobertaTokenizer barthez=BarthezTokenizer "
      "bartpho=BartphoTokenizer beam=TokenizersBackend bert=BertTokenizer "
      "bert-generation=BertGenerationTokenizer bert-japanese=BertJapaneseTokenizer "
      "bertweet=BertweetTokenizer big_bird=BigBirdTokenizer bigbird_pegasus=TokenizersBackend "
      "biogpt=BioGptTokenizer blenderbot=BlenderbotTokenizer blenderbot-small=BlenderbotSmallTokenizer "
      "blip=BertTokenizer blip-2=GPT2Tokenizer bridgetower=RobertaTokenizer bros=BertTokenizer "
      "byt5=ByT5Tokenizer camembert=CamembertTokenizer camembertv2-base=TokenizersBackend "
      "canary=TokenizersBackend canine=CanineTokenizer chatlm=TokenizersBackend chinese_clip=BertTokenizer "
      "clap=RobertaTokenizer clip=CLIPTokenizer clipseg=CLIPTokenizer clvp=ClvpTokenizer "
      "code_llama=CodeLlamaTokenizer codegen=GPT2Tokenizer cohere=CohereTokenizer cohere2=CohereTokenizer "
      "cohere_asr=TokenizersBackend colqwen2=Qwen2Tokenizer convbert=BertTokenizer "
      "cosmos3_omni=Qwen2Tokenizer cpm=CpmTokenizer cpmant=CpmAntTokenizer ctrl=CTRLTokenizer "
      "data2vec-audio=Wav2Vec2CTCTokenizer data2vec-text=RobertaTokenizer dbrx=GPT2Tokenizer "
      "deberta=DebertaTokenizer deberta-v2=DebertaV2Tokenizer dia=DiaTokenizer "
      "diffusion_gemma=GemmaTokenizer distilbert=BertTokenizer dots3_note=Qwen2Tokenizer "
      "dpr=DPRQuestionEncoderTokenizer electra=BertTokenizer emu3=GPT2Tokenizer ernie=BertTokenizer "
      "ernie4_5=TokenizersBackend ernie4_5_moe=TokenizersBackend esm=EsmTokenizer esmc=EsmcTokenizer "
      "esmfold2=EsmcTokenizer falcon_mamba=GPTNeoXTokenizer flaubert=FlaubertTokenizer flava=BertTokenizer "
      "flex_olmo=TokenizersBackend florence2=BartTokenizer fnet=FNetTokenizer fsmt=FSMTTokenizer "
      "fun_asr_nano=Qwen2Tokenizer funnel=FunnelTokenizer fuyu=TokenizersBackend gemma=GemmaTokenizer "
      "gemma2=GemmaTokenizer gemma3=GemmaTokenizer gemma3_text=GemmaTokenizer gemma3n=GemmaTokenizer "
      "gemma3n_text=GemmaTokenizer git=BertTokenizer glm=TokenizersBackend glm4=TokenizersBackend "
      "glm4_moe=TokenizersBackend glm4_moe_lite=TokenizersBackend glm4v=TokenizersBackend "
      "glm4v_moe=TokenizersBackend glm_image=TokenizersBackend glmasr=TokenizersBackend "
      "got_ocr2=TokenizersBackend gpt-sw3=GPTSw3Tokenizer gpt2=GPT2Tokenizer gpt_bigcode=TokenizersBackend "
      "gpt_neo=GPT2Tokenizer gpt_neox=GPTNeoXTokenizer gpt_neox_japanese=GPTNeoXJapaneseTokenizer "
      "gptj=GPT2Tokenizer gradium_phonon_tts=TokenizersBackend granite=TokenizersBackend "
      "granite_speech5_ctc=ParakeetTokenizer granitemoe=TokenizersBackend "
      "granitemoehybrid=TokenizersBackend granitemoeshared=TokenizersBackend grounding-dino=BertTokenizer "
      "groupvit=CLIPTokenizer gte=XLMRobertaTokenizer h2ovl_chat=TokenizersBackend "
      "herbert=HerbertTokenizer hubert=Wav2Vec2CTCTokenizer hunyuan_vl=Qwen2Tokenizer "
      "hyperclovax=TokenizersBackend hyperclovax_vision_v2=GPT2Tokenizer hyperclovax_vlm=TokenizersBackend "
      "ibert=RobertaTokenizer idefics=LlamaTokenizer idefics2=LlamaTokenizer instructblip=GPT2Tokenizer "
      "instructblipvideo=GPT2Tokenizer internlm2=TokenizersBackend internlm3=TokenizersBackend "
      "internvl=Qwen2Tokenizer iquestcoder=TokenizersBackend jais2=GPT2Tokenizer jamba=TokenizersBackend "
      "jina_embeddings_v3=XLMRobertaTokenizer kimi_k25=TokenizersBackend kimi_linear=TokenizersBackend "
      "kosmos-2=TokenizersBackend lasr_ctc=LasrTokenizer lasr_encoder=LasrTokenizer layoutlm=BertTokenizer "
      "layoutlmv2=LayoutLMv2Tokenizer layoutlmv3=LayoutLMv3Tokenizer layoutxlm=LayoutXLMTokenizer "
      "led=LEDTokenizer lighton_ocr=Qwen2TokenizerFast lilt=RobertaTokenizer llava=TokenizersBackend "
      "llava_next=TokenizersBackend longformer=RobertaTokenizer luke=LukeTokenizer lxmert=LxmertTokenizer "
      "m2m_100=M2M100Tokenizer mamba=GPTNeoXTokenizer mamba2=GPTNeoXTokenizer marian=MarianTokenizer "
      "markuplm=MarkupLMTokenizer mbart=MBartTokenizer mbart50=MBart50Tokenizer mega=RobertaTokenizer "
      "megatron-bert=BertTokenizer metaclip_2=XLMRobertaTokenizer mgp-str=MgpstrTokenizer "
      "mimo_v2_flash=TokenizersBackend minicpm3=TokenizersBackend minicpm_ocr=TokenizersBackend "
      "minicpmv=TokenizersBackend minicpmv4_6=TokenizersBackend minicpmv4_7=TokenizersBackend "
      "minimax_m2=TokenizersBackend ministral=TokenizersBackend ministral3=TokenizersBackend "
      "mistral=TokenizersBackend mistral3=TokenizersBackend mistral_large4=TokenizersBackend "
      "mixtral=TokenizersBackend mluke=MLukeTokenizer mm-grounding-dino=BertTokenizer "
      "mobilebert=MobileBertTokenizer modernbert=TokenizersBackend modernbert-decoder=TokenizersBackend "
      "molmo=TokenizersBackend molmo2=TokenizersBackend moss_transcribe_diarize=Qwen2Tokenizer "
      "mpnet=MPNetTokenizer mpt=GPTNeoXTokenizer mra=RobertaTokenizer mt5=T5Tokenizer musicgen=T5Tokenizer "
      "musicgen_melody=T5Tokenizer mvp=MvpTokenizer myt5=MyT5Tokenizer nemo_speechlm=TokenizersBackend "
      "nemotron=TokenizersBackend nemotron3_5_asr=ParakeetTokenizer "
      "nemotron_asr_streaming=ParakeetTokenizer nezha=BertTokenizer nllb=NllbTokenizer "
      "nllb-moe=NllbTokenizer nomic_bert=BertTokenizer nougat=NougatTokenizer nvfp4=TokenizersBackend "
      "nystromformer=TokenizersBackend olmo=GPTNeoXTokenizer olmo2=TokenizersBackend "
      "olmo3=TokenizersBackend olmo_hybrid=TokenizersBackend olmoe=GPTNeoXTokenizer "
      "omdet-turbo=CLIPTokenizer oneformer=CLIPTokenizer openai-gpt=OpenAIGPTTokenizer "
      "opencua=TokenizersBackend openvla=TokenizersBackend opt=GPT2Tokenizer ovis2=Qwen2Tokenizer "
      "owlv2=CLIPTokenizer owlvit=CLIPTokenizer paddleocr_vl=TokenizersBackend "
      "parakeet_ctc=ParakeetTokenizer parakeet_rnnt=ParakeetTokenizer parakeet_tdt=ParakeetTokenizer "
      "pegasus=PegasusTokenizer pegasus_x=TokenizersBackend perceiver=PerceiverTokenizer "
      "persimmon=TokenizersBackend phi=GPT2Tokenizer phi3=TokenizersBackend phi3_v=TokenizersBackend "
      "phimoe=TokenizersBackend phobert=PhobertTokenizer pix2struct=TokenizersBackend "
      "pixtral=TokenizersBackend plbart=PLBartTokenizer pocket_tts=TokenizersBackend "
      "pp_formulanet=NougatTokenizer prophetnet=ProphetNetTokenizer qdqbert=BertTokenizer "
      "qianfan_ocr=Qwen2Tokenizer qwen2=Qwen2Tokenizer qwen2_5_omni=Qwen2Tokenizer "
      "qwen2_5_vl=Qwen2Tokenizer qwen2_audio=Qwen2Tokenizer qwen2_moe=Qwen2Tokenizer "
      "qwen2_vl=Qwen2Tokenizer qwen3=Qwen2Tokenizer qwen3_5=Qwen3_5Tokenizer qwen3_5_moe=Qwen3_5Tokenizer "
      "qwen3_5_moe_text=Qwen3_5Tokenizer qwen3_5_text=Qwen3_5Tokenizer qwen3_asr=Qwen2Tokenizer "
      "qwen3_moe=Qwen2Tokenizer qwen3_next=Qwen2Tokenizer qwen3_omni_moe=Qwen2Tokenizer "
      "qwen3_vl=Qwen2Tokenizer qwen3_vl_moe=Qwen2Tokenizer qwen4_exp=Qwen3_5Tokenizer rag=RagTokenizer "
      "realm=BertTokenizer recurrent_gemma=GemmaTokenizer reformer=ReformerTokenizer "
      "rembert=RemBertTokenizer retribert=BertTokenizer roberta=RobertaTokenizer "
      "roberta-prelayernorm=RobertaTokenizer roc_bert=RoCBertTokenizer roformer=RoFormerTokenizer "
      "rwkv=GPTNeoXTokenizer sam3=CLIPTokenizer sam3_video=CLIPTokenizer seamless_m4t=SeamlessM4TTokenizer "
      "seamless_m4t_v2=SeamlessM4TTokenizer shieldgemma2=GemmaTokenizer siglip=SiglipTokenizer "
      "siglip2=Siglip2Tokenizer smolvlm=TokenizersBackend speech_to_text=Speech2TextTokenizer "
      "speecht5=SpeechT5Tokenizer splinter=SplinterTokenizer squeezebert=BertTokenizer "
      "stablelm=TokenizersBackend starcoder2=GPT2Tokenizer step3_vl=TokenizersBackend "
      "switch_transformers=T5Tokenizer t5=T5Tokenizer t5gemma=GemmaTokenizer tapas=TapasTokenizer "
      "tipsv2=Tipsv2Tokenizer trocr=XLMRobertaTokenizer tvp=BertTokenizer udop=UdopTokenizer "
      "umt5=TokenizersBackend unispeech=Wav2Vec2CTCTokenizer unispeech-sat=Wav2Vec2CTCTokenizer "
      "vibevoice=Qwen2TokenizerFast videoprism=VideoPrismTokenizer vilt=BertTokenizer "
      "vipllava=TokenizersBackend visual_bert=BertTokenizer vits=VitsTokenizer voxtral=TokenizersBackend "
      "voxtral_realtime=TokenizersBackend wav2vec2=Wav2Vec2CTCTokenizer wav2vec2-bert=Wav2Vec2CTCTokenizer "
      "wav2vec2-conformer=Wav2Vec2CTCTokenizer wav2vec2_phoneme=Wav2Vec2PhonemeCTCTokenizer "
      "whisper=WhisperTokenizer xclip=CLIPTokenizer xglm=XGLMTokenizer xlm=XLMTokenizer "
      "xlm-roberta=XLMRobertaTokenizer xlm-roberta-xl=TokenizersBackend xlnet=XLNetTokenizer "
      "xlstm=GPTNeoXTokenizer xmod=XLMRobertaTokenizer yoso=AlbertTokenizer zaya=GemmaTokenizer";

const std::map<std::string, std::string>& registered_classes() {
  static const std::map<std::string, std::string> m = [] {
    std::map<std::string, std::string> t;
    std::string all(kRegisteredTable);
    for (size_t i = 0; i < all.size();) {
      size_t end = all.find(' ', i);
      if (end == std::string::npos) end = all.size();
      const std::string item = all.substr(i, end - i);
      const size_t eq = item.find('=');
      if (eq != std::string::npos) t[item.substr(0, eq)] = item.substr(eq + 1);
      i = end + 1;
    }
    return t;
  }();
  return m;
}

// tokenization_auto.py's MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: their registered class wins.
const std::set<std::string>& incorrect_hub_class_types() {
  static const std::set<std::string> s = {
      "arctic", "chatlm", "ernie4_5", "ernie4_5_moe", "fuyu", "h2ovl_chat", "hyperclovax",
      "hyperclovax_vlm", "hyperclovax_vision_v2", "internlm2", "internlm3", "iquestcoder", "jamba",
      "llava", "llava_next", "minicpm3", "minicpmv", "minimax_m2", "modernbert", "modernbert-decoder",
      "molmo", "molmo2", "nemotron", "nvfp4", "opencua", "openvla", "paddleocr_vl", "phi3", "phi3_v",
      "phimoe", "qwen2", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen4_exp", "step3_vl",
      "vipllava", "cohere_asr", "camembertv2-base", "siglip2", "smolvlm"};
  return s;
}

std::string json_string_or(const json& obj, const char* key, const std::string& fallback) {
  if (obj.is_object() && obj.contains(key) && obj.at(key).is_string()) return obj.at(key).get<std::string>();
  return fallback;
}

// A boolean kwarg of the class: absent or null -> nullopt.
std::optional<bool> flag(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key) || config.at(key).is_null()) return std::nullopt;
  ALPACA_CHECK(config.at(key).is_boolean(), "'" << key << "' in tokenizer_config.json must be true, false or null");
  return config.at(key).get<bool>();
}

// Whether `component` (a normalizer, pre-tokenizer, ...) is or contains one of type `type`.
bool has_type(const json& component, const char* type) {
  if (component.is_object()) {
    if (json_string_or(component, "type", "") == type) return true;
    for (const auto& [k, v] : component.items())
      if (v.is_array() || v.is_object())
        if (has_type(v, type)) return true;
  } else if (component.is_array()) {
    for (const auto& v : component)
      if (has_type(v, type)) return true;
  }
  return false;
}

bool has_byte_level(const json& component) { return has_type(component, "ByteLevel"); }

// A special-token kwarg of the class as tokenizer_config.json gives it: a string or an AddedToken
// object's content; absent -> `fallback`; null -> "" (None).
std::string role_kwarg(const json& config, const char* key, const std::string& fallback) {
  if (!config.is_object() || !config.contains(key)) return fallback;
  const json& v = config.at(key);
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return fallback;
}

// The BPE model's flags as the class constructs it; vocab and merges stay the file's.
// `prefix` / `suffix`: continuing_subword_prefix / end_of_word_suffix (nullopt = None).
struct BpeFlags {
  std::optional<std::string> unk;
  bool fuse_unk = false, byte_fallback = false;
  std::optional<std::string> prefix, suffix;
};

void set_bpe(json& doc, const std::string& file, const BpeFlags& f) {
  json& model = doc["model"];
  ALPACA_CHECK(json_string_or(model, "type", "") == "BPE",
               file << ": tokenizer_class builds a BPE model, but the file's model is "
                    << model.value("type", json("?")).dump() << "; fix tokenizer_class in tokenizer_config.json");
  model["dropout"] = nullptr;
  model["unk_token"] = f.unk ? json(*f.unk) : json(nullptr);
  model["fuse_unk"] = f.fuse_unk;
  model["byte_fallback"] = f.byte_fallback;
  model["ignore_merges"] = false;
  model["continuing_subword_prefix"] = f.prefix ? json(*f.prefix) : json(nullptr);
  model["end_of_word_suffix"] = f.suffix ? json(*f.suffix) : json(nullptr);
}

// The byte-level classes' BPE: no unk, no fusing, empty affixes (GPT2, Roberta, GPTNeoX, ...).
const BpeFlags kByteLevelBpe{std::nullopt, false, false, std::string(), std::string()};

json byte_level(bool add_prefix_space, bool use_regex = true) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split(const json& pattern, const char* behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

json replace(const json& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", pattern}, {"content", content}};
}

json sequence(const char* key, json items) { return {{"type", "Sequence"}, {key, std::move(items)}}; }

// normalizer / pre-tokenizer / decoder of the rebuilt document (null = none).
void set_pipeline(json& doc, json normalizer, json pre_tokenizer, json decoder) {
  doc["normalizer"] = std::move(normalizer);
  doc["pre_tokenizer"] = std::move(pre_tokenizer);
  doc["decoder"] = std::move(decoder);
}

json metaspace_decoders(bool strip_prefix) {
  json seq = json::array({replace({{"String", "\u2581"}}, " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  if (strip_prefix) seq.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return sequence("decoders", seq);
}

json metaspace(const char* prepend_scheme) {
  return {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", prepend_scheme}, {"split", false}};
}

// models/llama/tokenization_llama.py: no normalizer, Metaspace(prepend_scheme from
// add_prefix_space (default True) and legacy (default False), split=False), BPE with
// fuse_unk + byte_fallback and no unk_token.
void build_llama(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const bool add_prefix_space = flag(config, "add_prefix_space").value_or(true);
  const bool legacy = flag(config, "legacy").value_or(false);
  set_bpe(doc, file, {std::nullopt, true, true, std::nullopt, std::nullopt});
  set_pipeline(doc, nullptr, metaspace(add_prefix_space ? (legacy ? "always" : "first") : "never"),
               metaspace_decoders(add_prefix_space));
  info->unk = "<unk>", info->bos = "<s>", info->eos = "</s>";
}

// models/code_llama/tokenization_code_llama.py: LLaMA's pipeline with the unk in the BPE model,
// a decoder that always strips one leading space, the FIM tokens as model-specific special tokens and
// add_bos_token=True passed explicitly (so update_post_processor always runs).
void build_code_llama(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const bool add_prefix_space = flag(config, "add_prefix_space").value_or(true);
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), true, true, std::nullopt, std::nullopt});
  set_pipeline(doc, nullptr, metaspace(add_prefix_space ? "first" : "never"), metaspace_decoders(true));
  info->unk = "<unk>", info->bos = "<s>", info->eos = "</s>";
  for (const auto& [key, fallback] : std::vector<std::pair<const char*, const char*>>{
           {"prefix_token", "\u2581<PRE>"}, {"middle_token", "\u2581<MID>"}, {"suffix_token", "\u2581<SUF>"},
           {"eot_token", "\u2581<EOT>"}, {"fill_token", "<FILL_ME>"}}) {
    const std::string t = role_kwarg(config, key, fallback);
    if (!t.empty()) info->named_specials.push_back(t);  // "*_token" kwargs: whatever the config's extras
  }
  info->post = PostProcessorRule::kUpdate;
  info->add_bos = true;
}

// models/gemma/tokenization_gemma.py (and siglip2, which puts a Lowercase in front): spaces
// become "▁" in the normalizer, split after each, byte_fallback BPE with the unk.
void build_gemma(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info, bool lowercase) {
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), true, true, std::nullopt, std::nullopt});
  json normalizer = replace({{"String", " "}}, "\u2581");
  if (lowercase) normalizer = sequence("normalizers", json::array({{{"type", "Lowercase"}}, normalizer}));
  set_pipeline(doc, normalizer, split({{"String", " "}}, "MergedWithPrevious", false), metaspace_decoders(false));
  info->unk = "<unk>", info->bos = "<bos>", info->eos = "<eos>", info->pad = "<pad>", info->mask = "<mask>";
}

// models/gpt2/tokenization_gpt2.py: ByteLevel(add_prefix_space) pre-tokenizer and decoder.
void build_gpt2(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, nullptr, byte_level(flag(config, "add_prefix_space").value_or(false)), byte_level(true));
  info->unk = info->bos = info->eos = "<|endoftext|>";
}

// models/codegen/tokenization_codegen.py: GPT-2's pipeline, pad None; the ByteLevel
// post-processor it sets first is replaced by the file's.
void build_codegen(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  build_gpt2(doc, config, file, info);
}

// models/gpt_neox/tokenization_gpt_neox.py: NFC + ByteLevel, <|padding|>, and
// update_post_processor at the end of __init__ (add_bos_token / add_eos_token default false).
void build_gpt_neox(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, {{"type", "NFC"}}, byte_level(flag(config, "add_prefix_space").value_or(false)), byte_level(true));
  info->unk = info->bos = info->eos = "<|endoftext|>";
  info->pad = "<|padding|>";
  info->post = PostProcessorRule::kUpdate;
}

// models/cohere/tokenization_cohere.py: NFC, single digits then ByteLevel.
void build_cohere(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const bool aps = flag(config, "add_prefix_space").value_or(false);
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, {{"type", "NFC"}},
               sequence("pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level(aps)})),
               byte_level(true));  // decoders.ByteLevel(add_prefix_space=...) is serialized with true
  info->unk = "<UNK>", info->bos = "<BOS_TOKEN>", info->eos = "<|END_OF_TURN_TOKEN|>", info->pad = "<PAD>";
  info->cls = "<CLS>", info->sep = "<SEP>", info->mask = "<MASK_TOKEN>";
}

// Qwen2's and Qwen3.5's Split regexes (models/qwen2, models/qwen3_5 PRETOKENIZE_REGEX).
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// models/qwen2/tokenization_qwen2.py and models/qwen3_5/tokenization_qwen3_5.py: NFC, the
// Split regex then ByteLevel without its regex; Qwen3.5 has no BOS either.
void build_qwen(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info, const char* pattern) {
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, {{"type", "NFC"}},
               sequence("pretokenizers", json::array({split({{"Regex", pattern}}, "Isolated", false),
                                                      byte_level(flag(config, "add_prefix_space").value_or(false), false)})),
               byte_level(true));
  info->unk = info->eos = info->pad = "<|endoftext|>";
}

// The RoBERTa family's roles (roberta, bart, led, mvp, blenderbot, luke).
void roberta_roles(TokenizerClassInfo* info) {
  info->bos = info->cls = "<s>", info->eos = info->sep = "</s>";
  info->unk = "<unk>", info->pad = "<pad>", info->mask = "<mask>";
}

// models/roberta/tokenization_roberta.py (Bart, LED, Mvp load as RobertaTokenizer) and
// models/luke/tokenization_luke.py (+ <ent>, <ent2>): ByteLevel, and a RobertaProcessing
// "<s> $A </s>" set after __init__, whatever the add_bos_token / add_eos_token flags say.
void build_roberta(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, nullptr, byte_level(flag(config, "add_prefix_space").value_or(false)), byte_level(true));
  roberta_roles(info);
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
  info->pair_doubles_suffix = true;
}

void build_luke(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  build_roberta(doc, config, file, info);
  // The entity tokens become extra special tokens, and so (as every "*_token" kwarg) do the
  // entity vocabulary's [UNK] [PAD] [MASK] [MASK2].
  for (const auto& [key, fallback] : std::vector<std::pair<const char*, const char*>>{
           {"entity_token_1", "<ent>"}, {"entity_token_2", "<ent2>"}, {"entity_unk_token", "[UNK]"},
           {"entity_pad_token", "[PAD]"}, {"entity_mask_token", "[MASK]"}, {"entity_mask2_token", "[MASK2]"}}) {
    const std::string t = role_kwarg(config, key, fallback);
    if (!t.empty()) info->named_specials.push_back(t);
  }
  info->extras_rule = ExtrasRule::kBoth;  // its extra_special_tokens: the config's two lists (+ its entity tokens, added already)
}

// models/blenderbot/tokenization_blenderbot.py: ByteLevel with add_prefix_space default true,
// an lstrip mask token, the file's post-processor.
void build_blenderbot(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, nullptr, byte_level(flag(config, "add_prefix_space").value_or(true)), byte_level(true));
  roberta_roles(info);
  info->mask_lstrip = true;
}

// models/deberta/tokenization_deberta.py: ByteLevel, [CLS]/[SEP] roles, "[CLS] $A [SEP]".
void build_deberta(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  build_roberta(doc, config, file, info);
  info->bos = info->cls = "[CLS]", info->eos = info->sep = "[SEP]";
  info->unk = "[UNK]", info->pad = "[PAD]", info->mask = "[MASK]";
}

// models/whisper/tokenization_whisper.py: ByteLevel; set_prefix_tokens makes the template
// "<|startoftranscript|> [<|notimestamps|>] $A <|endoftext|>" (without language and task).
void build_whisper(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  for (const char* key : {"language", "task"})
    ALPACA_CHECK(!config.contains(key) || config.at(key).is_null(),
                 file << ": WhisperTokenizer with \"" << key << "\" set in tokenizer_config.json is not "
                      << "reimplemented (its prefix tokens); remove the key or set it to null");
  set_bpe(doc, file, kByteLevelBpe);
  set_pipeline(doc, nullptr, byte_level(flag(config, "add_prefix_space").value_or(false)), byte_level(true));
  info->unk = info->bos = info->eos = "<|endoftext|>";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"<|startoftranscript|>"};
  if (!flag(config, "predict_timestamps").value_or(false)) info->prefix.push_back("<|notimestamps|>");
  info->suffix = {"@eos"};
}

// models/clip/tokenization_clip.py: NFC, whitespace runs to one space, lowercase; CLIP's
// Split (keeping the matches) then ByteLevel; "</w>" word suffix with the unk; a
// RobertaProcessing "<|startoftext|> $A <|endoftext|>"; decode() turns "</w>" into spaces.
void build_clip(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  static const char* kPattern =
      R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+)";
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<|endoftext|>"), false, false, std::string(), std::string("</w>")});
  set_pipeline(doc,
               sequence("normalizers", json::array({{{"type", "NFC"}}, replace({{"Regex", "\\s+"}}, " "), {{"type", "Lowercase"}}})),
               sequence("pretokenizers", json::array({split({{"Regex", kPattern}}, "Removed", true), byte_level(false)})),
               byte_level(true));
  info->bos = "<|startoftext|>", info->eos = info->unk = info->pad = "<|endoftext|>";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@bos"}, info->suffix = {"@eos"};
  info->pair_doubles_suffix = true;
  info->decode_suffix = "</w>";
}

json bert_normalizer(bool lowercase, json strip_accents) {
  return {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true},
          {"strip_accents", std::move(strip_accents)}, {"lowercase", lowercase}};
}

// models/openai/tokenization_openai.py: BertNormalizer(lowercase), BertPreTokenizer, "</w>"
// word suffix with the unk, BPEDecoder; only an unk role.
void build_openai_gpt(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), false, false, std::string(), std::string("</w>")});
  set_pipeline(doc, bert_normalizer(true, nullptr), {{"type", "BertPreTokenizer"}},
               {{"type", "BPEDecoder"}, {"suffix", "</w>"}});
  info->unk = "<unk>";
}

// models/herbert/tokenization_herbert.py: BertNormalizer without lowercasing or accent
// stripping, BertPreTokenizer, "</w>" suffix (no prefix), BPEDecoder, and a BertProcessing
// with the fixed ids cls 0 and sep 2 whatever the vocabulary says.
void build_herbert(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), false, false, std::nullopt, std::string("</w>")});
  set_pipeline(doc, bert_normalizer(false, false), {{"type", "BertPreTokenizer"}},
               {{"type", "BPEDecoder"}, {"suffix", "</w>"}});
  info->cls = "<s>", info->unk = "<unk>", info->pad = "<pad>", info->mask = "<mask>", info->sep = "</s>";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls#0"}, info->suffix = {"@sep#2"};
  info->pair_doubles_suffix = false;
}

// A SentencePiece charsmap in the file's normalizer: the class would put a Precompiled
// normalizer in its pipeline, which the engine does not run.
void refuse_precompiled(const json& doc, const std::string& cls, const std::string& file) {
  ALPACA_CHECK(!has_type(doc.value("normalizer", json()), "Precompiled"),
               file << ": " << cls << " keeps the file's Precompiled (SentencePiece charsmap) normalizer, which is "
                    << "not reimplemented here; set \"tokenizer_class\": \"PreTrainedTokenizerFast\" in "
                    << "tokenizer_config.json if the file's own pipeline is the one you want");
}

json metaspace_always() {
  return {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}};
}

// models/reformer/tokenization_reformer.py: no normalizer (without a charsmap), Metaspace
// "always" (split) both ways, fuse_unk BPE with the unk.
void build_reformer(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  refuse_precompiled(doc, "ReformerTokenizer", file);
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), true, false, std::nullopt, std::nullopt});
  set_pipeline(doc, nullptr, metaspace_always(), metaspace_always());
  info->eos = "</s>", info->unk = "<unk>";
}

// models/tipsv2/tokenization_tipsv2.py: Lowercase (do_lower_case, default true), WhitespaceSplit
// then Metaspace "always", byte_fallback BPE without an unk; pad <pad>, no bos/eos.
void build_tipsv2(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  refuse_precompiled(doc, "Tipsv2Tokenizer", file);
  set_bpe(doc, file, {std::nullopt, true, true, std::nullopt, std::nullopt});
  json lower = flag(config, "do_lower_case").value_or(true) ? json::array({{{"type", "Lowercase"}}}) : json::array();
  set_pipeline(doc, sequence("normalizers", lower),
               sequence("pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, metaspace_always()})),
               sequence("decoders", json::array({metaspace_always(), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}})));
  info->unk = "<unk>", info->pad = "<pad>", info->bos = "", info->eos = "";
}

// models/nougat/tokenization_nougat.py: NFKC; its splits (the bracket/punctuation "pattern" is
// passed as a plain string, so it is a literal that never matches), single digits, "\n",
// ByteLevel; "<s> $A </s>" set after __init__. (Its backend padding to 4096 is reset by every
// call that does not ask for padding.)
void build_nougat(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, kByteLevelBpe);
  const json splits = json::array(
      {split({{"String", "SPL1T-TH1S-Pl3A5E"}}, "Removed", false), {{"type", "Digits"}, {"individual_digits", true}},
       split({{"String", R"([\(\)\[\]\{\}]|([!\"#\$%\&'\*\+,\-\./:;<=>\?\\\^_`\|\~])\1*)"}}, "Isolated", false),
       split({{"String", "\n"}}, "Isolated", false), byte_level(false)});
  set_pipeline(doc, {{"type", "NFKC"}}, sequence("pretokenizers", splits), byte_level(true));
  info->unk = "<unk>", info->bos = "<s>", info->eos = "</s>", info->pad = "<pad>";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@bos"}, info->suffix = {"@eos"};
}

// The model the class constructs must be the file's (the class takes only its vocabulary).
json& require_model(json& doc, const json& config, const std::string& file, const char* type) {
  json& model = doc["model"];
  ALPACA_CHECK(json_string_or(model, "type", "") == type,
               file << ": tokenizer_class " << json_string_or(config, "tokenizer_class", "?") << " builds a " << type
                    << " model, but the file's model is " << model.value("type", json("?")).dump()
                    << "; fix tokenizer_class, or set \"tokenizer_class\": \"PreTrainedTokenizerFast\" in "
                       "tokenizer_config.json to run the file's own pipeline");
  return model;
}

// Unigram(vocab, unk_id=<the class's fixed id>, byte_fallback=False).
void set_unigram(json& doc, const json& config, const std::string& file, int64_t unk_id) {
  json& model = require_model(doc, config, file, "Unigram");
  model["unk_id"] = unk_id;
  model["byte_fallback"] = false;
}

// convert_to_native_format hands the class the file's Precompiled charsmap (the normalizer itself
// or the first in its Sequence); the class makes it its normalizer. Null when there is none.
json file_precompiled(const json& doc) {
  const json n = doc.value("normalizer", json());
  const json list = n.is_object() && n.value("type", json()) == "Sequence" ? n.value("normalizers", json::array())
                                                                          : json::array({n});
  for (const json& x : list)
    if (x.is_object() && x.value("type", json()) == "Precompiled" && x.contains("precompiled_charsmap"))
      return {{"type", "Precompiled"}, {"precompiled_charsmap", x.at("precompiled_charsmap")}};
  return nullptr;
}

json metaspace_split(const char* prepend_scheme) {
  return {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", prepend_scheme}, {"split", true}};
}

// WhitespaceSplit then Metaspace(split), Metaspace decoding: T5's and XLM-R's pre-tokenizer.
void set_sentencepiece_pipeline(json& doc, const char* prepend_scheme) {
  set_pipeline(doc, file_precompiled(doc),
               sequence("pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, metaspace_split(prepend_scheme)})),
               metaspace_split(prepend_scheme));
}

// models/t5/tokenization_t5.py: Unigram with unk_id 2 whatever the vocabulary, the file's
// charsmap, "$A </s>" (the eos id), and <extra_id_0..extra_ids-1> as extra special tokens unless
// additional_special_tokens already holds sentinels.
// T5's (and Lasr's, VideoPrism's) sentinels: <extra_id_0..extra_ids-1> as extra special tokens
// unless additional_special_tokens already holds some.
void add_sentinels(const json& config, const std::string& file, const char* cls, TokenizerClassInfo* info) {
  const json extra_ids = config.value("extra_ids", json(100));
  ALPACA_CHECK(extra_ids.is_number_integer() && extra_ids.get<int64_t>() >= 0,
               file << ": " << cls << "'s extra_ids must be a non-negative integer");
  bool has_sentinels = false;
  for (const json& t : config.value("additional_special_tokens", json::array()))
    has_sentinels = has_sentinels || role_kwarg(json{{"t", t}}, "t", "").find("<extra_id_") != std::string::npos;
  if (!has_sentinels)
    for (int64_t i = 0; i < extra_ids.get<int64_t>(); ++i) info->extra_specials.push_back("<extra_id_" + std::to_string(i) + ">");
  info->extras_rule = ExtrasRule::kAdditionalThenClass;
}

void build_t5(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 2);
  set_sentencepiece_pipeline(doc, "always");
  info->eos = "</s>", info->unk = "<unk>", info->pad = "<pad>", info->bos = "";
  add_sentinels(config, file, "T5Tokenizer", info);
  info->post = PostProcessorRule::kTemplate;
  info->suffix = {"@eos"};
}

// models/xlm_roberta/tokenization_xlm_roberta.py: Unigram with unk_id 3, the file's charsmap,
// Metaspace "always" ("never" without add_prefix_space), "<s> $A </s>".
void build_xlm_roberta(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 3);
  set_sentencepiece_pipeline(doc, flag(config, "add_prefix_space").value_or(true) ? "always" : "never");
  roberta_roles(info);
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@bos"}, info->suffix = {"@eos"};
  info->pair_doubles_suffix = true;
}

// Albert's roles. Its "[CLS] $A [SEP]" is set before TokenizersBackend.__init__, which puts the
// file's post-processor back (kFile).
void albert_roles(TokenizerClassInfo* info) {
  info->bos = info->cls = "[CLS]", info->eos = info->sep = "[SEP]";
  info->unk = "<unk>", info->pad = "<pad>", info->mask = "[MASK]";
}

// models/albert/tokenization_albert.py: Unigram with unk_id 1; `` and '' -> ", NFKD +
// StripAccents (unless keep_accents), Lowercase (do_lower_case), the file's charsmap; Metaspace
// "always" ("never" without add_prefix_space); the file's post-processor.
void build_albert(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const json precompiled = file_precompiled(doc);
  set_unigram(doc, config, file, 1);
  json list = json::array({replace({{"String", "``"}}, "\""), replace({{"String", "''"}}, "\"")});
  if (!flag(config, "keep_accents").value_or(false)) list.push_back({{"type", "NFKD"}}), list.push_back({{"type", "StripAccents"}});
  if (flag(config, "do_lower_case").value_or(true)) list.push_back({{"type", "Lowercase"}});
  if (!precompiled.is_null()) list.push_back(precompiled);
  const char* scheme = flag(config, "add_prefix_space").value_or(true) ? "always" : "never";
  set_pipeline(doc, sequence("normalizers", list),
               sequence("pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, metaspace_split(scheme)})),
               metaspace_split(scheme));
  albert_roles(info);
}

// models/deberta_v2/tokenization_deberta_v2.py: Unigram whose unk_id is the index of
// (unk_token, 0.0) in the vocabulary (else the unk_id kwarg, 1); Lowercase (do_lower_case,
// default false), whitespace runs and \n\r\t -> " ", NFC, right strip; Metaspace "always"
// ("first" without add_prefix_space); "[CLS] $A [SEP]". split_by_punct (a Punctuation
// pre-tokenizer) is refused.
void build_deberta_v2(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  ALPACA_CHECK(!flag(config, "split_by_punct").value_or(false),
               file << ": DebertaV2Tokenizer with split_by_punct (a Punctuation pre-tokenizer) is not reimplemented; "
                       "set \"tokenizer_class\": \"PreTrainedTokenizerFast\" to run the file as is");
  const std::string unk = role_kwarg(config, "unk_token", "[UNK]");
  int64_t unk_id = config.value("unk_id", json(1)).is_number_integer() ? config.value("unk_id", json(1)).get<int64_t>() : 1;
  const json& vocab = require_model(doc, config, file, "Unigram").value("vocab", json::array());
  for (size_t i = 0; i < vocab.size(); ++i)
    if (vocab[i].is_array() && vocab[i].size() == 2 && vocab[i][0] == unk && vocab[i][1] == 0.0) {
      unk_id = static_cast<int64_t>(i);
      break;
    }
  set_unigram(doc, config, file, unk_id);
  json list = json::array();
  if (flag(config, "do_lower_case").value_or(false)) list.push_back({{"type", "Lowercase"}});
  list.push_back(replace({{"Regex", R"(\s{2,}|[\n\r\t])"}}, " "));
  list.push_back({{"type", "NFC"}});
  list.push_back({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}});
  const char* scheme = flag(config, "add_prefix_space").value_or(true) ? "always" : "first";
  set_pipeline(doc, sequence("normalizers", list), sequence("pretokenizers", json::array({metaspace_split(scheme)})),
               metaspace_split(scheme));
  info->bos = info->cls = "[CLS]", info->eos = info->sep = "[SEP]";
  info->unk = "[UNK]", info->pad = "[PAD]", info->mask = "[MASK]";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
}

// The WordPiece model, BertNormalizer(`clean_text`, do_lower_case, tokenize_chinese_chars,
// strip_accents), BertPreTokenizer and WordPiece decoder (with `decoder_prefix`) that Bert's
// relatives build; the model keeps WordPiece's defaults ("##", 100 chars).
void set_bert_pipeline(json& doc, const json& config, const std::string& file, const char* unk,
                       const std::string& decoder_prefix, bool clean_text = true) {
  json& model = require_model(doc, config, file, "WordPiece");
  model["unk_token"] = role_kwarg(config, "unk_token", unk);
  model["continuing_subword_prefix"] = "##";
  model["max_input_chars_per_word"] = 100;
  const json strip = config.contains("strip_accents") ? config.at("strip_accents") : json(nullptr);
  ALPACA_CHECK(strip.is_null() || strip.is_boolean(), file << ": strip_accents must be true, false or null");
  json normalizer = bert_normalizer(flag(config, "do_lower_case").value_or(true), strip);
  normalizer["handle_chinese_chars"] = flag(config, "tokenize_chinese_chars").value_or(true);
  normalizer["clean_text"] = clean_text;
  set_pipeline(doc, normalizer, {{"type", "BertPreTokenizer"}},
               {{"type", "WordPiece"}, {"prefix", decoder_prefix}, {"cleanup", true}});
}

// Bert's roles and its "[CLS] $A [SEP]" post-processor.
void bert_roles(TokenizerClassInfo* info) {
  info->unk = "[UNK]", info->sep = "[SEP]", info->pad = "[PAD]", info->cls = "[CLS]", info->mask = "[MASK]";
  info->bos = "", info->eos = "";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
}

// models/bert/tokenization_bert.py (DistilBert, and Lxmert/MobileBert/SqueezeBert which load as
// Bert): WordPiece with the unk and "##", BertNormalizer(do_lower_case, tokenize_chinese_chars,
// strip_accents), BertPreTokenizer, the WordPiece decoder, "[CLS] $A [SEP]".
void build_bert(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bert_pipeline(doc, config, file, "[UNK]", "##");
  bert_roles(info);
}

// models/dpr/tokenization_dpr.py: Bert whose __init__ takes do_lower_case itself and does not pass
// it on, so Bert's default (true) always applies.
void build_dpr(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  json without = config;
  without.erase("do_lower_case");
  build_bert(doc, without, file, info);
}

// models/splinter/tokenization_splinter.py: Bert's pipeline, + the question token ("[QUESTION]").
void build_splinter(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  build_bert(doc, config, file, info);
  const std::string question = role_kwarg(config, "question_token", "[QUESTION]");
  if (!question.empty()) info->named_specials.push_back(question);  // a "*_token" kwarg: right after the roles
}

// models/mpnet/tokenization_mpnet.py: Bert's pipeline with RoBERTa's roles (<mask> lstrip) and a
// RobertaProcessing "<s> $A </s>".
void build_mpnet(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bert_pipeline(doc, config, file, "[UNK]", "##");
  roberta_roles(info);
  info->unk = "[UNK]", info->mask_lstrip = true;
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
  info->pair_doubles_suffix = true;
}

// models/funnel/tokenization_funnel.py: Bert's pipeline with clean_text and the decoder's
// wordpieces_prefix as kwargs, its own roles, "<cls> $A <sep>".
void build_funnel(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bert_pipeline(doc, config, file, "<unk>", json_string_or(config, "wordpieces_prefix", "##"),
                    flag(config, "clean_text").value_or(true));
  info->unk = "<unk>", info->sep = "<sep>", info->pad = "<pad>", info->cls = "<cls>", info->mask = "<mask>";
  info->bos = "<s>", info->eos = "</s>";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
}

// The index of `token` in a Unigram vocabulary ([piece, score] pairs) from `start`, with score 0.0
// when `zero_score` (Python's list.index((token, 0.0))); -1 when absent.
int64_t unigram_index(const json& model, const std::string& token, bool zero_score, size_t start = 0) {
  const json& vocab = model.value("vocab", json::array());
  for (size_t i = start; i < vocab.size(); ++i)
    if (vocab[i].is_array() && vocab[i].size() == 2 && vocab[i][0] == token && (!zero_score || vocab[i][1] == 0.0))
      return static_cast<int64_t>(i);
  return -1;
}

bool config_has(const json& config, const char* key) {
  return config.is_object() && config.contains(key) && !config.at(key).is_null();
}

const char* prefix_scheme(const json& config) {
  return flag(config, "add_prefix_space").value_or(true) ? "always" : "never";
}

// Metaspace(split) as the pre-tokenizer (no WhitespaceSplit) and the decoder.
void set_metaspace_pipeline(json& doc, json normalizer, const char* scheme) {
  set_pipeline(doc, std::move(normalizer), metaspace_split(scheme), metaspace_split(scheme));
}

json string_replace(const char* from, const char* to) { return replace({{"String", from}}, to); }
json regex_replace(const char* pattern, const char* to) { return replace({{"Regex", pattern}}, to); }

// The fairseq roles: <s> (bos, cls), </s> (eos, sep), <unk>, <pad>, <mask> with lstrip.
void fairseq_roles(TokenizerClassInfo* info) {
  roberta_roles(info);
  info->mask_lstrip = true;
}

// "<cls> $A <sep>" (pair "<cls> A <sep> <sep> B <sep>" with `doubles`).
void cls_sep_template(TokenizerClassInfo* info, bool doubles) {
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@sep"};
  info->pair_doubles_suffix = doubles;
}

// models/camembert/tokenization_camembert.py: Unigram whose unk_id is the unk token's index (else
// 0), the file's charsmap, WhitespaceSplit + Metaspace(always / never), the fairseq roles, the
// NOTUSED tokens unless additional_special_tokens is given, "<s> $A </s>".
void build_camembert(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const std::string unk = role_kwarg(config, "unk_token", "<unk>");
  const int64_t unk_id = unigram_index(require_model(doc, config, file, "Unigram"), unk, false);
  set_unigram(doc, config, file, unk_id < 0 ? 0 : unk_id);
  set_sentencepiece_pipeline(doc, prefix_scheme(config));
  fairseq_roles(info);
  info->extra_specials = {"<s>NOTUSED", "</s>NOTUSED", "<unk>NOTUSED"};  // replaced by the config's list
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@bos"}, info->suffix = {"@eos"};
  info->pair_doubles_suffix = true;
}

// models/mbart/tokenization_mbart.py: Unigram (unk_id 3), no normalizer, WhitespaceSplit +
// Metaspace, the fairseq roles, its 25 language codes as extra special tokens, and
// "$A </s> <src_lang>" (src_lang en_XX by default).
void build_mbart(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  static const char* kCodes[] = {"ar_AR", "cs_CZ", "de_DE", "en_XX", "es_XX", "et_EE", "fi_FI", "fr_XX", "gu_IN",
                                 "hi_IN", "it_IT", "ja_XX", "kk_KZ", "ko_KR", "lt_LT", "lv_LV", "my_MM", "ne_NP",
                                 "nl_XX", "ro_RO", "ru_RU", "si_LK", "tr_TR", "vi_VN", "zh_CN"};
  set_unigram(doc, config, file, 3);
  set_pipeline(doc, nullptr,
               sequence("pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, metaspace_split("always")})),
               metaspace_split("always"));
  fairseq_roles(info);
  info->extra_specials.assign(std::begin(kCodes), std::end(kCodes));
  info->extras_rule = ExtrasRule::kClassThenAdditional;
  info->post = PostProcessorRule::kTemplate;
  info->suffix = {"@eos", json_string_or(config, "src_lang", "en_XX")};
}

// models/pegasus/tokenization_pegasus.py: Unigram whose unk_id is the index of (unk, 0.0) after
// the first entry; the charsmap + runs of spaces to one ("\n" -> " " instead of the charsmap);
// Metaspace; <mask_2> as mask, <mask_1> and <unk_2>..<unk_{offset-1}> as extra tokens; "$A </s>".
void build_pegasus(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const std::string unk = role_kwarg(config, "unk_token", "<unk>");
  const int64_t unk_id = unigram_index(require_model(doc, config, file, "Unigram"), unk, true, 1);
  ALPACA_CHECK(unk_id >= 0, file << ": PegasusTokenizer needs (\"" << unk << "\", 0.0) in the vocabulary after its "
                                 << "first entry (transformers 5 fails without it); fix the vocabulary or unk_token");
  const json offset = config.value("offset", json(103));
  ALPACA_CHECK(offset.is_number_integer() && offset.get<int64_t>() >= 2, file << ": PegasusTokenizer's offset must be an integer >= 2");
  set_unigram(doc, config, file, unk_id);
  const json precompiled = file_precompiled(doc);
  json list = json::array({precompiled.is_null() ? regex_replace("\n", " ") : precompiled, regex_replace(" {2,}", " ")});
  set_metaspace_pipeline(doc, sequence("normalizers", list), "always");
  info->pad = "<pad>", info->eos = "</s>", info->unk = "<unk>", info->mask = "<mask_2>", info->bos = "";
  const std::string sent = role_kwarg(config, "mask_token_sent", "<mask_1>");
  bool listed = false;
  for (const json& t : config.value("additional_special_tokens", json::array()))
    listed = listed || role_kwarg(json{{"t", t}}, "t", "") == sent;
  if (!sent.empty() && !listed) info->extra_specials.push_back(sent);
  for (int64_t i = 2; i < offset.get<int64_t>(); ++i) info->extra_specials.push_back("<unk_" + std::to_string(i) + ">");
  info->extras_rule = ExtrasRule::kClassOnly;  // additional_special_tokens only decides on <mask_1>
  info->post = PostProcessorRule::kTemplate;
  info->suffix = {"@eos"};
}

// models/big_bird/tokenization_big_bird.py: Unigram whose unk_id is the index of (unk, 0.0)
// (else 100), Strip(none) + runs of spaces to "▁", Metaspace (always / never), "[CLS] $A [SEP]".
void build_big_bird(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const std::string unk = role_kwarg(config, "unk_token", "<unk>");
  const int64_t unk_id = unigram_index(require_model(doc, config, file, "Unigram"), unk, true);
  set_unigram(doc, config, file, unk_id < 0 ? 100 : unk_id);
  json strip = {{"type", "Strip"}, {"strip_left", false}, {"strip_right", false}};
  set_metaspace_pipeline(doc, sequence("normalizers", json::array({strip, regex_replace(" {2,}", "\u2581")})),
                         prefix_scheme(config));
  info->unk = "<unk>", info->bos = "<s>", info->eos = "</s>", info->pad = "<pad>";
  info->sep = "[SEP]", info->mask = "[MASK]", info->cls = "[CLS]", info->mask_lstrip = true;
  cls_sep_template(info, false);
}

// The XLNet/RemBert/Albert normalizers: `` and '' -> ", [NFKD + StripAccents], [Lowercase], the
// file's charsmap; `extra` goes after the quotes.
json sentencepiece_normalizers(const json& doc, bool strip_accents, bool lowercase, const json& extra = nullptr) {
  json list = json::array({string_replace("``", "\""), string_replace("''", "\"")});
  if (!extra.is_null()) list.push_back(extra);
  if (strip_accents) list.push_back({{"type", "NFKD"}}), list.push_back({{"type", "StripAccents"}});
  if (lowercase) list.push_back({{"type", "Lowercase"}});
  const json precompiled = file_precompiled(doc);
  if (!precompiled.is_null()) list.push_back(precompiled);
  return sequence("normalizers", list);
}

// models/xlnet/tokenization_xlnet.py: Unigram with the unk_id kwarg (0), the quotes, NFKD +
// StripAccents always (keep_accents is ignored), Lowercase (do_lower_case), the charsmap;
// WhitespaceSplit + Metaspace; <eop> <eod> unless additional_special_tokens is given; "$A <sep> <cls>".
void build_xlnet(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const json unk_id = config.value("unk_id", json(0));
  ALPACA_CHECK(unk_id.is_number_integer(), file << ": XLNetTokenizer's unk_id must be an integer");
  set_unigram(doc, config, file, unk_id.get<int64_t>());
  const json normalizer = sentencepiece_normalizers(doc, true, flag(config, "do_lower_case").value_or(false));
  set_sentencepiece_pipeline(doc, "always");
  doc["normalizer"] = normalizer;
  info->bos = "<s>", info->eos = "</s>", info->unk = "<unk>", info->sep = "<sep>", info->pad = "<pad>";
  info->cls = "<cls>", info->mask = "<mask>", info->mask_lstrip = true;
  info->extra_specials = {"<eop>", "<eod>"};  // replaced by the config's list
  info->post = PostProcessorRule::kTemplate;
  info->suffix = {"@sep", "@cls"};
}

// models/barthez/tokenization_barthez.py: Unigram (unk_id 3), whitespace runs and \n\r\t -> " ",
// NFC, right strip; Metaspace (always / never); the fairseq roles; the file's post-processor.
void build_barthez(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 3);
  json list = json::array({regex_replace(R"(\s{2,}|[\n\r\t])", " "), {{"type", "NFC"}},
                           {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}});
  set_metaspace_pipeline(doc, sequence("normalizers", list), prefix_scheme(config));
  fairseq_roles(info);
}

// models/rembert/tokenization_rembert.py: Unigram (unk_id 2), the quotes, runs of spaces to one,
// NFKD + StripAccents unless keep_accents (true), Lowercase (do_lower_case, false), the charsmap;
// Metaspace (always / never); "[CLS] $A [SEP]".
void build_rembert(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 2);
  const json normalizer = sentencepiece_normalizers(doc, !flag(config, "keep_accents").value_or(true),
                                                    flag(config, "do_lower_case").value_or(false),
                                                    regex_replace(" {2,}", " "));
  set_metaspace_pipeline(doc, normalizer, prefix_scheme(config));
  info->bos = info->cls = "[CLS]", info->eos = info->sep = "[SEP]";
  info->unk = "<unk>", info->pad = "<pad>", info->mask = "[MASK]";
  cls_sep_template(info, false);
}

// models/lasr/tokenization_lasr.py (unk_id 3, "$A </s>") and models/videoprism/
// tokenization_videoprism.py (unk_id 2, the file's post-processor): T5's pipeline and sentinels.
void build_t5_like(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info, bool lasr) {
  set_unigram(doc, config, file, lasr ? 3 : 2);
  set_sentencepiece_pipeline(doc, "always");
  info->eos = "</s>", info->unk = "<unk>", info->pad = "<pad>", info->bos = "";
  add_sentinels(config, file, lasr ? "LasrTokenizer" : "VideoPrismTokenizer", info);
  if (!lasr) return;
  info->post = PostProcessorRule::kTemplate, info->suffix = {"@eos"};
  info->ctc_decode = true;
}

// models/mluke/tokenization_mluke.py: Unigram (unk_id 0), the quotes, Metaspace, the fairseq roles,
// "▁<ent>" "▁<ent2>" and the entity vocabulary's special tokens as extra tokens, "<s> $A </s>".
void build_mluke(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 0);
  set_metaspace_pipeline(doc, sequence("normalizers", json::array({string_replace("``", "\""), string_replace("''", "\"")})),
                         "always");
  fairseq_roles(info);
  info->named_specials = {"\u2581" + role_kwarg(config, "entity_token_1", role_kwarg(config, "entity_1_token", "<ent>")),
                          "\u2581" + role_kwarg(config, "entity_token_2", role_kwarg(config, "entity_2_token", "<ent2>"))};
  for (const auto& [key, fallback] : std::vector<std::pair<const char*, const char*>>{
           {"entity_unk_token", "[UNK]"}, {"entity_pad_token", "[PAD]"}, {"entity_mask_token", "[MASK]"},
           {"entity_mask2_token", "[MASK2]"}})
    info->named_specials.push_back(role_kwarg(config, key, fallback));
  info->extras_rule = ExtrasRule::kBoth;
  cls_sep_template(info, true);
  // Its second _post_init re-adds the mask as AddedToken(lstrip=True), over the file's entry.
  const std::string mask = role_kwarg(config, "mask_token", "<mask>");
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array())
    for (json& t : doc["added_tokens"])
      if (t.is_object() && t.value("content", json()) == mask) t["lstrip"] = true;
}

// models/xglm/tokenization_xglm.py: Unigram (unk_id 3), the charsmap + runs of spaces to one,
// Metaspace (always / never), <madeupword0..6>, and "</s> $A".
void build_xglm(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_unigram(doc, config, file, 3);
  const json precompiled = file_precompiled(doc);
  json list = json::array({regex_replace(" {2,}", " ")});
  if (!precompiled.is_null()) list.insert(list.begin(), precompiled);
  set_metaspace_pipeline(doc, sequence("normalizers", list), prefix_scheme(config));
  roberta_roles(info);
  info->mask = "";
  for (int i = 0; i < 7; ++i) info->extra_specials.push_back("<madeupword" + std::to_string(i) + ">");
  info->extras_rule = ExtrasRule::kAdditionalThenClass;
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@eos"};
}

// models/nllb/tokenization_nllb.py's FAIRSEQ_LANGUAGE_CODES (202), in its order.
constexpr const char* kNllbCodes =
    "ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab arb_Arab "
    "ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn bak_Cyrl bam_Latn "
    "ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt bos_Latn bug_Latn bul_Cyrl "
    "cat_Latn ceb_Latn ces_Latn cjk_Latn ckb_Arab crh_Latn cym_Latn dan_Latn deu_Latn dik_Latn dyu_Latn "
    "dzo_Tibt ell_Grek eng_Latn epo_Latn est_Latn eus_Latn ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn "
    "fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn "
    "heb_Hebr hin_Deva hne_Deva hrv_Latn hun_Latn hye_Armn ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn "
    "jav_Latn jpn_Jpan kab_Latn kac_Latn kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor knc_Arab knc_Latn "
    "kaz_Cyrl kbp_Latn kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kon_Latn kor_Hang kmr_Latn "
    "lao_Laoo lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn lua_Latn lug_Latn "
    "luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn mni_Beng "
    "khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva nso_Latn nus_Latn "
    "nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn por_Latn prs_Arab pbt_Arab "
    "quy_Latn ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng scn_Latn shn_Mymr sin_Sinh slk_Latn "
    "slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn "
    "sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi "
    "taq_Latn taq_Tfng tpi_Latn tsn_Latn tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab "
    "ukr_Cyrl umb_Latn urd_Arab uzn_Latn vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn "
    "yue_Hant zho_Hans zho_Hant zul_Latn";

// The words of a space-separated list.
std::vector<std::string> words(const std::string& all) {
  std::vector<std::string> out;
  for (size_t i = 0, end; i < all.size(); i = end + 1) {
    end = std::min(all.find(' ', i), all.size());
    out.push_back(all.substr(i, end - i));
  }
  return out;
}

// models/nllb/tokenization_nllb.py: BPE(unk, fuse_unk, no byte fallback); the file's charsmap +
// runs of spaces to one (no normalizer without a charsmap); Metaspace(always, split) both ways;
// the fairseq roles; the 202 language codes unless additional/extra_special_tokens are given;
// "<src_lang> $A </s>" ("$A </s> <src_lang>" with legacy_behaviour), src_lang eng_Latn.
void build_nllb(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), true, false, std::nullopt, std::nullopt});
  const json precompiled = file_precompiled(doc);
  set_metaspace_pipeline(doc,
                         precompiled.is_null() ? json(nullptr)
                                               : sequence("normalizers", json::array({precompiled, regex_replace(" {2,}", " ")})),
                         "always");
  fairseq_roles(info);
  info->extra_specials = words(kNllbCodes);
  info->extras_rule = ExtrasRule::kNamed;  // extra_special_tokens, else additional_special_tokens, else the codes
  const std::string src = json_string_or(config, "src_lang", "eng_Latn");
  info->post = PostProcessorRule::kTemplate;
  if (flag(config, "legacy_behaviour").value_or(false)) {
    info->suffix = {"@eos", src};
  } else {
    info->prefix = {src}, info->suffix = {"@eos"};
  }
}

// The file's added tokens after the class replaced the model's vocabulary (MBart50's fairseq
// layout, Esmc's own): from_pretrained re-adds each by content, in the file's order, so it takes
// the new vocabulary's id (the last one for a repeated piece, as the crate) or the next free id.
void reassign_added_tokens(json& doc) {
  if (!doc.contains("added_tokens") || !doc["added_tokens"].is_array()) return;
  const json& vocab = doc["model"]["vocab"];
  std::map<std::string, int64_t> ids;
  int64_t next = 0;
  if (vocab.is_array()) {  // Unigram: [[piece, score], ...]
    for (size_t i = 0; i < vocab.size(); ++i)  // a malformed entry is the Unigram parser's error, later
      if (vocab[i].is_array() && !vocab[i].empty() && vocab[i][0].is_string()) ids[vocab[i][0].get<std::string>()] = static_cast<int64_t>(i);
    next = static_cast<int64_t>(vocab.size());
  } else {  // BPE: {token: id}
    for (const auto& [t, id] : vocab.items()) ids[t] = id.get<int64_t>(), next = std::max(next, id.get<int64_t>() + 1);
  }
  for (json& t : doc["added_tokens"]) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string()) continue;
    auto it = ids.find(t["content"].get<std::string>());
    t["id"] = it != ids.end() ? it->second : next++;
    if (it == ids.end()) ids[t["content"].get<std::string>()] = t["id"].get<int64_t>();
  }
}

// models/mbart50/tokenization_mbart50.py's FAIRSEQ_LANGUAGE_CODES (52), in its order.
constexpr const char* kMBart50Codes =
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV my_MM ne_NP "
    "nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID ka_GE km_KH mk_MK ml_IN "
    "mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES sl_SI";

// MBart50's vocabulary: the file's when it holds a language code; otherwise rebuilt in fairseq's
// layout: cls, pad, eos, unk (score 0), the file's pieces from index 3 on (SentencePiece's
// <unk> <s> </s> skipped), the 52 codes and the mask token (score 0).
void mbart50_vocab(json& doc, const json& config, const std::string& file, const std::vector<std::string>& codes) {
  json& vocab = doc["model"]["vocab"];
  ALPACA_CHECK(vocab.is_array(), file << ": model: MBart50Tokenizer needs a Unigram \"vocab\": [[piece, score], ...]");
  for (const json& item : vocab)
    if (item.is_array() && !item.empty() && item[0].is_string() &&
        std::find(codes.begin(), codes.end(), item[0].get<std::string>()) != codes.end())
      return;
  json rebuilt = json::array();
  for (const auto& [key, fallback] : std::vector<std::pair<const char*, const char*>>{
           {"cls_token", "<s>"}, {"pad_token", "<pad>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}})
    rebuilt.push_back(json::array({role_kwarg(config, key, fallback), 0.0}));
  for (size_t i = 3; i < vocab.size(); ++i) rebuilt.push_back(vocab[i]);
  for (const std::string& c : codes) rebuilt.push_back(json::array({c, 0.0}));
  rebuilt.push_back(json::array({role_kwarg(config, "mask_token", "<mask>"), 0.0}));
  vocab = std::move(rebuilt);
  reassign_added_tokens(doc);
}

// models/mbart50/tokenization_mbart50.py: Unigram (unk_id 3) over mbart50_vocab; the file's charsmap
// + runs of spaces to one; Metaspace(always, split) both ways (no WhitespaceSplit, unlike MBart);
// the fairseq roles without a bos; the 52 codes as extra special tokens; "<src_lang> $A </s>"
// (src_lang en_XX; one that is not a code fails in transformers: lang_code_to_id[src_lang]).
void build_mbart50(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const std::vector<std::string> codes = words(kMBart50Codes);
  const std::string src = json_string_or(config, "src_lang", "en_XX");
  ALPACA_CHECK(std::find(codes.begin(), codes.end(), src) != codes.end(),
               file << ": MBart50Tokenizer's src_lang \"" << src << "\" is not one of its 52 language codes (transformers 5 "
                    << "fails with KeyError); set src_lang in tokenizer_config.json to one of " << kMBart50Codes);
  const json precompiled = file_precompiled(doc);
  set_unigram(doc, config, file, 3);
  mbart50_vocab(doc, config, file, codes);
  json list = json::array({regex_replace(" {2,}", " ")});
  if (!precompiled.is_null()) list.insert(list.begin(), precompiled);
  set_metaspace_pipeline(doc, sequence("normalizers", list), "always");
  fairseq_roles(info);
  info->bos = "";
  info->extra_specials = codes;
  info->extras_rule = ExtrasRule::kAdditionalThenClass;
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {src}, info->suffix = {"@eos"};
}

// models/seamless_m4t/tokenization_seamless_m4t.py: BPE(unk, fuse_unk, no byte fallback); \n\r\t
// to spaces, NFKC, right strip, " +▁" -> "▁", an all-"▁" text emptied, runs of spaces -> "▁";
// Metaspace(first, split) both ways; no mask. __call__ switches to the source-language template
// "<src_lang> $A </s>" (src_lang "eng" written "__eng__"; the unk's id when it is not a token).
void build_seamless_m4t(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), true, false, std::nullopt, std::nullopt});
  const json list = json::array({regex_replace("[\\n\\r\\t]", " "), {{"type", "NFKC"}},
                                 {{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}},
                                 regex_replace(" +\u2581", "\u2581"), regex_replace("^\u2581+$", ""),
                                 regex_replace(" {2,}", "\u2581")});
  set_pipeline(doc, sequence("normalizers", list), metaspace_split("first"), metaspace_split("first"));
  roberta_roles(info);
  info->mask = "";
  std::string src = json_string_or(config, "src_lang", "eng");
  if (src.find("__") == std::string::npos) src = "__" + src + "__";
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {src}, info->suffix = {"@eos"};
}

// models/esmc/tokenization_esmc.py's SEQUENCE_VOCAB (33 amino-acid tokens and specials).
constexpr const char* kEsmcVocab = "<cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - | <mask>";

// models/esmc/tokenization_esmc.py: a BPE of its own 33-token vocabulary (no merges, the unk; no
// normalizer, pre-tokenizer or decoder): the file contributes only its added tokens (re-added by
// content). bos = cls <cls>, eos <eos>, the chain-break token "|" special; "<cls> $A <eos>".
void build_esmc(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  const std::vector<std::string> vocab_list = words(kEsmcVocab);
  json vocab = json::object();
  for (size_t i = 0; i < vocab_list.size(); ++i) vocab[vocab_list[i]] = static_cast<int64_t>(i);
  for (const auto& [key, fallback] : std::vector<std::pair<const char*, const char*>>{{"cls_token", "<cls>"}, {"eos_token", "<eos>"}})
    ALPACA_CHECK(vocab.contains(role_kwarg(config, key, fallback)),
                 file << ": EsmcTokenizer's " << key << " must be one of its own vocabulary (transformers 5 fails with "
                      << "KeyError otherwise); remove " << key << " from tokenizer_config.json");
  doc["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  set_bpe(doc, file, {role_kwarg(config, "unk_token", "<unk>"), false, false, std::nullopt, std::nullopt});
  set_pipeline(doc, nullptr, nullptr, nullptr);
  reassign_added_tokens(doc);
  info->unk = "<unk>", info->cls = "<cls>", info->pad = "<pad>", info->mask = "<mask>", info->eos = "<eos>";
  info->bos = role_kwarg(config, "bos_token", "");  // None: the cls token
  if (info->bos->empty()) info->bos = role_kwarg(config, "cls_token", "<cls>");
  info->sep = "";
  const std::string chain_break = role_kwarg(config, "chain_break_token", "|");
  if (!chain_break.empty()) info->named_specials.push_back(chain_break);
  info->extras_rule = ExtrasRule::kClassOnly;  // it passes extra_special_tokens itself: additional is dropped
  info->post = PostProcessorRule::kTemplate;
  info->prefix = {"@cls"}, info->suffix = {"@eos"};
}

// Python's str.split() separators (str.isspace: Rust's char::is_whitespace and \x1c-\x1f).
constexpr const char* kPythonWhitespace =
    "[\\t-\\r\\x{1c}-\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]+";

// models/markuplm/tokenization_markuplm.py: BPE without an unk, empty affixes; ByteLevel
// (add_prefix_space, false) both ways; the RoBERTa roles (<mask> lstrip); "<s> $A </s>". Without
// xpaths, __call__ splits a text with str.split() into nodes and encodes them as pre-split words,
// so the pre-tokenizer here splits on Python's whitespace first. transformers 5 cannot load the
// class without tags_dict.
void build_markuplm(json& doc, const json& config, const std::string& file, TokenizerClassInfo* info) {
  ALPACA_CHECK(config_has(config, "tags_dict"),
               file << ": tokenizer_class " << json_string_or(config, "tokenizer_class", "MarkupLMTokenizer")
                    << ": MarkupLMTokenizer (a BPE pipeline) needs \"tags_dict\" in tokenizer_config.json: "
                       "transformers 5 cannot load the class without it (TypeError: MarkupLMTokenizer.__init__() missing 1 required positional "
                       "argument: 'tags_dict'); copy the checkpoint's tokenizer_config.json, or set \"tokenizer_class\": "
                       "\"PreTrainedTokenizerFast\" in tokenizer_config.json to run the file's own pipeline");
  set_bpe(doc, file, {std::nullopt, false, false, std::string(), std::string()});
  const bool aps = flag(config, "add_prefix_space").value_or(false);
  set_pipeline(doc,
               nullptr,
               sequence("pretokenizers", json::array({split({{"Regex", kPythonWhitespace}}, "Removed", false), byte_level(aps)})),
               byte_level(true));
  roberta_roles(info);
  info->mask_lstrip = true;
  cls_sep_template(info, false);
}

using Builder = void (*)(json&, const json&, const std::string&, TokenizerClassInfo*);

// The reimplemented classes (by the class AutoTokenizer instantiates).
const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> m = {
      {"LlamaTokenizer", build_llama},
      {"CodeLlamaTokenizer", build_code_llama},
      {"GemmaTokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) { build_gemma(d, c, f, i, false); }},
      {"Siglip2Tokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) { build_gemma(d, c, f, i, true); }},
      {"GPT2Tokenizer", build_gpt2},
      {"CodeGenTokenizer", build_codegen},
      {"GPTNeoXTokenizer", build_gpt_neox},
      {"CohereTokenizer", build_cohere},
      {"Qwen2Tokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) { build_qwen(d, c, f, i, kQwen2Pattern); }},
      {"Qwen3_5Tokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) {
         build_qwen(d, c, f, i, kQwen35Pattern);
         i->bos = "";
       }},
      {"RobertaTokenizer", build_roberta},
      {"LukeTokenizer", build_luke},
      {"BlenderbotTokenizer", build_blenderbot},
      {"DebertaTokenizer", build_deberta},
      {"WhisperTokenizer", build_whisper},
      {"CLIPTokenizer", build_clip},
      {"OpenAIGPTTokenizer", build_openai_gpt},
      {"HerbertTokenizer", build_herbert},
      {"ReformerTokenizer", build_reformer},
      {"Tipsv2Tokenizer", build_tipsv2},
      {"NougatTokenizer", build_nougat},
      {"T5Tokenizer", build_t5},
      {"XLMRobertaTokenizer", build_xlm_roberta},
      {"BertTokenizer", build_bert},
      {"DistilBertTokenizer", build_bert},
      {"DPRContextEncoderTokenizer", build_dpr},
      {"DPRQuestionEncoderTokenizer", build_dpr},
      {"DPRReaderTokenizer", build_dpr},
      {"SplinterTokenizer", build_splinter},
      {"MPNetTokenizer", build_mpnet},
      {"FunnelTokenizer", build_funnel},
      {"CamembertTokenizer", build_camembert},
      {"MBartTokenizer", build_mbart},
      {"PegasusTokenizer", build_pegasus},
      {"BigBirdTokenizer", build_big_bird},
      {"XLNetTokenizer", build_xlnet},
      {"BarthezTokenizer", build_barthez},
      {"RemBertTokenizer", build_rembert},
      {"LasrTokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) { build_t5_like(d, c, f, i, true); }},
      {"VideoPrismTokenizer", [](json& d, const json& c, const std::string& f, TokenizerClassInfo* i) { build_t5_like(d, c, f, i, false); }},
      {"MLukeTokenizer", build_mluke},
      {"XGLMTokenizer", build_xglm},
      {"NllbTokenizer", build_nllb},
      {"MBart50Tokenizer", build_mbart50},
      {"SeamlessM4TTokenizer", build_seamless_m4t},
      {"EsmcTokenizer", build_esmc},
      {"MarkupLMTokenizer", build_markuplm},
      {"AlbertTokenizer", build_albert},
      {"DebertaV2Tokenizer", build_deberta_v2},
  };
  return m;
}

// Why a rebuilt class is refused: the model its __init__ builds and the exception transformers 5
// itself raises on a plain text (tests/reference/tokenizer_classes_reference.py records them).
std::string unsupported_reason(const std::string& cls) {
  static const std::map<std::string, std::string> kWhy = {
      {"LayoutXLMTokenizer", "a Unigram model, and its __call__ takes pre-split words with bounding boxes, not text: "
                             "on a plain string transformers 5 raises ValueError: Words must of type `list[str]` (single "
                             "pretokenized example), or `list[list[str]]` (batch of pretokenized examples)."},
      {"UdopTokenizer", "a Unigram model, and its __call__ takes pre-split words with bounding boxes, not text: on a "
                        "plain string transformers 5 raises ValueError: Words must of type `list[str]` (single "
                        "pretokenized example), or `list[list[str]]` (batch of pretokenized examples)."},
      {"LayoutLMv2Tokenizer", "a WordPiece model, and its __call__ takes pre-split words with bounding boxes, not "
                              "text: on a plain string transformers 5 raises ValueError: Words must be of type "
                              "`List[str]` (single pretokenized example), or `List[List[str]]` (batch of pretokenized "
                              "examples)."},
      {"RoFormerTokenizer", "a WordPiece model with a custom Python pre-tokenizer (jieba word segmentation through the "
                            "rjieba package), which no tokenizer.json can hold (without rjieba transformers 5 raises "
                            "ImportError: You need to install rjieba to use RoFormerTokenizer.)."},
      {"LayoutLMv3Tokenizer", "a BPE pipeline with ByteLevel(add_prefix_space) and RobertaProcessing, and its __call__ "
                              "takes pre-split words with bounding boxes, not text: on a plain string transformers 5 "
                              "raises ValueError: Words must be of type `List[str]` (single pretokenized example), or "
                              "`List[List[str]]` (batch of pretokenized examples)."}};
  auto it = kWhy.find(cls);
  if (it == kWhy.end()) return "builds a pipeline of its own, which is not reimplemented here";
  return "builds " + it->second + " transformers 5 itself cannot tokenize a text with it, so neither does this "
         "reimplementation";
}

std::string strip_fast(const std::string& s) {
  return s.size() > 4 && s.compare(s.size() - 4, 4, "Fast") == 0 ? s.substr(0, s.size() - 4) : s;
}

// Classes without an __init__ of their own whose parent defines one: convert_to_native_format
// then hands __init__ the tokenizer.json itself, so the file's pipeline stays, but the parent's
// __init__ still sets its default roles (added when the vocabulary lacks them) and, when it sets
// it after TokenizersBackend.__init__, its post-processor.
// Only the parent's roles apply: its pipeline (and the model type it would require) does not, so
// these classes load any tokenizer.json, as transformers does.
const std::map<std::string, void (*)(TokenizerClassInfo*)>& inherited_init_classes() {
  static const std::map<std::string, void (*)(TokenizerClassInfo*)> m = {{"ConvBertTokenizer", bert_roles},
                                                                         {"FNetTokenizer", albert_roles}};
  return m;
}

// The class a tokenizer_class name resolves to: a rebuilding class, else TokenizersBackend (which
// is also where transformers falls back for a name it does not know).
std::string canonical(const std::string& name) {
  if (inherited_init_classes().count(strip_fast(name))) return strip_fast(name);
  auto it = rebuilt_classes().find(strip_fast(name));
  return it == rebuilt_classes().end() ? "TokenizersBackend" : it->second;
}

// AutoTokenizer.from_pretrained's choice of class for the directory, in its order.
std::string resolve_class(const json& doc, const json& config, const json& model_config) {
  if (config.is_object() && config.contains("auto_map")) return "TokenizersBackend";  // remote code: as is
  const std::string hub = json_string_or(config, "tokenizer_class", json_string_or(model_config, "tokenizer_class", ""));
  const std::string model_type = json_string_or(model_config, "model_type", "");
  const auto reg = registered_classes().find(model_type);
  const std::string registered = reg == registered_classes().end() ? "" : strip_fast(reg->second);
  const bool incorrect = incorrect_hub_class_types().count(model_type) > 0;
  // A LlamaTokenizer whose tokenizer.json is byte-level (LLaMA-3 repositories) loads as is.
  if (strip_fast(hub) == "LlamaTokenizer" && registered != "MistralCommonBackend" && !incorrect &&
      (has_byte_level(doc.value("pre_tokenizer", json())) || has_byte_level(doc.value("decoder", json()))))
    return "TokenizersBackend";
  // config.json's model_type registers another class than the Hub's tokenizer_class.
  if (!hub.empty() && !registered.empty() && registered != strip_fast(hub)) {
    static const std::set<std::string> kGeneric = {"TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast",
                                                   "MistralCommonBackend"};
    if (!kGeneric.count(registered)) return canonical(incorrect ? registered : hub);
    return "TokenizersBackend";
  }
  if (!hub.empty()) return canonical(hub);
  return registered.empty() ? "TokenizersBackend" : canonical(registered);
}

// Python's truth value of a kwarg read from JSON (None, [], {}, "", false, 0 are false).
bool truthy(const json& v) {
  return !(v.is_null() || (v.is_array() && v.empty()) || (v.is_object() && v.empty()) ||
           (v.is_string() && v.get<std::string>().empty()) || v == json(false) || v == json(0));
}

// A list of special tokens (strings or AddedToken objects) as the class receives it.
std::vector<std::string> token_list(const json& v, const char* key, const std::string& dir) {
  ALPACA_CHECK(v.is_array(), key << " in the tokenizer files of " << dir
                                 << " must be a list of tokens (strings or AddedToken objects); fix it or remove it");
  std::vector<std::string> out;
  for (const json& t : v) {
    const std::string s = role_kwarg(json{{"t", t}}, "t", "");
    ALPACA_CHECK(!s.empty(), key << " in the tokenizer files of " << dir << " holds " << t.dump()
                                 << ", which is not a token (a non-empty string or an AddedToken object)");
    out.push_back(s);
  }
  return out;
}

// The final extra special tokens: the class's own (info.extra_specials) and the config's, combined
// as the class's __init__ and PreTrainedTokenizerBase.__init__ do (see ExtrasRule).
std::vector<std::string> resolve_extras(const TokenizerClassInfo& info, const ConfigExtras& k) {
  const std::vector<std::string> none;
  const std::vector<std::string>& own = info.extra_specials;
  const std::vector<std::string>& add = k.additional ? *k.additional : none;
  auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  if (info.extras_rule == ExtrasRule::kNamed) return k.extra && !k.extra_null ? *k.extra : k.additional ? add : own;
  if (info.extras_rule == ExtrasRule::kBoth) return cat(k.extra.value_or(none), add);
  if (k.extra) return *k.extra;  // the base __init__ takes it over the class's additional_special_tokens
  if (!k.additional) return own;
  switch (info.extras_rule) {
    case ExtrasRule::kAdditionalThenClass: return cat(add, own);
    case ExtrasRule::kClassThenAdditional: return cat(own, add);
    case ExtrasRule::kClassOnly: return own;
    default: return add;
  }
}

// tokenizer_config.json as the class's __init__ sees it: additional_special_tokens is the kwarg
// from_pretrained leaves (absent when it became extra_special_tokens).
json class_kwargs(const json& config, const ConfigExtras& extras) {
  json kw = config.is_object() ? config : json::object();
  kw.erase("additional_special_tokens");
  kw.erase("extra_special_tokens");
  if (extras.additional) kw["additional_special_tokens"] = *extras.additional;
  return kw;
}

void apply_class(json& doc, const json& config, const std::string& file, TokenizerClassInfo* out) {
  TokenizerClassInfo& info = *out;
  if (auto parent = inherited_init_classes().find(info.name); parent != inherited_init_classes().end()) {
    parent->second(&info);  // the parent's roles and post-processor rule; the file's pipeline stays
    return;
  }
  info.rebuilt = true;
  auto it = builders().find(info.name);
  ALPACA_CHECK(it != builders().end(),
               "tokenizer_class " << json_string_or(config, "tokenizer_class", info.name) << " of " << file
                                  << ": transformers 5 builds this class's pipeline (" << info.name
                                  << ") from its Python __init__ rather than from tokenizer.json, and the class "
                                  << unsupported_reason(info.name)
                                  << " (see docs/tokenizers.md for the classes that are); set \"tokenizer_class\": "
                                     "\"PreTrainedTokenizerFast\" in tokenizer_config.json if the file's own "
                                     "pipeline is the one you want");
  it->second(doc, config, file, &info);
}

}  // namespace

ConfigExtras config_extras(const json& config, const json& special_map, const std::string& dir) {
  static const char* kAdd = "additional_special_tokens";
  static const char* kExtra = "extra_special_tokens";
  json kw = json::object();  // the two kwargs as from_pretrained leaves them
  for (const char* key : {kAdd, kExtra})
    if (config.is_object() && config.contains(key)) kw[key] = config[key];
  if (kw.contains(kAdd) && !truthy(kw.value(kExtra, json()))) kw[kExtra] = kw[kAdd], kw.erase(kAdd);
  if (kw.contains(kExtra) && kw[kExtra].is_object()) kw.erase(kExtra);  // a role map: model-specific tokens
  if (config.is_object() && !config.contains("added_tokens_decoder") && special_map.is_object()) {
    if (special_map.contains(kExtra) && special_map[kExtra].is_array()) {
      json merged = kw.value(kExtra, json()).is_array() ? kw[kExtra] : json::array();
      for (const json& t : special_map[kExtra])
        if (std::find(merged.begin(), merged.end(), t) == merged.end()) merged.push_back(t);
      kw[kExtra] = merged;
    } else if (special_map.contains(kExtra)) {
      kw.erase(kExtra);  // a role map (or None) replaces the list
    }
    if (special_map.contains(kAdd)) kw[kAdd] = special_map[kAdd];
  }
  ConfigExtras out;
  if (kw.contains(kExtra)) {
    out.extra_null = kw[kExtra].is_null();
    out.extra = out.extra_null ? std::vector<std::string>() : token_list(kw[kExtra], kExtra, dir);
  }
  if (kw.contains(kAdd) && !kw[kAdd].is_null()) out.additional = token_list(kw[kAdd], kAdd, dir);
  return out;
}

TokenizerClassInfo apply_tokenizer_class(json& doc, const json& config, const json& model_config,
                                         const ConfigExtras& extras, const std::string& file) {
  TokenizerClassInfo info;
  info.name = resolve_class(doc, config, model_config);
  if (info.name != "TokenizersBackend") apply_class(doc, class_kwargs(config, extras), file, &info);
  // The config's model-specific tokens follow the class's own "*_token" kwargs; a key the class
  // passes itself keeps the class's place (a dict merge), and its builder already read the value.
  static const std::map<std::string, std::set<std::string>> kClassKeys = {
      {"CodeLlamaTokenizer", {"prefix_token", "middle_token", "suffix_token", "eot_token", "fill_token"}},
      {"LukeTokenizer", {"entity_1_token", "entity_2_token", "entity_unk_token", "entity_pad_token", "entity_mask_token",
                         "entity_mask2_token"}},
      {"MLukeTokenizer", {"entity_1_token", "entity_2_token", "entity_unk_token", "entity_pad_token", "entity_mask_token",
                          "entity_mask2_token"}},
      {"SplinterTokenizer", {"question_token"}},
      {"EsmcTokenizer", {"chain_break_token"}}};
  const auto own = kClassKeys.find(info.name);
  for (const auto& [key, token] : extras.model_specific)
    if (own == kClassKeys.end() || !own->second.count(key)) info.named_specials.push_back(token);
  info.extra_specials = resolve_extras(info, extras);
  return info;
}

namespace {

// TemplateProcessing "<prefix> $A <suffix>" (pair: "<prefix> $A [<suffix>] <prefix> $B <suffix>"
// for the type-1 half as update_post_processor writes it, or RobertaProcessing's "... $A <suffix>
// <suffix> $B <suffix>" with `roberta_pair`). Tokens are (content, id).
using Tok = std::pair<std::string, int64_t>;
json make_template(const std::vector<Tok>& prefix, const std::vector<Tok>& suffix, bool roberta_pair) {
  json single = json::array(), pair = json::array(), specials = json::object();
  auto special = [](const Tok& t, int type_id) { return json{{"SpecialToken", {{"id", t.first}, {"type_id", type_id}}}}; };
  auto seq = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  for (const Tok& t : prefix) single.push_back(special(t, 0));
  single.push_back(seq("A", 0));
  for (const Tok& t : suffix) single.push_back(special(t, 0));
  pair = single;
  if (roberta_pair) {
    for (const Tok& t : suffix) pair.push_back(special(t, 1));
  } else {
    for (const Tok& t : prefix) pair.push_back(special(t, 1));
  }
  pair.push_back(seq("B", 1));
  for (const Tok& t : suffix) pair.push_back(special(t, 1));
  for (const auto* list : {&prefix, &suffix})
    for (const Tok& t : *list) specials[t.first] = {{"id", t.first}, {"ids", {t.second}}, {"tokens", {t.first}}};
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

}  // namespace

json template_post_processor(const std::string& bos, int64_t bos_id, const std::string& eos, int64_t eos_id) {
  std::vector<Tok> prefix, suffix;
  if (!bos.empty()) prefix.emplace_back(bos, bos_id);
  if (!eos.empty()) suffix.emplace_back(eos, eos_id);
  return make_template(prefix, suffix, false);
}

json class_post_processor(const TokenizerClassInfo& info, bool file_has_one, const ClassRoles& roles,
                          const std::function<std::optional<int64_t>(const std::string&)>& lookup) {
  if (info.post == PostProcessorRule::kFile && file_has_one) return nullptr;
  if (info.post != PostProcessorRule::kTemplate) {  // update_post_processor with the class's flags
    const std::string bos = info.add_bos ? roles.bos : "", eos = info.add_eos ? roles.eos : "";
    const auto bos_id = bos.empty() ? std::nullopt : lookup(bos), eos_id = eos.empty() ? std::nullopt : lookup(eos);
    return template_post_processor(bos_id ? bos : "", bos_id.value_or(0), eos_id ? eos : "", eos_id.value_or(0));
  }
  // kTemplate: a role, or a token by content (convert_tokens_to_ids: the unk's id when absent).
  auto resolve = [&](const std::vector<std::string>& names) {
    std::vector<Tok> out;
    for (const std::string& item : names) {
      const size_t hash = item.find('#');  // "@role#id": the role's token with a fixed id (Herbert)
      const std::string n = item.substr(0, hash);
      const std::string token = n == "@cls" ? roles.cls : n == "@sep" ? roles.sep : n == "@bos" ? roles.bos
                                : n == "@eos" ? roles.eos : n;
      std::optional<int64_t> id = token.empty() ? std::nullopt : lookup(token);
      if (hash != std::string::npos) id = std::stoll(item.substr(hash + 1));
      std::string content = token;
      if (!id && !roles.unk.empty() && (id = lookup(roles.unk))) content = roles.unk;
      ALPACA_CHECK(id, "the " << info.name << " post-processor needs the token \"" << token
                              << "\", which is neither in the vocabulary nor replaceable by an unk token");
      out.emplace_back(content, *id);
    }
    return out;
  };
  return make_template(resolve(info.prefix), resolve(info.suffix), info.pair_doubles_suffix);
}

std::vector<int64_t> class_decode_ids(const TokenizerClassInfo& info, const std::vector<int64_t>& ids,
                                      std::optional<int64_t> pad_id) {
  if (!info.ctc_decode) return ids;
  std::vector<int64_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if ((i == 0 || ids[i] != ids[i - 1]) && ids[i] != pad_id) out.push_back(ids[i]);
  return out;
}

}  // namespace alpaca::tokenizer::detail
