"""Reference for issue 26's class rule beyond LLaMA/GPT-2/Qwen2: every BPE tokenizer_class that
transformers 5's AutoTokenizer rebuilds from its Python class (src/tokenizer/tokenizer_class.cpp
reimplements), run on real tokenizer.json files, with and without the kwargs that change the
pipeline, against AutoTokenizer from the pinned transformers.

Base files (the class takes only their vocab, merges and post-processor):
  llama2    ../shared/data/llama2-tokenizer/tokenizer.model saved by transformers 5's
            LlamaTokenizer as tokenizer.json (SentencePiece-style: "▁", byte fallback).
  smollm2   SmolLM2-135M-Instruct's tokenizer.json (byte-level BPE; models/ made by
            scripts/make_smollm2.py).
Each case is a directory --out/cases/<case>/ holding the base tokenizer.json and a
tokenizer_config.json naming the class (and kwargs). For every case and every text (edge cases +
the first --records Alpaca records as train.py builds them: prompt + output + the class's EOS)
--out/cases/<case>.json holds AutoTokenizer's ids with and without add_special_tokens, the
decodes of the former with and without skip_special_tokens, the roles, len() and the pipeline it
built. --out/reference.json lists the texts and the cases; --out/classes.json every class
transformers 5 rebuilds with its model type (Unigram, WordPiece, BPE).
EXTRAS_CASES add tokenizer_config.json's additional_special_tokens / extra_special_tokens (absent from
the vocabulary, present in it, a role token, a repeat; special_tokens_map.json's too) and src_lang /
tgt_lang, on EXTRAS_EDGE + the edge texts + the first EXTRAS_RECORDS records.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

L2, SM = "llama2", "smollm2"
# Unigram and WordPiece bases (make_model_bases): SentencePiece-trained Unigram files with the real
# nmt_nfkc Precompiled charsmap, in T5's and XLM-R's special-token layouts (+ byte pieces), and a
# WordPiece file trained by tokenizers' WordPieceTrainer, all on the Alpaca records.
UT5, UXLMR, WP = "unigram_t5", "unigram_xlmr", "wordpiece"
# MBart50's own tokenizer.json (its rebuilt vocabulary, with the language codes), saved by transformers.
M50 = "mbart50_saved"
# LLaMA-2's and SmolLM2's files cut to their first SMALL_BPE ids (and the merges among them): the
# EXTRAS_CASES' BPE base, which transformers loads in a tenth of the time.
L2S, SMS, SMALL_BPE = "llama2_small", "smollm2_small", 4000
# (case, base, tokenizer_config.json)
CASES = [
    ("llama", L2, {"tokenizer_class": "LlamaTokenizer"}),
    ("code_llama", L2, {"tokenizer_class": "CodeLlamaTokenizer"}),
    ("code_llama_no_prefix", L2, {"tokenizer_class": "CodeLlamaTokenizerFast", "add_prefix_space": False}),
    ("code_llama_eos", L2, {"tokenizer_class": "CodeLlamaTokenizer", "add_bos_token": False, "add_eos_token": True}),
    ("gemma", L2, {"tokenizer_class": "GemmaTokenizer"}),
    ("gemma_bos", L2, {"tokenizer_class": "GemmaTokenizerFast", "add_bos_token": True, "add_eos_token": True}),
    ("siglip2", L2, {"tokenizer_class": "Siglip2Tokenizer"}),
    ("reformer", L2, {"tokenizer_class": "ReformerTokenizer"}),
    ("tipsv2", L2, {"tokenizer_class": "Tipsv2Tokenizer"}),
    ("tipsv2_cased", L2, {"tokenizer_class": "Tipsv2Tokenizer", "do_lower_case": False}),
    ("gpt2", SM, {"tokenizer_class": "GPT2Tokenizer"}),
    ("codegen", SM, {"tokenizer_class": "CodeGenTokenizer"}),
    ("codegen_prefix", SM, {"tokenizer_class": "CodeGenTokenizerFast", "add_prefix_space": True}),
    ("gpt_neox", SM, {"tokenizer_class": "GPTNeoXTokenizer"}),
    ("gpt_neox_eos", SM, {"tokenizer_class": "GPTNeoXTokenizerFast", "eos_token": "<|im_end|>", "add_eos_token": True}),
    ("cohere", SM, {"tokenizer_class": "CohereTokenizer"}),
    ("cohere_prefix", SM, {"tokenizer_class": "CohereTokenizerFast", "add_prefix_space": True}),
    ("qwen2", SM, {"tokenizer_class": "Qwen2Tokenizer"}),
    ("qwen3_5", SM, {"tokenizer_class": "Qwen3_5Tokenizer"}),
    ("roberta", SM, {"tokenizer_class": "RobertaTokenizer"}),
    ("roberta_prefix", SM, {"tokenizer_class": "RobertaTokenizerFast", "add_prefix_space": True}),
    ("roberta_flags", SM, {"tokenizer_class": "RobertaTokenizer", "add_bos_token": False, "add_eos_token": False}),
    ("bart", SM, {"tokenizer_class": "BartTokenizer"}),
    ("led", SM, {"tokenizer_class": "LEDTokenizerFast"}),
    ("mvp", SM, {"tokenizer_class": "MvpTokenizer"}),
    ("blenderbot", SM, {"tokenizer_class": "BlenderbotTokenizer"}),
    ("blenderbot_no_prefix", SM, {"tokenizer_class": "BlenderbotTokenizerFast", "add_prefix_space": False}),
    ("luke", SM, {"tokenizer_class": "LukeTokenizer"}),
    ("deberta", SM, {"tokenizer_class": "DebertaTokenizer"}),
    ("whisper", SM, {"tokenizer_class": "WhisperTokenizer"}),
    ("whisper_timestamps", SM, {"tokenizer_class": "WhisperTokenizerFast", "predict_timestamps": True}),
    ("clip", SM, {"tokenizer_class": "CLIPTokenizer"}),
    ("nougat", SM, {"tokenizer_class": "NougatTokenizer"}),
    # Their "<unk>" is not in SmolLM2's vocabulary (AutoTokenizer then fails on any unknown word).
    ("openai_gpt", SM, {"tokenizer_class": "OpenAIGPTTokenizer", "unk_token": "<|endoftext|>"}),
    ("herbert", SM, {"tokenizer_class": "HerbertTokenizer", "unk_token": "<|endoftext|>"}),
    # Unigram / WordPiece files as is (their own pipeline: Precompiled, Metaspace, byte fallback,
    # BertNormalizer, the WordPiece decoder) and under the classes that rebuild them.
    ("unigram_as_is", UT5, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"}),
    ("unigram_bytes_as_is", UXLMR, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}),
    ("t5", UT5, {"tokenizer_class": "T5Tokenizer"}),
    ("t5_no_extra", UT5, {"tokenizer_class": "T5TokenizerFast", "extra_ids": 0}),
    ("xlm_roberta", UXLMR, {"tokenizer_class": "XLMRobertaTokenizer"}),
    ("xlm_roberta_no_prefix", UXLMR, {"tokenizer_class": "XLMRobertaTokenizerFast", "add_prefix_space": False}),
    ("albert", UXLMR, {"tokenizer_class": "AlbertTokenizer"}),
    ("albert_cased", UXLMR, {"tokenizer_class": "AlbertTokenizerFast", "do_lower_case": False, "keep_accents": True,
                             "add_prefix_space": False}),
    ("deberta_v2", UT5, {"tokenizer_class": "DebertaV2Tokenizer"}),
    ("deberta_v2_lower", UXLMR, {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": True,
                                 "add_prefix_space": False, "unk_token": "<unk>"}),
    ("wordpiece_as_is", WP, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "[SEP]", "unk_token": "[UNK]"}),
    ("bert", WP, {"tokenizer_class": "BertTokenizer"}),
    ("bert_cased_cleanup", WP, {"tokenizer_class": "BertTokenizerFast", "do_lower_case": False,
                                "clean_up_tokenization_spaces": True}),
    ("bert_flags", WP, {"tokenizer_class": "BertTokenizer", "tokenize_chinese_chars": False, "strip_accents": False,
                        "clean_text": False}),  # Bert ignores clean_text (Funnel does not)
    ("mobilebert", WP, {"tokenizer_class": "MobileBertTokenizer"}),
    ("distilbert", WP, {"tokenizer_class": "DistilBertTokenizer", "do_lower_case": False}),
    # The other Unigram classes (their normalizers, unk ids, roles, extra tokens, post-processors).
    ("camembert", UXLMR, {"tokenizer_class": "CamembertTokenizer"}),
    ("camembert_no_prefix", UXLMR, {"tokenizer_class": "CamembertTokenizerFast", "add_prefix_space": False,
                                    "additional_special_tokens": []}),
    ("mbart", UXLMR, {"tokenizer_class": "MBartTokenizer"}),
    ("mbart_ro", UT5, {"tokenizer_class": "MBartTokenizerFast", "src_lang": "ro_RO"}),
    ("pegasus", UT5, {"tokenizer_class": "PegasusTokenizer"}),
    ("pegasus_offset", UXLMR, {"tokenizer_class": "PegasusTokenizerFast", "offset": 5, "mask_token_sent": None}),
    ("big_bird", UXLMR, {"tokenizer_class": "BigBirdTokenizer"}),
    ("big_bird_no_prefix", UT5, {"tokenizer_class": "BigBirdTokenizerFast", "add_prefix_space": False}),
    ("xlnet", UXLMR, {"tokenizer_class": "XLNetTokenizer"}),
    ("xlnet_lower", UT5, {"tokenizer_class": "XLNetTokenizerFast", "do_lower_case": True, "keep_accents": True,
                          "unk_id": 2}),
    ("barthez", UXLMR, {"tokenizer_class": "BarthezTokenizer"}),
    ("barthez_no_prefix", UXLMR, {"tokenizer_class": "BarthezTokenizerFast", "add_prefix_space": False}),
    ("rembert", UXLMR, {"tokenizer_class": "RemBertTokenizer"}),
    ("rembert_lower", UT5, {"tokenizer_class": "RemBertTokenizerFast", "do_lower_case": True, "keep_accents": False}),
    ("lasr", UT5, {"tokenizer_class": "LasrTokenizer"}),
    ("videoprism", UT5, {"tokenizer_class": "VideoPrismTokenizer", "extra_ids": 3}),
    ("mluke", UXLMR, {"tokenizer_class": "MLukeTokenizer"}),
    ("xglm", UXLMR, {"tokenizer_class": "XGLMTokenizer"}),
    ("xglm_no_prefix", UT5, {"tokenizer_class": "XGLMTokenizerFast", "add_prefix_space": False}),
    # The other WordPiece classes.
    ("dpr_question", WP, {"tokenizer_class": "DPRQuestionEncoderTokenizer", "do_lower_case": False}),
    ("dpr_context", WP, {"tokenizer_class": "DPRContextEncoderTokenizerFast"}),
    ("dpr_reader", WP, {"tokenizer_class": "DPRReaderTokenizer"}),
    ("mpnet", WP, {"tokenizer_class": "MPNetTokenizer"}),
    ("mpnet_cased", WP, {"tokenizer_class": "MPNetTokenizerFast", "do_lower_case": False, "strip_accents": True}),
    # Funnel's "<unk>" is not in the trained vocabulary (AutoTokenizer then fails on any unknown word).
    ("funnel", WP, {"tokenizer_class": "FunnelTokenizer", "unk_token": "[UNK]"}),
    ("funnel_flags", WP, {"tokenizer_class": "FunnelTokenizerFast", "clean_text": False, "unk_token": "[UNK]",
                          "tokenize_chinese_chars": False, "do_lower_case": False}),
    ("splinter", WP, {"tokenizer_class": "SplinterTokenizer"}),
    ("nllb", L2, {"tokenizer_class": "NllbTokenizer"}),
    ("nllb_legacy", L2, {"tokenizer_class": "NllbTokenizerFast", "legacy_behaviour": True, "src_lang": "fra_Latn"}),
    # No __init__ of their own, their parent's: the file's pipeline with the parent's roles (also on
    # BPE files, which their parents' own pipelines would not take).
    ("fnet", UT5, {"tokenizer_class": "FNetTokenizer"}),
    ("convbert", WP, {"tokenizer_class": "ConvBertTokenizer", "do_lower_case": False}),
    ("fnet_bpe", SM, {"tokenizer_class": "FNetTokenizer"}),
    ("convbert_bpe", L2, {"tokenizer_class": "ConvBertTokenizerFast"}),
    # MBart50 rebuilds a vocabulary without its language codes in fairseq's layout (T5's and XLM-R's
    # special-token layouts: the latter repeats <unk> and <mask>) and takes one with them as is.
    ("mbart50", UT5, {"tokenizer_class": "MBart50Tokenizer"}),
    ("mbart50_ro", UXLMR, {"tokenizer_class": "MBart50TokenizerFast", "src_lang": "ro_RO"}),
    ("mbart50_codes", M50, {"tokenizer_class": "MBart50Tokenizer", "src_lang": "de_DE"}),
    # SeamlessM4T's "__eng__" is not in LLaMA-2's vocabulary (the unk's id), "__deu__" is added.
    ("seamless_m4t", L2, {"tokenizer_class": "SeamlessM4TTokenizer"}),
    ("seamless_m4t_langs", L2, {"tokenizer_class": "SeamlessM4TTokenizerFast", "src_lang": "deu", "pad_token": None,
                                "additional_special_tokens": ["__eng__", "__deu__"]}),
    # Esmc's own vocabulary; the file adds only its added tokens.
    ("esmc", L2, {"tokenizer_class": "EsmcTokenizer"}),
    ("esmc_smollm2", SM, {"tokenizer_class": "EsmcTokenizer"}),
    # MarkupLM needs tags_dict; without xpaths its __call__ encodes str.split()'s words.
    ("markuplm", SM, {"tokenizer_class": "MarkupLMTokenizer", "tags_dict": {"html": 0, "body": 1}}),
    ("markuplm_prefix", SM, {"tokenizer_class": "MarkupLMTokenizerFast", "tags_dict": {}, "add_prefix_space": True}),
]


def _extras(present, role):
    """additional_special_tokens of a case: two tokens absent from the vocabulary, one present in it,
    one role token, and a repeat."""
    return ["<newA>", present, role, "<newB>", "<newA>"]


# tokenizer_config.json's additional_special_tokens / extra_special_tokens (and special_tokens_map.json's,
# under "__special_tokens_map__") against each class's own extra tokens and roles, and src_lang /
# tgt_lang: run on EXTRAS_EDGE + the edge texts + the first EXTRAS_RECORDS records only (cheap).
EXTRAS_CASES = [
    ("llama_extras", L2S, {"tokenizer_class": "LlamaTokenizer", "additional_special_tokens": _extras("the", "</s>")}),
    ("llama_extra_key", L2S, {"tokenizer_class": "LlamaTokenizerFast", "extra_special_tokens": ["<newB>", "<newA>", "<s>"]}),
    ("llama_special_map", L2S, {"tokenizer_class": "LlamaTokenizer", "additional_special_tokens": ["<newA>"],
                               "pad_token": "<unk>",
                               "__special_tokens_map__": {"additional_special_tokens": ["<newC>"], "pad_token": "<newP>",
                                                          "extra_special_tokens": ["<newB>", "<newA>"]}}),
    # With added_tokens_decoder, transformers 5 does not read special_tokens_map.json (its roles either).
    ("llama_special_map_ignored", L2S, {"tokenizer_class": "LlamaTokenizer", "eos_token": "</s>", "pad_token": "<unk>",
                                       "added_tokens_decoder": {"2": {"content": "</s>", "special": True}},
                                       "__special_tokens_map__": {"eos_token": "<s>", "pad_token": "<newP>",
                                                                  "additional_special_tokens": ["<newC>"]}}),
    ("gpt2_extras", SMS, {"tokenizer_class": "GPT2Tokenizer", "additional_special_tokens": _extras("the", "<|endoftext|>")}),
    ("qwen2_extras", SMS, {"tokenizer_class": "Qwen2Tokenizer", "additional_special_tokens": _extras("the", "<|endoftext|>")}),
    ("fast_extras", SMS, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<pad>",
                         "additional_special_tokens": _extras("the", "<pad>")}),
    ("bert_extras", WP, {"tokenizer_class": "BertTokenizer", "additional_special_tokens": _extras("hello", "[MASK]")}),
    ("t5_extras", UT5, {"tokenizer_class": "T5Tokenizer", "additional_special_tokens": _extras("Hello", "<pad>")}),
    ("t5_special_map", UT5, {"tokenizer_class": "T5Tokenizer", "extra_ids": 3,
                             "__special_tokens_map__": {"additional_special_tokens": ["<newA>", "</s>"]}}),
    ("nllb_extras", L2S, {"tokenizer_class": "NllbTokenizer", "additional_special_tokens": _extras("the", "<mask>")}),
    ("nllb_both_keys", L2S, {"tokenizer_class": "NllbTokenizerFast", "src_lang": "fra_Latn",
                            "additional_special_tokens": ["<newA>", "fra_Latn"], "extra_special_tokens": ["<newB>"]}),
    ("mbart_extras", UXLMR, {"tokenizer_class": "MBartTokenizer", "additional_special_tokens": _extras("Hello", "<mask>")}),
    ("mbart50_extras", UT5, {"tokenizer_class": "MBart50Tokenizer", "additional_special_tokens": _extras("Hello", "<mask>")}),
    ("mbart50_codes_extras", M50, {"tokenizer_class": "MBart50Tokenizer", "src_lang": "de_DE",
                                   "additional_special_tokens": _extras("Hello", "<mask>")}),
    ("seamless_m4t_extras", L2S, {"tokenizer_class": "SeamlessM4TTokenizer", "src_lang": "deu",
                                 "additional_special_tokens": _extras("the", "<pad>") + ["__deu__"]}),
    ("code_llama_extras", L2S, {"tokenizer_class": "CodeLlamaTokenizer", "additional_special_tokens": _extras("the", "</s>")}),
    ("xglm_extras", UXLMR, {"tokenizer_class": "XGLMTokenizer", "additional_special_tokens": _extras("Hello", "<madeupword1>")}),
    ("pegasus_extras", UT5, {"tokenizer_class": "PegasusTokenizer", "offset": 4, "additional_special_tokens": _extras("Hello", "<mask_1>")}),
    ("camembert_extras", UXLMR, {"tokenizer_class": "CamembertTokenizer", "extra_special_tokens": _extras("Hello", "<s>NOTUSED")}),
    ("luke_extras", SMS, {"tokenizer_class": "LukeTokenizer", "additional_special_tokens": _extras("the", "<ent>")}),
    ("esmc_extras", L2S, {"tokenizer_class": "EsmcTokenizer", "additional_special_tokens": _extras("A", "|")}),
    # The config's other "*_token" keys become special tokens after the roles, in the file's order
    # (one the class takes itself keeps the class's place).
    ("llama_token_keys", L2S, {"tokenizer_class": "LlamaTokenizer", "fill_token": "<FILL>", "abc_token": "<ABC>",
                               "eot_token": "</s>", "additional_special_tokens": ["<newA>"]}),
    ("code_llama_token_keys", L2S, {"tokenizer_class": "CodeLlamaTokenizer", "zzz_token": "<Z>", "prefix_token": "<P>",
                                    "additional_special_tokens": ["<newA>"]}),
    # src_lang with tgt_lang (which only a text_target call would use).
    ("nllb_langs", L2S, {"tokenizer_class": "NllbTokenizer", "src_lang": "deu_Latn", "tgt_lang": "fra_Latn"}),
    ("nllb_langs_legacy", L2S, {"tokenizer_class": "NllbTokenizer", "src_lang": "deu_Latn", "tgt_lang": "fra_Latn",
                               "legacy_behaviour": True}),
    ("mbart_langs", UXLMR, {"tokenizer_class": "MBartTokenizer", "src_lang": "de_DE", "tgt_lang": "ro_RO"}),
    ("mbart50_langs", UT5, {"tokenizer_class": "MBart50Tokenizer", "src_lang": "de_DE", "tgt_lang": "ro_RO"}),
    ("seamless_m4t_tgt", L2S, {"tokenizer_class": "SeamlessM4TTokenizer", "src_lang": "fra", "tgt_lang": "deu",
                              "additional_special_tokens": ["__deu__", "__fra__"]}),
]
EXTRAS_EDGE = ["<newA> en_XX hi", "a<newA>b<newB>c <newC>", "Hello <newB> world Hello", "say hello, Hello! the theme: there, the end",
               "<extra_id_0> <mask_1> <unk_2> <madeupword0> <eop> <s>NOTUSED", "\u2581<PRE> <FILL_ME> x <ent> | A",
               "eng_Latn fra_Latn deu_Latn __eng__ __fra__ __deu__ de_DE ro_RO hi", "x<FILL>y <ABC> <P> <Z> z"]
EXTRAS_RECORDS = 20

# Classes transformers 5 rebuilds but cannot tokenize a plain text with (tokenizer_class.cpp refuses
# them; the test checks that its message carries the exception recorded here), with a base file.
CANNOT = [("LayoutXLMTokenizer", UT5), ("UdopTokenizer", UT5), ("LayoutLMv2Tokenizer", WP),
          ("LayoutLMv3Tokenizer", SM), ("RoFormerTokenizer", WP), ("MarkupLMTokenizer", SM)]
# Python's str.split() separators as the Split pattern tokenizer_class.cpp gives MarkupLM.
PY_WHITESPACE = (r"[\t-\r\x{1c}-\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}"
                 r"\x{205f}\x{3000}]+")

EXTRA_EDGE = [
    "Sure, here it is.</s>", "</s>", " </s>", "a</s>b", "<s></s>", "\u2581</s>", "Hello <s>world",
    "x <pad> y <mask> z", "<|endoftext|>", "a<|endoftext|>b", "<|im_end|> end", "ABC Def GHI", "123 4567 89",
    "<bos>Hi<eos>", "[CLS] a [SEP]", "  two  spaces  ", "MiXeD CaSe ÀÉÎ", "it's we're they'll",
    "a\x1cb\x85c\u3000d\u2028e f",
]
ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def class_models():
    """Every tokenizer_class transformers 5 rebuilds from its class and that class's model."""
    sys.path.insert(0, HERE)
    from llama2_tokenizer_variants_reference import class_lists
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    rebuilt, _ = class_lists()
    out = {}
    for name, cls in rebuilt.items():
        c = tokenizer_class_from_name(name) or tokenizer_class_from_name(name + "Fast")
        model = getattr(getattr(c, "model", None), "__name__", None)
        # No `model` attribute: SentencePiece Unigram (Barthez, Camembert, MLuke) or WordPiece (RoFormer).
        out[name] = {"class": cls, "model": model or ("WordPiece" if name == "RoFormerTokenizer" else "Unigram")}
    return out


