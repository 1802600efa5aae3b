"""Reference for the SentencePiece path: transformers 4.28.1's slow LlamaTokenizer, the version
stanford_alpaca pins (transformers>=4.28.1) and ran, loaded as train.py does
(`AutoTokenizer.from_pretrained(dir, use_fast=False)`), after train.py's special-token rule
(LLaMA-2 has bos/eos/unk, so "[PAD]" is added as a plain string). Runs in the separate venv
.venv-transformers428/ (transformers==4.28.1, tokenizers==0.13.3, sentencepiece; no torch) that
scripts/install_deps.sh creates.

4.28.1 differs from later versions around added tokens written in the text: a token added as a
plain string ("[PAD]") strips the whitespace on both sides of it (tokenization_utils.py
`tokenize`: "We strip left and right by default"), while <s>/</s>/<unk> are AddedTokens without
lstrip/rstrip; every chunk between added tokens gets SentencePiece's dummy prefix (no `legacy`
switch yet).

Writes --out/examples.jsonl (train.py's input_ids and labels for every record) and
--out/edge.json ({"texts": [...], "ids": [[...]], "decoded": [...]}).
"""
import argparse
import copy
import json
import os
import shutil

import transformers

from stanford_alpaca_rules import IGNORE_INDEX, PROMPT_DICT, alpaca_sources, train_py_rule

HERE = os.path.dirname(os.path.abspath(__file__))
EDGE = [
    "", " ", "  ", "\n", "Hello world", " Hello", "Hello  world", "trailing  ", "a\tb\t\tc",
    "crlf\r\nline\r\n\r\n", "tabs\t\t\tand   spaces  \n  ", "\u00a0nbsp\u3000ideographic", "日本語のテキストです。",
    "emoji 🦙🦙 👩‍👩‍👧 ✨", "combining e\u0301 a\u0308", "digits 1234567890 3.14159 1,000,000", "a" * 300,
    "\u2581 already metaspace \u2581x", "Hello</s>", "Hello </s> world", "</s>Hello", "<s> Hello", "<unk><s></s>",
    "x[PAD]y [PAD] z", " [PAD] ", "a  [PAD]\n\nb", "[PAD][PAD]", "\u3000[PAD]\u00a0x", "tab\t[PAD]\tend</s>\n",
    "\n\n### Response:</s>", PROMPT_DICT["prompt_no_input"].format(instruction="") + "</s>",
    PROMPT_DICT["prompt_input"].format(instruction="", input="") + "[PAD]</s>",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(HERE, "../../../shared"))
    ap.add_argument("--data_path", default=os.path.join(shared, "data/alpaca/alpaca_5000.json"))
    ap.add_argument("--tokenizer", default=os.path.join(shared, "data/llama2-tokenizer/tokenizer.model"))
    ap.add_argument("--model_max_length", type=int, default=512)
    args = ap.parse_args()
    assert transformers.__version__ == "4.28.1", transformers.__version__
    os.makedirs(args.out, exist_ok=True)
    if not (os.path.exists(args.data_path) and os.path.exists(args.tokenizer)):
        print(f"shared data not found ({args.data_path}, {args.tokenizer}); writing no fixture")
        return
    d = os.path.join(args.out, "llama2")
    os.makedirs(d, exist_ok=True)
    shutil.copy(args.tokenizer, d)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer"}, f)
    tok = transformers.AutoTokenizer.from_pretrained(d, model_max_length=args.model_max_length,
                                                     padding_side="right", use_fast=False)
    assert type(tok).__name__ == "LlamaTokenizer", type(tok)
    special, num_new = train_py_rule(tok)
    assert num_new == 1 and tok.pad_token_id == 32000, special

    with open(args.data_path) as f:
        records = json.load(f)
    sources = alpaca_sources(records)
    targets = [f"{r['output']}{tok.eos_token}" for r in records]

    def _tokenize_fn(strings):  # train.py without torch: the same call, lists instead of tensors
        out = [tok(t, padding="longest", max_length=tok.model_max_length, truncation=True)["input_ids"]
               for t in strings]
        return out, [sum(i != tok.pad_token_id for i in ids) for ids in out]

    examples_ids, _ = _tokenize_fn([s + t for s, t in zip(sources, targets)])
    _, sources_lens = _tokenize_fn(sources)
    labels = copy.deepcopy(examples_ids)
    for label, n in zip(labels, sources_lens):
        label[:n] = [IGNORE_INDEX] * min(n, len(label))
    with open(os.path.join(args.out, "examples.jsonl"), "w") as f:
        for ids, lab in zip(examples_ids, labels):
            f.write(json.dumps({"input_ids": ids, "labels": lab}) + "\n")
    ids = [tok(t)["input_ids"] for t in EDGE]
    with open(os.path.join(args.out, "edge.json"), "w") as f:
        json.dump({"texts": EDGE, "ids": ids, "decoded": [tok.decode(x, skip_special_tokens=True) for x in ids]},
                  f, ensure_ascii=False, indent=1)
    for t, x in zip(EDGE, ids):
        print(repr(t)[:60], x[:24])
    # train.py's Trainer(tokenizer=...).save_model: the output directory's tokenizer files, and what
    # 4.28.1 encodes after reading them back (special_tokens_map.json decides which special tokens
    # strip the whitespace beside them).
    saved = os.path.join(args.out, "saved")
    tok.save_pretrained(saved)
    back = transformers.AutoTokenizer.from_pretrained(saved, use_fast=False)
    with open(os.path.join(saved, "special_tokens_map.json")) as f:
        special_map = json.load(f)
    with open(os.path.join(args.out, "saved.json"), "w") as f:
        json.dump({"special_tokens_map": special_map, "ids": [back(t)["input_ids"] for t in EDGE]}, f,
                  ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
