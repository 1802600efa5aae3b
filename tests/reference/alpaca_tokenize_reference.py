"""Reference for the Alpaca tokenization parity test (issue 4).

Reproduces stanford_alpaca train.py's preprocessing (`_tokenize_fn` + `preprocess`) on a dataset
with the slow (Python, SentencePiece) LLaMA tokenizer, and writes one JSON line per record:
{"input_ids": [...], "labels": [...]}, plus timing.json with the tokenization throughput.

transformers 5 removed the slow `LlamaTokenizer` (LlamaTokenizer is now the `tokenizers`-backed
class and `use_fast=False` is ignored). The slow machinery itself remains: `SentencePieceBackend`
(a `PreTrainedTokenizer`: the added-token trie split, AddedToken lstrip/rstrip, `_tokenize` =
`sp_model.encode(chunk)` per chunk in legacy mode, truncation, special tokens). `SlowLlamaTokenizer`
below is that class configured as transformers 4.x's slow LlamaTokenizer was for a bare
tokenizer.model: bos <s>, eos </s>, unk <unk>, legacy=True, BOS prepended and no EOS. As an
independent cross-check, every record is also encoded with the python sentencepiece package
directly (BOS + sp.encode of each chunk between special-token strings); the script fails if the
two disagree anywhere.
"""
import argparse
import copy
import json
import os
import re
import time

import sentencepiece as spm
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

from stanford_alpaca_rules import IGNORE_INDEX, alpaca_sources



class SlowLlamaTokenizer(SentencePieceBackend):
    """transformers 4.x slow LlamaTokenizer (legacy) on the transformers 5 slow base class."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        super().__init__(
            vocab_file=vocab_file,
            bos_token="<s>",
            eos_token="</s>",
            unk_token="<unk>",
            legacy=True,
            special_tokens_pattern="bos",
            **kwargs,
        )


def sp_reference(sp, text, specials):
    """BOS + sentencepiece on each chunk between special-token strings (independent check)."""
    ids = [sp.bos_id()]
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    for chunk in re.split(pattern, text):
        if not chunk:
            continue
        if chunk in specials:
            ids.append(specials[chunk])
        else:
            ids.extend(sp.encode(chunk))
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../shared"))
    ap.add_argument("--data_path", default=os.path.join(shared, "data/alpaca/alpaca_5000.json"))
    ap.add_argument("--tokenizer", default=os.path.join(shared, "data/llama2-tokenizer/tokenizer.model"))
    ap.add_argument("--model_max_length", type=int, default=512)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not (os.path.exists(args.data_path) and os.path.exists(args.tokenizer)):
        print(f"shared data not found ({args.data_path}, {args.tokenizer}); writing no fixture")
        return

    tokenizer = SlowLlamaTokenizer(args.tokenizer, model_max_length=args.model_max_length, padding_side="right")
    # smart_tokenizer_and_embedding_resize: LLaMA has bos/eos/unk but no pad -> add [PAD].
    num_new = tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    assert num_new == 1 and tokenizer.pad_token_id == 32000 and len(tokenizer) == 32001, (
        num_new, tokenizer.pad_token_id, len(tokenizer))

    with open(args.data_path) as f:
        records = json.load(f)
    sources = alpaca_sources(records)
    targets = [f"{r['output']}{tokenizer.eos_token}" for r in records]

    def _tokenize_fn(strings):
        tokenized_list = [
            tokenizer(text, return_tensors="pt", padding="longest", max_length=tokenizer.model_max_length, truncation=True)
            for text in strings
        ]
        input_ids = [t.input_ids[0] for t in tokenized_list]
        lens = [t.input_ids.ne(tokenizer.pad_token_id).sum().item() for t in tokenized_list]
        return input_ids, lens

    start = time.perf_counter()
    cpu_start = time.process_time()
    examples = [s + t for s, t in zip(sources, targets)]
    examples_ids, _ = _tokenize_fn(examples)
    _, sources_lens = _tokenize_fn(sources)
    labels = copy.deepcopy(examples_ids)
    for label, source_len in zip(labels, sources_lens):
        label[:source_len] = IGNORE_INDEX
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start

    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    specials = {"<s>": 1, "</s>": 2, "<unk>": 0, "[PAD]": 32000}
    mismatches = 0
    for text, ids in zip(examples, examples_ids):
        ref = sp_reference(sp, text, specials)[: args.model_max_length]
        mismatches += ref != ids.tolist()
    assert mismatches == 0, f"{mismatches} records differ between SentencePieceBackend and plain sentencepiece"

    with open(os.path.join(args.out, "examples.jsonl"), "w") as f:
        for ids, lab in zip(examples_ids, labels):
            f.write(json.dumps({"input_ids": ids.tolist(), "labels": lab.tolist()}) + "\n")
    num_tokens = sum(len(x) for x in examples_ids)
    timing = {"records": len(records), "seconds": seconds, "cpu_seconds": cpu_seconds,
              "records_per_s": len(records) / seconds,
              "tokens": num_tokens, "note": "train.py preprocess, slow tokenizer, one Python thread"}
    with open(os.path.join(args.out, "timing.json"), "w") as f:
        json.dump(timing, f, indent=2)
    print(json.dumps(timing))


if __name__ == "__main__":
    main()
