"""Reference ids for tokenizer edge cases (special-token strings inside text, spaces around them,
"▁" in the text, empty strings), for transformers 4.x's slow LlamaTokenizer in both its legacy
and non-legacy modes, on the LLaMA-2 tokenizer.model with [PAD] added. Writes edge_cases.json:
{"legacy": {"texts": [...], "ids": [[...]]}, "non_legacy": {...}}.

transformers 5 dropped the slow LlamaTokenizer, so `Slow4xLlamaTokenizer` rebuilds it on the
slow base class that remains (SentencePieceBackend: added-token trie split, AddedToken handling,
legacy `_tokenize`), adding 4.x LlamaTokenizer's own non-legacy `tokenize` (text "▁" -> " ",
one prefix "▁", a lone prefix dropped before a special token) and `_tokenize` (unk-prefix trick
on a SentencePiece model whose add_dummy_prefix is off). 4.x switched the dummy prefix off with
protobuf's MergeFrom; protobuf is not in our venv, so the same merge is done on the wire: an
appended normalizer_spec {add_dummy_prefix: false} message (field 3 of ModelProto, field 3 of
NormalizerSpec) merges into the first one.
"""
import argparse
import json
import os

import sentencepiece as spm
from transformers import AddedToken
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

SPIECE_UNDERLINE = "\u2581"
TEXTS = [
    "Hello world",
    "Hello</s>",
    "Hello </s> world",
    "</s>Hello",
    "<s> Hello",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "a\u2581b \u2581c",
    "x[PAD]y [PAD] z",
    "<unk><s></s>",
    "\n\n### Response:</s>",
    "tab\tand\nnewline</s>\n",
    "\u00fcn\u00efc\u00f8d\u00e9 \u65e5\u672c\u8a9e \U0001F999</s>",
    "",
    " ",
    "</s>",
    "</s> ",
]


class Slow4xLlamaTokenizer(SentencePieceBackend):
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, legacy, **kwargs):
        super().__init__(vocab_file=vocab_file, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                         legacy=True, special_tokens_pattern="bos", **kwargs)
        self.legacy = legacy
        if not legacy:
            with open(vocab_file, "rb") as f:
                proto = f.read()
            sp = spm.SentencePieceProcessor()
            sp.LoadFromSerializedProto(proto + b"\x1a\x02\x18\x00")
            assert sp.encode("Hello", out_type=str)[0] != SPIECE_UNDERLINE + "Hello", "dummy prefix still on"
            self.sp_model = sp
        self.unk_token_length = len(self.sp_model.encode(str(self.unk_token)))

    def tokenize(self, text, **kwargs):
        if self.legacy or len(text) == 0:
            return super().tokenize(text, **kwargs)
        text = text.replace(SPIECE_UNDERLINE, " ")
        text = SPIECE_UNDERLINE + text
        tokens = super().tokenize(text, **kwargs)
        if len(tokens) > 1 and tokens[0] == SPIECE_UNDERLINE and tokens[1] in self.all_special_tokens:
            tokens = tokens[1:]
        return tokens

    def _tokenize(self, text, **kwargs):
        if self.legacy or not text.startswith((SPIECE_UNDERLINE, " ")):
            return self.sp_model.encode(text, out_type=str)
        tokens = self.sp_model.encode(self.unk_token + text, out_type=str)
        return tokens[self.unk_token_length:] if len(tokens) >= self.unk_token_length else tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../shared"))
    ap.add_argument("--tokenizer", default=os.path.join(shared, "data/llama2-tokenizer/tokenizer.model"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not os.path.exists(args.tokenizer):
        print(f"{args.tokenizer} not found; writing no fixture")
        return
    result = {}
    for name, legacy in (("legacy", True), ("non_legacy", False)):
        tok = Slow4xLlamaTokenizer(args.tokenizer, legacy=legacy)
        # train.py adds "[PAD]" as a plain string; transformers 4.28.1 (stanford_alpaca's pin) then
        # strips the whitespace on both sides of it in the text, which is what an AddedToken with
        # lstrip/rstrip does on this base class (tests/reference/slow_llama_428_reference.py checks
        # the SentencePiece path against 4.28.1 itself).
        tok.add_special_tokens({"pad_token": AddedToken("[PAD]", lstrip=True, rstrip=True, special=True,
                                                        normalized=False)})
        result[name] = {"texts": TEXTS, "ids": [tok(t)["input_ids"] for t in TEXTS]}
    with open(os.path.join(args.out, "edge_cases.json"), "w") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
    for name in result:
        for t, ids in zip(TEXTS, result[name]["ids"]):
            print(name, repr(t), ids)


if __name__ == "__main__":
    main()
