"""Reference for tests/tokenizer/test_json_numbers: how the pinned `tokenizers` reads the numbers of
a tokenizer.json (serde_json without float_roundtrip, not correctly rounded), which decides Unigram
Viterbi ties.

Writes --out/numbers.json: {"tokenizer": path, "texts": [number texts], "parsed": [float.hex of the
value the library holds]}. The numbers are the scores of one Unigram tokenizer.json (written as
text, so each is exactly the given digits): shortest reprs of random doubles and of float32 values
(sentencepiece's scores, 17 significant digits), the scores of the committed trained Unigram
fixtures, long and padded digit strings (past u64), exponents, leading zeros, integers, subnormals.
The value the library holds is read back from Tokenizer.to_str(), which prints each f64 in its
shortest round-trip form, so Python's correctly rounded json.loads recovers it exactly.
"""
import argparse
import json
import os
import random
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KEPT_UNIGRAM = os.path.join(REPO, "tests/fixtures/tokenizers/unigram_components")


def number_texts():
    rng = random.Random(0)
    texts = []
    for _ in range(3000):  # doubles of Unigram-score size
        texts.append(repr(-rng.uniform(0, 20)))
    for _ in range(3000):  # float32 scores printed as f64 (sentencepiece -> tokenizers' converters)
        texts.append(repr(struct.unpack("f", struct.pack("f", -rng.uniform(0, 20)))[0]))
    for name in sorted(os.listdir(KEPT_UNIGRAM)):  # the trained fixtures' scores, as written
        raw = open(os.path.join(KEPT_UNIGRAM, name)).read()
        texts += re.findall(r'",\s*(-?[0-9][0-9.eE+-]*)\s*\]', raw.split('"vocab"', 1)[1])
    texts += [
        "0", "-0", "0.0", "-0.0", "1", "-5", "12", "-12.5", "0.000001234", "-0.00000000000000000000123456789",
        "1e5", "1E5", "1e+5", "-1.5e-7", "2.5E-300", "4.9e-324", "-2.2250738585072014e-308", "1e-320",
        "1.7976931348623157e308", "123456789012345678901234.5", "-18446744073709551615.5",
        "-18446744073709551616.25", "-1844674407370955161.59", "-1844674407370955161.69",
        "-3.892862718084515400000000000001", "-7.37778379666090340000", "-0.10000000000000000555",
        "-12345678901234567890123456789e-20", "-9007199254740993", "-9007199254740993.0", "-9.007199254740993e15",
    ]
    for _ in range(500):  # 18-25 digit decimals: past the u64 significand
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(18, 25)))
        point = rng.randint(1, 3)
        texts.append("-" + digits[:point].lstrip("0") + ("" if digits[:point].lstrip("0") else "0") + "." + digits[point:])
    return texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from tokenizers import Tokenizer

    texts = number_texts()
    vocab = ",\n".join(f'["<unk>", 0.0]' if i == 0 else f'["p{i}", {t}]' for i, t in enumerate(["0"] + texts))
    doc = ('{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,'
           ' "pre_tokenizer": null, "post_processor": null, "decoder": null,'
           ' "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": false, "vocab": [\n' + vocab + "\n]}}")
    path = os.path.join(args.out, "tokenizer.json")
    with open(path, "w") as f:
        f.write(doc)
    back = json.loads(Tokenizer.from_file(path).to_str())["model"]["vocab"][1:]
    parsed = [float(s) for _, s in back]
    off = sum(1 for t, v in zip(texts, parsed) if float(t) != v)
    with open(os.path.join(args.out, "numbers.json"), "w") as f:
        json.dump({"tokenizer": path, "texts": texts, "parsed": [v.hex() for v in parsed]}, f)
    print(f"{len(texts)} numbers; the library reads {off} of them other than correctly rounded")


if __name__ == "__main__":
    main()
