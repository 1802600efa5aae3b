#!/usr/bin/env python3
"""Makes the project's default training data in data/: a synthetic instruction dataset in
Stanford Alpaca's JSON format and a small SentencePiece tokenizer trained on it.

The tasks are ones a tiny LLaMA learns in minutes on a CPU: small-number arithmetic, reversing
and copying words, sorting and taking the maximum of short lists, counting words, upper-casing,
and lookups in fixed tables (capitals, opposites, animal sounds). About 40% of the records use
the `input` field (as in Alpaca) so both Alpaca prompt templates are exercised. The held-out split is drawn from
the same task distribution but shares no (instruction, input) pair with the training split.

Everything is deterministic in --seed (Python's random.Random and a single-threaded
SentencePiece BPE trainer), so re-running the script reproduces the committed files byte for byte:

    .venv/bin/python scripts/make_data.py            # writes data/
    .venv/bin/python scripts/make_data.py --check    # verifies data/ is what the script makes

Outputs:
  data/synthetic_train.json, data/synthetic_eval.json   JSON arrays of {instruction, input, output}
  data/tokenizer/tokenizer.model                        SentencePiece BPE, byte fallback, LLaMA ids
                                                        (unk 0, <s> 1, </s> 2, no pad)
  data/tokenizer/tokenizer_config.json, special_tokens_map.json, tokenizer.json
                                                        the Hugging Face files (transformers loads
                                                        the directory with AutoTokenizer)
"""
import argparse
import filecmp
import io
import json
import os
import random
import sys
import tempfile

import sentencepiece as spm

PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:"
)

WORDS = ("cat dog sun moon tree fish bird star rain snow leaf rock milk bread apple lemon river "
         "cloud green blue red black white small big fast slow happy quiet light dark").split()
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo", "Egypt": "Cairo",
            "Peru": "Lima", "Kenya": "Nairobi", "Chile": "Santiago", "Norway": "Oslo", "Greece": "Athens",
            "Canada": "Ottawa", "Cuba": "Havana", "Poland": "Warsaw", "Ireland": "Dublin", "India": "New Delhi",
            "China": "Beijing"}
OPPOSITES = {"hot": "cold", "up": "down", "big": "small", "fast": "slow", "light": "dark", "happy": "sad",
             "open": "closed", "early": "late", "full": "empty", "old": "new", "wet": "dry", "high": "low"}
SOUNDS = {"dog": "woof", "cat": "meow", "cow": "moo", "duck": "quack", "sheep": "baa", "owl": "hoot",
          "lion": "roar", "horse": "neigh", "frog": "ribbit", "bee": "buzz"}


def words(rng, lo, hi):
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def make_record(rng):
    """One (instruction, input, output) of a random task; tasks with an input put it inline in
    the instruction half of the time, so both prompt templates are common."""
    instruction, inp, out = make_task(rng)
    if inp and rng.random() < 0.5:
        return (f"{instruction[:-1]}: {inp}", "", out)
    return (instruction, inp, out)


def make_task(rng):
    task = rng.randrange(12)
    if task == 0:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return (f"What is {a} plus {b}?", "", str(a + b))
    if task == 1:
        a, b = sorted((rng.randint(0, 99), rng.randint(0, 99)), reverse=True)
        return ("Subtract the second number from the first.", f"{a} {b}", str(a - b))
    if task == 2:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return (f"Multiply {a} by {b}.", "", str(a * b))
    if task == 3:
        w = rng.choice(WORDS)
        return ("Reverse the letters of the word.", w, w[::-1])
    if task == 4:
        ws = words(rng, 2, 6)
        return ("Repeat the input exactly.", " ".join(ws), " ".join(ws))
    if task == 5:
        ws = words(rng, 2, 5)
        return ("Reverse the order of the words.", " ".join(ws), " ".join(reversed(ws)))
    if task == 6:
        nums = [rng.randint(0, 50) for _ in range(rng.randint(3, 6))]
        return ("Sort the numbers from smallest to largest.", " ".join(map(str, nums)),
                " ".join(map(str, sorted(nums))))
    if task == 7:
        nums = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
        return ("Which number is the largest?", ", ".join(map(str, nums)), str(max(nums)))
    if task == 8:
        ws = words(rng, 1, 8)
        return ("How many words are in the input?", " ".join(ws), str(len(ws)))
    if task == 9:
        ws = words(rng, 1, 3)
        return ("Write the input in capital letters.", " ".join(ws), " ".join(ws).upper())
    if task == 10:
        country = rng.choice(sorted(CAPITALS))
        return (f"What is the capital of {country}?", "", f"The capital of {country} is {CAPITALS[country]}.")
    if rng.random() < 0.5:
        w = rng.choice(sorted(OPPOSITES))
        return (f"What is the opposite of \"{w}\"?", "", OPPOSITES[w])
    animal = rng.choice(sorted(SOUNDS))
    return (f"What sound does a {animal} make?", "", f"A {animal} says {SOUNDS[animal]}.")


