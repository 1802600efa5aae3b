"""Reference for issue 26: LLaMA-2 tokenizer.json files as three transformers generations write
them, and what transformers 5's AutoTokenizer does with each (after stanford_alpaca train.py's
special-token rule).

Writers (each in its own venv, from ../shared/data/llama2-tokenizer/tokenizer.model):
  tf428         transformers 4.28.1 `LlamaTokenizerFast(vocab_file=...).save_pretrained` (.venv-
                transformers428): normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
                added tokens <unk>/<s>/</s> with "normalized": true, no "legacy" in the config.
                The 4.28.1 SentencePiece extractor is O(vocab^2) (about 30 min here); it is replaced
                by an equivalent linear one giving the same merges in the same order (checked once
                byte-for-byte against the original: identical tokenizer.json and config).
  tf444_legacy_{true,false}  transformers 4.44.2 (.venv-transformers444), legacy=True / False.
  tf5, tf5_legacy_true       transformers 5 (.venv): LlamaTokenizer.from_pretrained(dir holding
                tokenizer.model[, legacy=True]).save_pretrained (transformers 5 writes no "legacy"
                key, so legacy=True is lost on reload).
Each writer's directory becomes two variants: `<writer>_json` (tokenizer.model removed) and
`<writer>_model` (tokenizer.model beside tokenizer.json; loaded with use_fast as
--use_fast_tokenizer does, since transformers 5 always takes tokenizer.json).

Writes --out/variants/<variant>/, --out/ids_<k>.jsonl (train.py's input_ids and labels for all
records; identical outputs share a file), --out/reference.json (per variant: roles, ids, edge-case
ids and decodes, the raw `tokenizers` library's ids for "Hello world</s>", the file's normalizer
and class) and --out/classes.json (every tokenizer_class transformers 5 rebuilds from its class,
the classes it takes as is, and the pipelines LlamaTokenizer/GPT2Tokenizer/Qwen2Tokenizer build
for each flag setting).
"""
import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
IGNORE_INDEX = -100


def fast_extract(self, vocab_scores=None):
    """transformers 4.28.1's SentencePieceExtractor.extract without its vocab x vocab loop: every
    (left, right) pair whose concatenation is a piece, ordered as the original's stable sort leaves
    them (by score, then left id, then right id)."""
    sp = self.sp
    vocab = {sp.id_to_piece(i): i for i in range(sp.GetPieceSize())}
    scores, reverse = (dict(vocab_scores), True) if vocab_scores is not None else (vocab, False)
    merges = []
    for merge, score in scores.items():
        if not score:
            continue
        for i in range(1, len(merge)):
            left, right = merge[:i], merge[i:]
            if left in vocab and right in vocab:
                merges.append((left, right, score))
    merges.sort(key=lambda m: ((-m[2] if reverse else m[2]), vocab[m[0]], vocab[m[1]]))
    return vocab, [(left, right) for left, right, _ in merges]


def write_4x(model, out, legacy):
    """Runs inside a transformers 4.x venv."""
    import transformers
    import transformers.convert_slow_tokenizer as cst
    from transformers import LlamaTokenizerFast

    if transformers.__version__ == "4.28.1":
        cst.SentencePieceExtractor.extract = fast_extract
    kwargs = {} if legacy is None else {"legacy": legacy == "true"}
    LlamaTokenizerFast(vocab_file=model, **kwargs).save_pretrained(out)
    print(transformers.__version__, sorted(os.listdir(out)))


def write_5(model, out, legacy):
    from transformers import LlamaTokenizer

    src = out + "_src"
    os.makedirs(src, exist_ok=True)
    shutil.copy(model, src)
    kwargs = {} if legacy is None else {"legacy": legacy == "true"}
    LlamaTokenizer.from_pretrained(src, **kwargs).save_pretrained(out)
    shutil.rmtree(src)


