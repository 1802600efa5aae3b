"""Reference for the tokenizer.json components a `tokenizers` user builds by hand (the library's
quicktour: BPE + Whitespace) beyond what pretrained files carry: the Whitespace, Punctuation,
CharDelimiterSplit and UnicodeScripts pre-tokenizers, the WordLevel model, the ByteLevel normalizer,
and the Fuse / WordPiece decoders (or none) such files have. Each case trains a small tokenizer with
the pinned `tokenizers` on the first TRAIN_RECORDS Alpaca records (the Unigram cases: the committed
ones in KEPT_UNIGRAM, trained once when missing or with --retrain-unigram) and saves it as
--out/cases/<case>/tokenizer.json with a PreTrainedTokenizerFast tokenizer_config.json (bos, eos,
unk, pad set); --out/cases/<case>.json holds what transformers 5's AutoTokenizer gives on the edge
texts and the first --records Alpaca records as train.py builds them (tokenizer_classes_reference's
case_reference: ids with and without special tokens, both decodes, roles, len, pipeline).

--out/scripts_probe.json checks UnicodeScripts on every code point: a tokenizer whose pieces show
as ids ("▁" = 1 opens each piece, every character in it is the unk 0) encodes all code points in
order, in chunks; the ids are the library's (the backend transformers runs).
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

TRAIN_RECORDS = 400
# The Unigram cases' trained tokenizer.json files, committed (see train_cases).
KEPT_UNIGRAM = os.path.join(REPO, "tests/fixtures/tokenizers/unigram_components")
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[CLS]", "eos_token": "[SEP]",
          "unk_token": "[UNK]", "pad_token": "[PAD]"}
# Beyond hf_tokenizer_reference's EDGE: what these components split on (\w with marks, joiners and
# Alphabetic symbols, punctuation runs, the delimiter, script changes, leading spaces).
EXTRA_EDGE = [
    "Ⓐⓑ circled x__y a\u200db a\u200cb snake_case CamelCase", "a-b_c.d e/f g:h (i) [j] {k}",
    "!!!???... ——– «quoted» „low“ ¿qué? ¡sí! 「括弧」", "$$$ %%% ^^^ +++ === ||| ~~~ `` '' \"\"",
    "שלום עולם مرحبا بالعالم \u200fRTL\u200e mark ١٢٣", "Ελληνικά Кириллица ภาษาไทย हिन्दी ქართული",
    "カタカナーひらがな漢字 ｶﾀｶﾅ ー", "  leading spaces then 日本", "Latin日本語Latin123日本", "1st 2nd ٣ ৩ ๓ ⅠⅡ ½ ²",
    "tab\tsep\tvalues\r\nnext\rline\u2028sep\u0085nel", "ﬁﬂ ǅ ß ẞ İı ŉ", "\U0001FAE8 \U0001F600\u200d\U0001F525 \u2764\ufe0f",
    "e\u0301\u0302\u0303 \u0301leading mark", "   ", "\t\n", "word", "word  word   word",
    # Runs of one character: Unigram segmentations that tie in real arithmetic ("0" + "000" vs "000" + "0").
    "0000 00000000 1111111 ====== ---------- ...... !!!!!!!! aaaaaaaaaa              x", "10000000000 2000000",
]


def train_cases(text, out, retrain=False):
    """{case: tokenizer.json path}: one trained tokenizer per component combination (the Unigram
    ones read from KEPT_UNIGRAM unless `retrain` or missing there, then trained and written there)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    def post(tok):
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])

    def bpe_trainer(**kw):
        return trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS, **kw)

    made = {}
    # The quicktour: BPE + Whitespace, the [CLS] $A [SEP] template, no decoder.
    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    made["bpe_whitespace"] = (t, bpe_trainer())
    t = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    made["wordlevel_whitespace"] = (t, trainers.WordLevelTrainer(vocab_size=1500, special_tokens=SPECIALS))
    t = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    t.decoder = decoders.WordPiece()
    made["wordlevel_punct_wordpiece_decoder"] = (t, trainers.WordLevelTrainer(vocab_size=1500, special_tokens=SPECIALS))
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    t.decoder = decoders.WordPiece(prefix="##")
    made["wordpiece_whitespace_punct"] = (t, trainers.WordPieceTrainer(vocab_size=1500, special_tokens=SPECIALS))
    for behavior in ("removed", "merged_with_previous", "merged_with_next", "contiguous"):
        t = Tokenizer(models.BPE(unk_token="[UNK]"))
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                   pre_tokenizers.Punctuation(behavior=behavior)])
        made["bpe_punct_" + behavior] = (t, bpe_trainer())
    t = Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.CharDelimiterSplit(" ")
    made["bpe_char_delimiter"] = (t, bpe_trainer())
    t = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    t.pre_tokenizer = pre_tokenizers.CharDelimiterSplit("e")
    t.decoder = decoders.BPEDecoder(suffix="</w>")
    made["bpe_char_delimiter_e"] = (t, bpe_trainer(end_of_word_suffix="</w>"))
    # Metaspace after UnicodeScripts cuts the space runs; UnicodeScripts alone keeps them, whose
    # equal-score Viterbi ties (" " + "     " vs "     " + " ") the library breaks by the last bits of
    # the scores serde_json parses (docs/tokenizers.md, src/tokenizer/json_numbers.h). The Fuse decoder
    # is in the ByteLevel-normalizer WordLevel case.
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.UnicodeScripts(), pre_tokenizers.Metaspace()])
    t.decoder = decoders.Metaspace()
    made["unigram_scripts"] = (t, trainers.UnigramTrainer(vocab_size=1500, special_tokens=SPECIALS, unk_token="[UNK]"))
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.UnicodeScripts()
    made["unigram_scripts_only"] = (t, trainers.UnigramTrainer(vocab_size=1500, special_tokens=SPECIALS,
                                                               unk_token="[UNK]"))
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.UnicodeScripts(),
                                               pre_tokenizers.Digits(individual_digits=True)])
    made["unigram_whitespace_scripts"] = (t, trainers.UnigramTrainer(vocab_size=1500, special_tokens=SPECIALS,
                                                                     unk_token="[UNK]"))
    # Byte-level BPE with the bytes mapped by the normalizer; pieces cut before each "Ġ" (a space).
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.ByteLevel()
    t.pre_tokenizer = pre_tokenizers.Split("Ġ", behavior="merged_with_next")
    t.decoder = decoders.ByteLevel()
    made["bpe_bytelevel_normalizer"] = (t, bpe_trainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.ByteLevel()])
    t.pre_tokenizer = pre_tokenizers.Split(Regex("Ġ+|[^Ġ]+"), behavior="isolated")
    t.decoder = decoders.Fuse()
    made["wordlevel_bytelevel_normalizer_fuse"] = (t, trainers.WordLevelTrainer(vocab_size=1500,
                                                                                      special_tokens=SPECIALS))
    paths = {}
    for name, (tok, trainer) in made.items():
        paths[name] = os.path.join(out, name + ".json")
        kept = os.path.join(KEPT_UNIGRAM, name + ".json")
        if isinstance(trainer, trainers.UnigramTrainer) and not retrain and os.path.exists(kept):
            # UnigramTrainer is not reproducible (not even single-threaded): its vocabulary, and the
            # ties in it, differ run to run. The committed one keeps the fixture the same everywhere.
            shutil.copy(kept, paths[name])
            continue
        tok.train([text], trainer)
        post(tok)
        tok.save(paths[name])
        if isinstance(trainer, trainers.UnigramTrainer):
            os.makedirs(KEPT_UNIGRAM, exist_ok=True)
            tok.save(kept)
    return paths