def inherited_init():
    """Classes transformers 5 resolves whose __init__ is inherited from a parent defining one (the
    file's pipeline stays, the parent sets roles): {name: the parent class}."""
    sys.path.insert(0, HERE)
    from llama2_tokenizer_variants_reference import class_lists
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    _, as_is = class_lists()
    out = {}
    for name in as_is:
        c = tokenizer_class_from_name(name) or tokenizer_class_from_name(name + "Fast")
        if isinstance(c, type) and c is not TokenizersBackend and c.__init__ is not TokenizersBackend.__init__:
            out[name] = next(k.__name__ for k in c.__mro__ if "__init__" in k.__dict__)
    return out


def make_bases(out):
    from transformers import LlamaTokenizer

    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    src = os.path.join(out, "llama2_src")
    os.makedirs(src)
    shutil.copy(os.path.join(shared, "data/llama2-tokenizer/tokenizer.model"), src)
    LlamaTokenizer.from_pretrained(src).save_pretrained(os.path.join(out, "llama2_saved"))
    smollm2 = os.path.join(REPO, "models/smollm2-135m-instruct")
    if not os.path.exists(os.path.join(smollm2, "tokenizer.json")):
        subprocess.check_call([sys.executable, os.path.join(REPO, "scripts/make_smollm2.py")])
    bases = {L2: os.path.join(out, "llama2_saved/tokenizer.json"), SM: os.path.join(smollm2, "tokenizer.json")}
    bases.update(make_model_bases(out))
    bases[M50] = mbart50_saved(out, bases[UT5])
    bases[L2S] = small_bpe(bases[L2], os.path.join(out, L2S + ".json"))
    bases[SMS] = small_bpe(bases[SM], os.path.join(out, SMS + ".json"))
    return bases