def class_lists():
    """tokenizer_class names transformers 5 rebuilds from the class (a TokenizersBackend subclass
    defining __init__), by the name AutoTokenizer looks up (without "Fast"), and some taken as is."""
    import transformers
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    names = {v for v in TOKENIZER_MAPPING_NAMES.values() if v}
    names |= {n for n in dir(transformers) if n.endswith("Tokenizer") or n.endswith("TokenizerFast")}
    rebuilt, as_is = {}, []
    for n in sorted({x[:-4] if x.endswith("Fast") else x for x in names}):
        try:
            c = tokenizer_class_from_name(n) or tokenizer_class_from_name(n + "Fast")
        except Exception:
            continue
        if not (isinstance(c, type) and issubclass(c, TokenizersBackend)):
            continue
        if c is not TokenizersBackend and "__init__" in c.__dict__:
            rebuilt[n] = c.__name__
        else:
            as_is.append(n)
    return rebuilt, as_is + ["PreTrainedTokenizerFast", "NoSuchTokenizer"]


def class_pipelines(tmp):
    """The normalizer/pre-tokenizer/decoder/model flags each reimplemented class builds, per flag
    setting, from a tiny tokenizer.json whose own pipeline is something else."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import AutoTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|endoftext|>": 3, "a": 4, "b": 5, "ab": 6, "\u2581": 7}
    base = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    base.normalizer = normalizers.Lowercase()
    base.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    cases = []
    for cls in ("LlamaTokenizer", "GPT2Tokenizer", "Qwen2Tokenizer", "LlamaTokenizerFast"):
        for legacy in (None, True, False):
            for aps in (None, True, False):
                if cls != "LlamaTokenizer" and legacy is not None:
                    continue
                config = {"tokenizer_class": cls}
                if legacy is not None:
                    config["legacy"] = legacy
                if aps is not None:
                    config["add_prefix_space"] = aps
                d = os.path.join(tmp, f"case{len(cases)}")
                os.makedirs(d, exist_ok=True)
                base.save(os.path.join(d, "tokenizer.json"))
                with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                    json.dump(config, f)
                built = json.loads(AutoTokenizer.from_pretrained(d).backend_tokenizer.to_str())
                model = {k: v for k, v in built["model"].items() if k not in ("vocab", "merges")}
                cases.append({"config": config, "normalizer": built["normalizer"],
                              "pre_tokenizer": built["pre_tokenizer"], "decoder": built["decoder"], "model": model})
    return cases


EXTRA_EDGE = [
    "Sure, here it is.</s>", "</s>", " </s>", "a</s>b", "\n</s>", "<s></s>", "\u2581</s>", "Hello <s>world",
    "Hello</s> world", "### Response:The answer is 42.</s>", "x [PAD]</s>", "<unk></s><s>",
]


def variant_reference(d, records, edge, max_len):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    sys.path.insert(0, HERE)
    from stanford_alpaca_rules import alpaca_sources, train_py_rule

    tok = AutoTokenizer.from_pretrained(d, model_max_length=max_len, padding_side="right")
    special, num_new = train_py_rule(tok)
    sources = alpaca_sources(records)
    examples = [s + f"{r['output']}{tok.eos_token}" for s, r in zip(sources, records)]
    # One batch call gives the same ids as train.py's one-string calls (no padding is applied).
    full = tok(examples, max_length=max_len, truncation=True)["input_ids"]
    src = tok(sources, max_length=max_len, truncation=True)["input_ids"]
    lines = []
    for ids, s in zip(full, src):
        labels = copy.deepcopy(ids)
        n = sum(1 for i in s if i != tok.pad_token_id)  # input_ids.ne(pad_token_id).sum()
        labels[:n] = [IGNORE_INDEX] * min(n, len(labels))
        lines.append(json.dumps({"input_ids": ids, "labels": labels}))
    edges = []
    for text in edge:
        ids = tok(text)["input_ids"]
        edges.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer.json")) as f:
        normalizer = json.load(f)["normalizer"]
    ref = {"dir": d, "class": type(tok).__name__, "special_tokens_added": special, "num_new_tokens": num_new,
           "len": len(tok), "pad_id": tok.pad_token_id, "eos_id": tok.eos_token_id, "bos_id": tok.bos_token_id,
           "unk_id": tok.unk_token_id, "eos_token": tok.eos_token, "edge": edges,
           "raw_library_hello_eos": raw.encode("Hello world</s>").ids,
           "auto_hello_eos": tok("Hello world</s>", add_special_tokens=False)["input_ids"],
           "file_normalizer": normalizer, "has_tokenizer_model": os.path.exists(os.path.join(d, "tokenizer.model"))}
    return ref, "\n".join(lines) + "\n"


def make_writers(args, model, work):
    writers = {}
    for name, py, legacy in (("tf428", args.python428, None), ("tf444_legacy_true", args.python444, "true"),
                             ("tf444_legacy_false", args.python444, "false")):
        out = os.path.join(work, name)
        cmd = [py, os.path.abspath(__file__), "--write", model, out] + ([legacy] if legacy else [])
        subprocess.check_call(cmd)
        writers[name] = out
    for name, legacy in (("tf5", None), ("tf5_legacy_true", "true")):
        out = os.path.join(work, name)
        write_5(model, out, legacy)
        writers[name] = out
    # pad = bos (4.28.1's files with pad_token "<s>" in the config): train.py adds no [PAD], and its
    # source length input_ids.ne(pad_token_id).sum() leaves out every row's BOS, so the last prompt
    # token trains.
    out = os.path.join(work, "tf428_pad_bos")
    shutil.copytree(writers["tf428"], out)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["pad_token"] = "<s>"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    writers["tf428_pad_bos"] = out
    return writers


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--write":  # inside a 4.x venv
        write_4x(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    ap.add_argument("--data_path", default=os.path.join(shared, "data/alpaca/alpaca_5000.json"))
    ap.add_argument("--python428", default=os.path.join(REPO, ".venv-transformers428/bin/python"))
    ap.add_argument("--python444", default=os.path.join(REPO, ".venv-transformers444/bin/python"))
    ap.add_argument("--model_max_length", type=int, default=512)
    args = ap.parse_args()
    model = os.path.join(shared, "data/llama2-tokenizer/tokenizer.model")
    if not (os.path.exists(args.data_path) and os.path.exists(model)):
        print(f"shared data not found under {shared}; writing no fixture")
        return
    for py in (args.python428, args.python444):
        assert os.path.exists(py), f"{py} missing: run scripts/install_deps.sh"
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    work = os.path.join(args.out, "writers")
    os.makedirs(work)
    writers = make_writers(args, model, work)
    sys.path.insert(0, HERE)
    from hf_tokenizer_reference import EDGE

    edge = EDGE + EXTRA_EDGE
    with open(args.data_path) as f:
        records = json.load(f)
    reference = {"model_max_length": args.model_max_length, "edge_texts": edge, "records": len(records),
                 "variants": {}}
    files = {}
    for wname, wdir in writers.items():
        for kind in ("json", "model"):
            d = os.path.join(args.out, "variants", f"{wname}_{kind}")
            shutil.copytree(wdir, d)
            tm = os.path.join(d, "tokenizer.model")
            if kind == "json" and os.path.exists(tm):
                os.remove(tm)
            if kind == "model" and not os.path.exists(tm):
                shutil.copy(model, tm)
            ref, text = variant_reference(d, records, edge, args.model_max_length)
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest not in files:
                files[digest] = f"ids_{len(files)}.jsonl"
                with open(os.path.join(args.out, files[digest]), "w") as f:
                    f.write(text)
            ref["records_file"] = files[digest]
            reference["variants"][f"{wname}_{kind}"] = ref
            print(f"{wname}_{kind}: {ref['class']}, len {ref['len']}, Hello world</s> -> raw library "
                  f"{ref['raw_library_hello_eos']}, AutoTokenizer {ref['auto_hello_eos']}, {ref['records_file']}")
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    rebuilt, as_is = class_lists()
    pipelines = class_pipelines(os.path.join(args.out, "class_cases"))
    with open(os.path.join(args.out, "classes.json"), "w") as f:
        json.dump({"rebuilt": rebuilt, "as_is": as_is, "pipelines": pipelines}, f, ensure_ascii=False, indent=1)
    print(f"{len(rebuilt)} classes rebuilt from the class, {len(pipelines)} pipeline cases")


if __name__ == "__main__":
    main()
