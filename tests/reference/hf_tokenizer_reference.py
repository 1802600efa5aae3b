"""Reference ids for the tokenizer.json path (issue 14): transformers 5's AutoTokenizer, after
stanford_alpaca train.py's special-token rule, on all records of the shared Alpaca sample
(train.py's preprocess: input_ids and labels) and on an edge-case list, for three tokenizers:

  llama2_json   LLaMA-2's tokenizer.json as transformers 5 writes it (LlamaTokenizer converted from
                ../shared/data/llama2-tokenizer/tokenizer.model and saved: no tokenizer.model)
  smollm2       SmolLM2-135M-Instruct's tokenizer (byte-level BPE; models/ made by make_smollm2.py)
  llama3_style  a LLaMA-3-style tokenizer built here with the `tokenizers` library and trained on
                the Alpaca text: LLaMA-3's Split pattern, ByteLevel without its regex,
                ignore_merges, TemplateProcessing that adds <|begin_of_text|>, reserved special
                tokens after the BPE vocabulary; bos <|begin_of_text|>, eos <|end_of_text|>, no
                pad, no unk (as the real one).
  components_a  the remaining components, trained here on the Alpaca text: BPE with unk, fuse_unk,
                continuing_subword_prefix "##" and end_of_word_suffix "</w>"; normalizers Strip,
                Lowercase, Replace, NFKC; pre-tokenizers Digits (individual), Metaspace (always,
                split); TemplateProcessing "<s> $A </s>" (so truncation keeps </s>); added tokens
                with lstrip/rstrip, single_word, and a normalized non-special one; decoders
                Replace, Metaspace, Strip.
  components_b  BPE with byte_fallback (<0xHH> in the vocab, no unk); normalizers NFD, a regex
                Replace, Prepend; pre-tokenizers Split (string, regex, each behaviour, invert) and
                Digits (runs); no post-processor; decoders Replace, ByteFallback, Fuse, Strip.

Writes --out/<name>/ (the tokenizer directory as loaded), --out/<name>.jsonl (one record per
line: input_ids, labels) and --out/reference.json (per tokenizer: the rule's added tokens, ids of
the roles, len(tokenizer), and for every edge case the ids and both decodes).
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, LlamaTokenizer, PreTrainedTokenizerFast

from stanford_alpaca_rules import IGNORE_INDEX, PROMPT_DICT, alpaca_sources, train_py_rule

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|reserved_special_token_2|>", "<|eot_id|>"]

# Edge cases (the C++ test encodes each with add_special_tokens=True and decodes the reference ids).
EDGE = [
    "", " ", "  ", "\n", "Hello world", " Hello", "Hello  world", "   leading three", "trailing  ",
    "a\tb\t\tc", "line1\nline2\n\nline3", "crlf\r\nline\r\n\r\n", "\r\n", "tabs\t\t\tand   spaces  \n  ",
    "\u00a0nbsp\u3000ideographic\u2003em", "日本語のテキストです。", "中文测试，标点符号！", "한국어 문장",
    "emoji 🦙🦙 👩‍👩‍👧 ✨🚀", "combining e\u0301 a\u0308 n\u0303 \u1e9b\u0323", "precomposed é ä ñ",
    "compat ﬁ ① ＡＢＣ Ǆ ℌ", "digits 1234567890 12 3.14159 1,000,000 0000 ٣٤٥", "mixed 123abc456 x1y2z3",
    "don't I'LL they're WE'VE it's", "UPPER lower MiXeD İstanbul ΣΑΣ", "a" * 300, "\u2581 already metaspace \u2581x",
    "control \x7f \x01 \x1f chars", "symbols @#$%^&*()_+-=[]{}|;:',.<>/?`~", "<s>Hello</s>", "special </s> in text",
    "x[PAD]y [PAD] z", " [PAD] ", "<|begin_of_text|>hi<|end_of_text|>", "<|im_start|>user\nhi<|im_end|>\n",
    "<unk> and <unk>", "<|endoftext|>", "<|reserved_special_token_0|> x",
    "a [X]  b[X]c", "[W] x[W] [W]y ([W])", "HELLO hello Hello-hello", "``quoted'' text", "  Strip Me  ",
    PROMPT_DICT["prompt_no_input"].format(instruction="") + "",
    PROMPT_DICT["prompt_input"].format(instruction="", input="") + "</s>",
]


def build_llama2_json(shared, out):
    src = os.path.join(out, "llama2_src")
    os.makedirs(src, exist_ok=True)
    shutil.copy(os.path.join(shared, "data/llama2-tokenizer/tokenizer.model"), src)
    d = os.path.join(out, "llama2_json")
    LlamaTokenizer.from_pretrained(src).save_pretrained(d)
    shutil.rmtree(src)
    assert not os.path.exists(os.path.join(d, "tokenizer.model")), os.listdir(d)
    return d


def build_smollm2(out):
    model = os.path.join(REPO, "models/smollm2-135m-instruct")
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        subprocess.check_call([sys.executable, os.path.join(REPO, "scripts/make_smollm2.py")])
    d = os.path.join(out, "smollm2")
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(model, f)):
            shutil.copy(os.path.join(model, f), d)
    return d


def build_llama3_style(texts, out):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=4000, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in LLAMA3_SPECIALS])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    d = os.path.join(out, "llama3_style")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    fast.save_pretrained(d)
    return d


def build_components_a(texts, out):
    from tokenizers import normalizers
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.Strip(left=True, right=True), normalizers.Lowercase(),
                                           normalizers.Replace("``", '"'), normalizers.NFKC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False, special_tokens=["<unk>", "<s>", "</s>"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([AddedToken("[X]", special=True, lstrip=True, rstrip=True, normalized=False),
                            AddedToken("[W]", special=True, single_word=True, normalized=False)])
    tok.add_tokens([AddedToken("hello", special=False, normalized=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    # Strip(stop=1) first, while no token can be empty (the library panics on an empty token there).
    tok.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.Strip(" ", 0, 1),
                                     decoders.Replace("##", ""),
                                     decoders.Metaspace(replacement="\u2581", prepend_scheme="always")])
    d = os.path.join(out, "components_a")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            additional_special_tokens=["[X]", "[W]"]).save_pretrained(d)
    return d


def build_components_b(texts, out):
    from tokenizers import normalizers
    norm = normalizers.Sequence([normalizers.NFD(), normalizers.Replace(Regex(r"\s+"), " "),
                                 normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\u2581", behavior="merged_with_next"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex(r"\p{P}+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[!?]"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="contiguous", invert=True),
    ])
    base = Tokenizer(models.BPE())
    base.normalizer, base.pre_tokenizer = norm, pre
    base.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2500, show_progress=False, special_tokens=["<s>", "</s>"]))
    state = json.loads(base.to_str())
    vocab = dict(state["model"]["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.normalizer, tok.pre_tokenizer = norm, pre
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False), AddedToken("</s>", special=True, normalized=False)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    d = os.path.join(out, "components_b")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(d)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    ap.add_argument("--data_path", default=os.path.join(shared, "data/alpaca/alpaca_5000.json"))
    ap.add_argument("--model_max_length", type=int, default=512)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not (os.path.exists(args.data_path) and os.path.exists(os.path.join(shared, "data/llama2-tokenizer"))):
        print(f"shared data not found under {shared}; writing no fixture")
        return
    with open(args.data_path) as f:
        records = json.load(f)
    corpus = [r["instruction"] + "\n" + r.get("input", "") + "\n" + r["output"] for r in records]

    dirs = {
        "llama2_json": build_llama2_json(shared, args.out),
        "smollm2": build_smollm2(args.out),
        "llama3_style": build_llama3_style(corpus, args.out),
        "components_a": build_components_a(corpus, args.out),
        "components_b": build_components_b(corpus, args.out),
    }
    reference = {"model_max_length": args.model_max_length, "edge_texts": EDGE, "tokenizers": {}}
    for name, d in dirs.items():
        tok = AutoTokenizer.from_pretrained(d, model_max_length=args.model_max_length, padding_side="right")
        special, num_new = train_py_rule(tok)
        sources = alpaca_sources(records)
        targets = [f"{r['output']}{tok.eos_token}" for r in records]

        def _tokenize_fn(strings):
            # train.py calls the tokenizer once per string (return_tensors="pt", padding="longest": no
            # padding for one string); one batch call gives the same ids from these fast tokenizers and
            # takes a fifth of the time (measured: identical ids over 2,000 records).
            ids = tok(strings, max_length=tok.model_max_length, truncation=True)["input_ids"]
            return [torch.tensor(i) for i in ids], [sum(1 for t in i if t != tok.pad_token_id) for i in ids]

        t0 = time.perf_counter()
        examples_ids, _ = _tokenize_fn([s + t for s, t in zip(sources, targets)])
        _, sources_lens = _tokenize_fn(sources)
        labels = copy.deepcopy(examples_ids)
        for label, n in zip(labels, sources_lens):
            label[:n] = IGNORE_INDEX
        seconds = time.perf_counter() - t0
        with open(os.path.join(args.out, name + ".jsonl"), "w") as f:
            for ids, lab in zip(examples_ids, labels):
                f.write(json.dumps({"input_ids": ids.tolist(), "labels": lab.tolist()}) + "\n")
        edge = []
        for text in EDGE:
            ids = tok(text)["input_ids"]
            edge.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                         "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        roundtrip = None
        if name in ("smollm2", "llama3_style"):  # byte-level: decode(encode(x)) == x for the library itself
            roundtrip = sum(tok.decode(tok(t, add_special_tokens=False)["input_ids"]) == t for t in corpus)
        reference["tokenizers"][name] = {
            "dir": d, "special_tokens_added": special, "num_new_tokens": num_new, "len": len(tok),
            "pad_id": tok.pad_token_id, "eos_id": tok.eos_token_id, "bos_id": tok.bos_token_id,
            "unk_id": tok.unk_token_id, "eos_token": tok.eos_token, "edge": edge,
            "library_roundtrip_ok": roundtrip, "train_py_seconds": seconds,
        }
        print(f"{name}: len {len(tok)}, added {special} ({num_new} new), {seconds:.1f} s, roundtrip {roundtrip}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