def make_splits(seed, num_train, num_eval):
    rng = random.Random(seed)
    seen, train, held_out = set(), [], []
    # Draw until both splits are full; a duplicate (instruction, input) is skipped so the eval
    # split is truly held out. Lookup tasks have few distinct prompts, so their share shrinks
    # once they are exhausted, which is fine.
    attempts = 0
    while len(train) < num_train or len(held_out) < num_eval:
        attempts += 1
        if attempts > 50 * (num_train + num_eval):
            sys.exit("make_data: could not draw enough distinct records; lower --num_train/--num_eval")
        instruction, inp, out = make_record(rng)
        if (instruction, inp) in seen:
            continue
        seen.add((instruction, inp))
        rec = {"instruction": instruction, "input": inp, "output": out}
        # Every 10th new record goes to the held-out split until it is full.
        if len(held_out) < num_eval and len(seen) % 10 == 0:
            held_out.append(rec)
        elif len(train) < num_train:
            train.append(rec)
    return train, held_out


def train_tokenizer(records, vocab_size):
    """The serialized SentencePiece model (bytes). Written through model_writer so no temporary
    path ends up inside the model's trainer_spec (the file must be reproducible)."""
    texts = []
    for r in records:
        prompt = (PROMPT_INPUT if r["input"] else PROMPT_NO_INPUT).format_map(r)
        texts.append(prompt + r["output"])
    # LLaMA's SentencePiece settings: BPE, byte fallback, digits split, dummy prefix, whitespace
    # kept as is (no normalization), unk/bos/eos = 0/1/2, no pad piece.
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=writer,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        max_sentence_length=8192,
        minloglevel=2,
    )
    return writer.getvalue()


def hf_files(model_file, out_dir):
    """tokenizer_config.json, special_tokens_map.json and tokenizer.json as alpaca::data::Tokenizer::save
    writes them (see src/tokenizer/tokenizer.cpp and src/tokenizer/tokenizer_json.cpp)."""
    from transformers.tokenization_utils_base import generate_merges

    sp = spm.SentencePieceProcessor(model_file=model_file)
    n = sp.get_piece_size()
    specials = [(0, "<unk>"), (1, "<s>"), (2, "</s>")]
    for i, s in specials:
        assert sp.id_to_piece(i) == s, (i, sp.id_to_piece(i))
    tok = lambda c: {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
    config = {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {str(i): tok(s) for i, s in specials},
        "bos_token": "<s>", "clean_up_tokenization_spaces": False, "eos_token": "</s>", "legacy": True,
        "model_max_length": 512, "pad_token": None, "padding_side": "right", "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
    }
    special_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = generate_merges(vocab, {sp.id_to_piece(i): sp.get_score(i) for i in range(n)})
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in specials],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]},
    }
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map),
                      ("tokenizer.json", tj)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")


def write_all(out, seed, num_train, num_eval, vocab_size):
    train, held_out = make_splits(seed, num_train, num_eval)
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    for name, recs in (("synthetic_train.json", train), ("synthetic_eval.json", held_out)):
        with open(os.path.join(out, name), "w") as f:
            json.dump(recs, f, indent=1, ensure_ascii=False)
            f.write("\n")
    with open(os.path.join(out, "tokenizer", "tokenizer.model"), "wb") as f:
        f.write(train_tokenizer(train, vocab_size))
    hf_files(os.path.join(out, "tokenizer", "tokenizer.model"), os.path.join(out, "tokenizer"))
    return len(train), len(held_out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "data"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--num_train", type=int, default=4000)
    ap.add_argument("--num_eval", type=int, default=400)
    ap.add_argument("--vocab_size", type=int, default=512)
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with --out")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            write_all(tmp, args.seed, args.num_train, args.num_eval, args.vocab_size)
            names = ["synthetic_train.json", "synthetic_eval.json", "tokenizer/tokenizer.model",
                     "tokenizer/tokenizer_config.json", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer.json"]
            bad = [n for n in names if not filecmp.cmp(os.path.join(tmp, n), os.path.join(args.out, n), shallow=False)]
            if bad:
                sys.exit(f"make_data --check: {bad} differ from what the script makes; rerun scripts/make_data.py")
            print("make_data --check: data/ is reproducible")
            return
    n_train, n_eval = write_all(args.out, args.seed, args.num_train, args.num_eval, args.vocab_size)
    print(f"wrote {n_train} train and {n_eval} held-out records and a {args.vocab_size}-piece tokenizer to {args.out}")


if __name__ == "__main__":
    main()
