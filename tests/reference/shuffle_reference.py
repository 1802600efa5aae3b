"""Reference for tests/data/test_shuffle: datasets' Dataset.shuffle(seed) and TRL's shuffle_dataset.

Writes --out/shuffle.json:
  "permutations": [{"seed", "n", "perm"}]: np.random.default_rng(seed).permutation(n), and
                  "datasets": the row order Dataset.from_dict({"i": range(n)}).shuffle(seed=seed) gives;
  "trl": TRL SFTTrainer._prepare_dataset's order with shuffle_dataset (trl 1.16): the rows shuffled with
         args.seed, packed by trl.pack_dataset (bfd and wrapped, 48-token blocks), shuffled again, then
         collated as SFTTrainer collates them (padding_free for bfd); "rows" the input rows.
"""
import argparse
import json
import os
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import numpy as np
    from datasets import Dataset
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    perms = []
    for seed, n in [(42, 10), (0, 1), (0, 2), (1, 1000), (7, 5000), (2**32 - 1, 300), (2**32, 300),
                    (123456789012345, 777), (2**64 - 1, 50), (42, 65537)]:
        perm = np.random.default_rng(seed).permutation(n).tolist()
        order = Dataset.from_dict({"i": list(range(n))}).shuffle(seed=seed)["i"]
        perms.append({"seed": str(seed), "n": n, "perm": perm, "datasets": list(order)})

    rng = random.Random(28)
    rows = {"input_ids": [], "labels": []}
    for i in range(700):
        ids = [i * 100 + t for t in range(rng.randint(1, 70))]
        rows["input_ids"].append(ids)
        rows["labels"].append([-100 if rng.random() < 0.3 else x for x in ids])
    seed, seq_length = 42, 48
    trl = {"seed": seed, "seq_length": seq_length, "rows": rows, "packed": {}}
    for strategy in ("bfd", "wrapped"):
        ds = Dataset.from_dict(rows).shuffle(seed=seed)  # _prepare_dataset: before packing
        ds = pack_dataset(ds, seq_length, strategy, {})
        ds = ds.shuffle(seed=seed)  # and after
        collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=strategy == "bfd")
        blocks = []
        for ex in ds:
            b = collator([ex])
            blocks.append({k: b[k][0].tolist() for k in ("input_ids", "labels", "position_ids") if k in b})
        trl["packed"][strategy] = blocks
    with open(os.path.join(args.out, "shuffle.json"), "w") as f:
        json.dump({"permutations": perms, "trl": trl}, f)
    print(f"{len(perms)} permutations; TRL shuffle + pack + shuffle: "
          + ", ".join(f"{k} {len(v)} blocks" for k, v in trl["packed"].items()))


if __name__ == "__main__":
    main()