def small_bpe(src, dst):
    """The BPE file `src` cut to its first SMALL_BPE ids and the merges whose parts and result remain."""
    with open(src) as f:
        doc = json.load(f)
    model = doc["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < SMALL_BPE}
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    model["merges"] = [m for m in pairs if m[0] in model["vocab"] and m[1] in model["vocab"] and m[0] + m[1] in model["vocab"]]
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] < SMALL_BPE]
    with open(dst, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
    return dst


def mbart50_saved(out, unigram):
    from transformers import AutoTokenizer

    src, dst = os.path.join(out, "mbart50_src"), os.path.join(out, M50)
    os.makedirs(src)
    shutil.copy(unigram, os.path.join(src, "tokenizer.json"))
    with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MBart50Tokenizer"}, f)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return os.path.join(dst, "tokenizer.json")


def alpaca_text(path, n=2000):
    with open(os.path.join(os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared")),
                           "data/alpaca/alpaca_5000.json")) as f:
        records = json.load(f)[:n]
    with open(path, "w") as f:
        for r in records:
            for k in ("instruction", "input", "output"):
                if r.get(k):
                    f.write(r[k].replace("\n", " ") + "\n")
    return path


def spm_unigram(out, text, name, specials, byte_fallback):
    """A SentencePiece Unigram model (nmt_nfkc) as a tokenizer.json: its pieces and scores, its
    real precompiled_charsmap, Metaspace both ways, and "$A </s>"."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    prefix = os.path.join(out, name)
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, vocab_size=3000, model_type="unigram", character_coverage=0.995,
        normalization_rule_name="nmt_nfkc", byte_fallback=byte_fallback, minloglevel=2, **specials)
    proto = pb.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    vocab = [(p.piece, p.score) for p in proto.pieces]
    unk = next(i for i, p in enumerate(proto.pieces) if p.type == 2)
    tok = Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=byte_fallback))
    tok.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    tok.add_special_tokens([p.piece for p in proto.pieces if p.type in (3, 4)])  # control, user-defined
    path = os.path.join(out, name + ".json")
    tok.save(path)
    return path


def make_model_bases(out):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    text = alpaca_text(os.path.join(out, "alpaca.txt"))
    t5 = spm_unigram(out, text, UT5, {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1}, False)
    xlmr = spm_unigram(out, text, UXLMR, {"bos_id": 0, "pad_id": 1, "eos_id": 2, "unk_id": 3,
                                          "user_defined_symbols": ["<mask>", "[CLS]", "[SEP]", "[MASK]"]}, True)
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece(prefix="##")
    wp.train([text], trainers.WordPieceTrainer(vocab_size=3000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", wp.token_to_id("[CLS]")), ("[SEP]", wp.token_to_id("[SEP]"))])
    wp_path = os.path.join(out, WP + ".json")
    wp.save(wp_path)
    return {UT5: t5, UXLMR: xlmr, WP: wp_path}


def markuplm_pre_tokenizer(tok, built, texts, ids):
    """Without xpaths MarkupLMTokenizer.__call__ splits a text with str.split() and encodes the words
    as pre-split input; tokenizer_class.cpp runs that as a Split on Python's whitespace before the
    class's ByteLevel. Checked here: the backend with that pre-tokenizer gives the class's ids."""
    from tokenizers import Tokenizer

    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": PY_WHITESPACE}, "behavior": "Removed", "invert": False},
        built["pre_tokenizer"]]}
    as_split = Tokenizer.from_str(json.dumps(dict(built, pre_tokenizer=pre)))
    got = [e.ids for e in as_split.encode_batch(texts)]
    assert got == ids, "MarkupLM: Split on str.split()'s whitespace + ByteLevel differs from the class's __call__"
    return pre


def cannot_tokenize(bases, out):
    """The exception transformers 5 raises when it loads each class of CANNOT and tokenizes a plain
    text (AutoTokenizer on the base file with only tokenizer_class set)."""
    from transformers import AutoTokenizer

    raised = {}
    for name, base in CANNOT:
        d = os.path.join(out, "cannot_" + name)
        os.makedirs(d)
        shutil.copy(bases[base], os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": name}, f)
        try:
            AutoTokenizer.from_pretrained(d)("Hello world")
            raise AssertionError(f"{name}: transformers tokenized a plain text; it belongs in CASES")
        except (ValueError, TypeError, ImportError) as e:
            raised[name] = f"{type(e).__name__}: {e}"
            print(f"{name}: transformers raises {raised[name]}")
    return raised


def case_reference(d, texts_for):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    built = json.loads(tok.backend_tokenizer.to_str())
    texts = texts_for(tok.eos_token or "")
    ids = tok(texts)["input_ids"]
    plain = tok(texts, add_special_tokens=False)["input_ids"]
    if type(tok).__name__ == "MarkupLMTokenizer":
        built["pre_tokenizer"] = markuplm_pre_tokenizer(tok, built, texts, ids)
    return texts, {
        "dir": d, "class": type(tok).__name__, "len": len(tok),
        "roles": {r: [getattr(tok, r + "_token"), getattr(tok, r + "_token_id")] for r in ROLES},
        "pipeline": {"normalizer": built["normalizer"], "pre_tokenizer": built["pre_tokenizer"],
                     "decoder": built["decoder"],
                     "model": {k: v for k, v in built["model"].items() if k not in ("vocab", "merges")}},
        "ids": ids, "ids_plain": plain,
        "decoded": [tok.decode(x, skip_special_tokens=False) for x in ids],
        "decoded_skip": [tok.decode(x, skip_special_tokens=True) for x in ids],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    ap.add_argument("--data_path", default=os.path.join(shared, "data/alpaca/alpaca_5000.json"))
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--cases", default="", help="comma-separated case names to write (all when empty)")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)  # the cases' "dir" is read from elsewhere
    if not os.path.exists(args.data_path):
        print(f"shared data not found under {shared}; writing no fixture")
        return
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    sys.path.insert(0, HERE)
    from hf_tokenizer_reference import EDGE
    from stanford_alpaca_rules import alpaca_sources

    with open(args.data_path) as f:
        records = json.load(f)[: args.records]
    sources = alpaca_sources(records)
    edge = EDGE + EXTRA_EDGE

    def texts_for(eos):  # train.py's example: prompt + output + the EOS string
        return edge + [s + r["output"] + eos for s, r in zip(sources, records)]

    bases = make_bases(os.path.join(args.out, "bases"))
    reference = {"edge": len(edge), "records": len(records), "cases": {}}
    only = set(filter(None, args.cases.split(",")))
    def extras_texts_for(eos):
        return EXTRAS_EDGE + texts_for(eos)[: len(edge) + EXTRAS_RECORDS]

    for name, base, config, case_texts in [c + (texts_for,) for c in CASES] + [c + (extras_texts_for,) for c in EXTRAS_CASES]:
        if only and name not in only:
            continue
        config = dict(config)
        d = os.path.join(args.out, "cases", name)
        os.makedirs(d)
        shutil.copy(bases[base], os.path.join(d, "tokenizer.json"))
        if "__special_tokens_map__" in config:
            with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
                json.dump(config.pop("__special_tokens_map__"), f)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        for key in ("additional_special_tokens", "extra_special_tokens"):  # _extras' second token is in the vocabulary
            if len(config.get(key) or []) == 5 and config[key][0] == "<newA>" and "Esmc" not in config["tokenizer_class"]:
                with open(bases[base]) as f:
                    vocab = json.load(f)["model"]["vocab"]  # BPE/WordPiece: {token: id}; Unigram: [[piece, score]]
                assert config[key][1] in (vocab if isinstance(vocab, dict) else {p[0] for p in vocab}), (name, config[key])
        texts, ref = case_reference(d, case_texts)
        ref.update({"base": base, "config": config, "texts": texts})
        with open(os.path.join(args.out, "cases", name + ".json"), "w") as f:
            json.dump(ref, f, ensure_ascii=False)
        reference["cases"][name] = {"class": ref["class"], "base": base}
        print(f"{name}: {ref['class']} on {base}, len {ref['len']}, eos {ref['roles']['eos']}, "
              f"first record ends {ref['ids'][len(edge)][-3:]}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    with open(os.path.join(args.out, "classes.json"), "w") as f:
        json.dump(class_models(), f, indent=1)
    with open(os.path.join(args.out, "inherited.json"), "w") as f:
        json.dump(inherited_init(), f, indent=1)
    with open(os.path.join(args.out, "cannot_tokenize.json"), "w") as f:
        json.dump(cannot_tokenize(bases, os.path.join(args.out, "bases")), f, indent=1)
    n_classes = len({c["class"] for c in reference["cases"].values()})
    print(f"{len(reference['cases'])} files x {len(edge)} edge texts + {len(records)} records (EXTRAS_CASES: "
          f"{len(EXTRAS_EDGE)} + {len(edge)} edge texts + {EXTRAS_RECORDS} records), {n_classes} classes")


if __name__ == "__main__":
    main()