def scripts_probe(out, chunk=8192):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from unicode_scripts_table import code_points

    tok = Tokenizer(models.BPE(vocab={"<unk>": 0, "\u2581": 1}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.UnicodeScripts(),
                                                 pre_tokenizers.Metaspace(prepend_scheme="always", split=False)])
    path = os.path.join(out, "scripts_probe_tokenizer.json")
    tok.save(path)
    cps = code_points()
    texts = ["".join(chr(c) for c in cps[i:i + chunk]) for i in range(0, len(cps), chunk)]
    # Each code point after "a" and after "京" too: a piece cut (or not) next to Latin and Han.
    texts += ["".join(p + chr(c) for c in cps[i:i + chunk]) for p in ("a", "\u4eac") for i in range(0, len(cps), chunk)]
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    with open(os.path.join(out, "scripts_probe.json"), "w") as f:
        json.dump({"tokenizer": path, "texts": texts, "ids": ids}, f, ensure_ascii=False)
    return len(texts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--records", type=int, default=100, help="Alpaca records among the texts compared")
    ap.add_argument("--retrain-unigram", action="store_true",
                    help=f"train the Unigram cases anew and rewrite {os.path.relpath(KEPT_UNIGRAM, REPO)}")
    args = ap.parse_args()
    out = os.path.abspath(args.out)  # the cases' "dir" is read from elsewhere
    shared = os.environ.get("ALPACA_SHARED_DIR", os.path.join(REPO, "../shared"))
    data = os.path.join(shared, "data/alpaca/alpaca_5000.json")
    if not os.path.exists(data):
        return print(f"{data} not found; writing no fixture")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "bases"))
    from hf_tokenizer_reference import EDGE
    from stanford_alpaca_rules import alpaca_sources
    from tokenizer_classes_reference import alpaca_text, case_reference

    with open(data) as f:
        records = json.load(f)[: args.records]
    edge = EDGE + EXTRA_EDGE
    # train.py's examples: prompt + output + the EOS string
    examples = list(zip(alpaca_sources(records), (r["output"] for r in records)))

    def texts_for(eos):
        return edge + [s + o + eos for s, o in examples]

    text = alpaca_text(os.path.join(out, "bases", "alpaca.txt"), n=TRAIN_RECORDS)
    reference = {"edge": len(edge), "records": len(records), "cases": {}}
    for name, path in train_cases(text, os.path.join(out, "bases"), args.retrain_unigram).items():
        d = os.path.join(out, "cases", name)
        os.makedirs(d)
        shutil.copy(path, os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(CONFIG, f)
        texts, ref = case_reference(d, texts_for)
        ref.update({"config": CONFIG, "texts": texts})
        with open(os.path.join(out, "cases", name + ".json"), "w") as f:
            json.dump(ref, f, ensure_ascii=False)
        reference["cases"][name] = {"class": ref["class"]}
        print(f"{name}: len {ref['len']}, first record {len(ref['ids'][len(edge)])} ids, "
              f"edge 'Hello world' -> {ref['ids'][edge.index('Hello world')]}")
    reference["scripts_probe_texts"] = scripts_probe(out)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f, ensure_ascii=False, indent=1)
    print(f"{len(reference['cases'])} cases x ({len(edge)} edge texts + {len(records)} records); "
          f"{reference['scripts_probe_texts']} UnicodeScripts probe texts")


if __name__ == "__main__":
    main()
