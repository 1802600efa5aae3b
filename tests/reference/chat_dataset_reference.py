"""Reference for the dataset-format test (issue 28): the same rows in every file kind.

Builds five datasets from the first --num_records records of ../shared/data/alpaca/alpaca_5000.json
plus hand-written rows (system prompts, tool calls and results, tools schemas, unicode, empty
contents, per-message `train: false`, extra message keys, nulls):

  alpaca              the records as they are
  messages            {"messages": [system?, user, assistant], "tools"?}
  sharegpt            {"conversations": [{"from", "value"}], "system"?, "tools"? (a JSON string)}
  pc_text             {"prompt": str, "completion": str}
  pc_messages         {"prompt": [messages], "completion": [messages]}

and writes each as <name>.json (array), <name>.jsonl, <name>.parquet (pyarrow) and <name>_disk/
(`datasets.Dataset.save_to_disk`: Arrow IPC stream + dataset_info.json + state.json), split in
two for the multi-path case (<name>_a.jsonl + <name>_b.parquet). <name>.expected.json holds the
normalised rows computed here, independently of the C++ code: the template context as JSON text
(json.dumps(ensure_ascii=False, separators=(",", ":")): the C++ side must match it byte for byte,
key order included), the per-message train flags, prompt/completion texts, the Alpaca fields.
Normalisation rules (include/alpaca/data/conversation.h): null members dropped at every level,
"train" taken out of messages, ShareGPT tags mapped as LLaMA-Factory does.
"""
import argparse
import json
import os
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

datasets.disable_progress_bars()

SHAREGPT_ROLE = {"human": "user", "gpt": "assistant", "observation": "tool"}


def drop_nulls(v):
    if isinstance(v, dict):
        return {k: drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [drop_nulls(x) for x in v]
    return v


def norm_message(role, content, src, skip):
    m = {"role": role}
    if content is not None:
        m["content"] = drop_nulls(content)
    train = True
    for k, v in src.items():
        if k in skip or v is None:
            continue
        if k == "train":
            train = v
            continue
        m[k] = drop_nulls(v)
    return m, train


def dumps(ctx):
    return json.dumps(ctx, ensure_ascii=False, separators=(",", ":"))


def expected_row(fmt, row):
    e = {"format": fmt, "conversation_json": "", "train": [], "num_prompt_messages": 0,
         "prompt": "", "completion": "", "alpaca": None}
    if fmt == "alpaca":
        e["alpaca"] = [row["instruction"], row.get("input") or "", row["output"]]
        return e
    msgs, train = [], []
    if fmt == "messages":
        for m in row["messages"]:
            nm, t = norm_message(m["role"], m.get("content"), m, ("role", "content"))
            msgs.append(nm)
            train.append(t)
    elif fmt == "sharegpt":
        system = row.get("system")
        for m in row["conversations"]:
            if m["from"] == "system":
                system = m["value"]
                continue
            if m["from"] == "function_call":
                call = json.loads(m["value"])
                calls = [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                         for c in (call if isinstance(call, list) else [call])]
                src = dict(m)
                src["tool_calls"] = calls
                nm, t = norm_message("assistant", None, src, ("from", "value"))
            else:
                nm, t = norm_message(SHAREGPT_ROLE[m["from"]], m["value"], m, ("from", "value"))
            msgs.append(nm)
            train.append(t)
        if system is not None:
            msgs.insert(0, {"role": "system", "content": system})
            train.insert(0, True)
    elif fmt == "prompt_completion":
        if isinstance(row["prompt"], str):
            e["prompt"], e["completion"] = row["prompt"], row["completion"]
            return e
        for part in ("prompt", "completion"):
            for m in row[part]:
                nm, t = norm_message(m["role"], m.get("content"), m, ("role", "content"))
                msgs.append(nm)
                train.append(t)
            if part == "prompt":
                e["num_prompt_messages"] = len(msgs)
    ctx = {"messages": msgs}
    tools = row.get("tools")
    if tools is not None:
        ctx["tools"] = drop_nulls(json.loads(tools) if isinstance(tools, str) else tools)
    e["conversation_json"] = dumps(ctx)
    e["train"] = train
    return e


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SUM_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def user_text(r):
    return r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")


def build(records):
    msgs, share, pct, pcm = [], [], [], []
    for i, r in enumerate(records):
        system = [{"role": "system", "content": "You are a helpful assistant."}] if i % 3 == 0 else []
        msgs.append({"messages": system + [{"role": "user", "content": user_text(r)},
                                           {"role": "assistant", "content": r["output"]}]})
        conv = [{"from": "human", "value": user_text(r)}, {"from": "gpt", "value": r["output"]}]
        share.append({"conversations": conv, "system": "Be brief." if i % 4 == 0 else None})
        pct.append({"prompt": user_text(r), "completion": r["output"]})
        pcm.append({"prompt": [{"role": "user", "content": user_text(r)}],
                    "completion": [{"role": "assistant", "content": r["output"]}]})
    # Hand cases: tools and tool calls, unicode, empty contents, train: false, extra keys, nulls.
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
    msgs += [
        {"messages": [{"role": "system", "content": ""},
                      {"role": "user", "content": "Wetter in Zürich? 天気 🌦"},
                      {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "content": "{\"temp\": 21}", "name": "get_weather"},
                      {"role": "assistant", "content": "21 °C — schön."}],
         "tools": [WEATHER_TOOL, SUM_TOOL]},
        {"messages": [{"role": "user", "content": "first"},
                      {"role": "assistant", "content": "skip me", "train": False},
                      {"role": "user", "content": ""},
                      {"role": "assistant", "content": "", "train": True}]},
        {"messages": [{"role": "user", "content": "add 2 and 3"},
                      {"role": "assistant", "content": "",
                       "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                      {"role": "tool", "content": "5", "name": "add"},
                      {"role": "assistant", "content": "5"}],
         "tools": [SUM_TOOL]},
    ]
    share += [
        {"conversations": [{"from": "system", "value": "System from the first turn ✓"},
                           {"from": "human", "value": "Weather in Paris?"},
                           {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
                           {"from": "observation", "value": "{\"temp\": 18}"},
                           {"from": "gpt", "value": "18 degrees."}],
         "system": None, "tools": json.dumps([WEATHER_TOOL])},
        {"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "¿Qué? 😀"}],
         "system": None, "tools": None},
    ]
    pct += [{"prompt": "", "completion": "ünïcödé"}, {"prompt": "2+2=", "completion": ""}]
    pcm += [{"prompt": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi 👋"}],
             "completion": [{"role": "assistant", "content": "Hello!"}]}]
    alpaca = [dict(r) for r in records] + [{"instruction": "ünï", "input": "", "output": ""},
                                           {"instruction": "no input key", "output": "ok"}]
    return {"alpaca": ("alpaca", alpaca), "messages": ("messages", msgs), "sharegpt": ("sharegpt", share),
            "pc_text": ("prompt_completion", pct), "pc_messages": ("prompt_completion", pcm)}


def columns(rows):
    """Rows as columns over the union of their keys (pyarrow's from_pylist and datasets' from_list
    take the columns from the first row only and would drop a later row's "tools")."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def write_all(out, name, rows):
    (out / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1))
    with open(out / f"{name}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    pq.write_table(pa.Table.from_pydict(columns(rows)), out / f"{name}.parquet")
    datasets.Dataset.from_dict(columns(rows)).save_to_disk(str(out / f"{name}_disk"))
    half = len(rows) // 2
    with open(out / f"{name}_a.jsonl", "w") as f:
        for r in rows[:half]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    pq.write_table(pa.Table.from_pydict(columns(rows[half:])), out / f"{name}_b.parquet")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default=os.environ.get("ALPACA_SHARED_DIR",
                                                        str(Path(__file__).resolve().parents[3] / "shared")))
    ap.add_argument("--num_records", type=int, default=300)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(args.shared) / "data" / "alpaca" / "alpaca_5000.json"
    if not src.exists():
        (out / "SKIPPED").write_text(f"shared data not found: {src}")
        print(f"{src} not found; writing SKIPPED")
        return
    records = json.loads(src.read_text())[: args.num_records]
    for name, (fmt, rows) in build(records).items():
        write_all(out, name, rows)
        expected = [expected_row(fmt, r) for r in rows]
        (out / f"{name}.expected.json").write_text(json.dumps(expected, ensure_ascii=False))
        print(f"{name}: {len(rows)} rows ({fmt}) as json, jsonl, parquet, save_to_disk")
    write_csv_cases(out, build(records))


# Hand-written CSV: what a spreadsheet or a script writes (quoted commas, doubled quotes, newlines
# and CRLF inside quoted fields, a UTF-8 BOM, blank lines, missing cells, pandas' missing-value words,
# non-ASCII text, an extra column, cells that look like numbers in a column that also has text).
TRICKY_CSV = (
    "\ufeffinstruction,input,output,source\r\n"
    "Say hi,,hi there,web\r\n"
    "\"Add 2, and 2\",\"\",4,\r\n"
    "\"Quote \"\"this\"\"\",\"a, b\",\"multi\nline\r\nanswer\",x\r\n"
    "\r\n"
    "What is NA?,NA,the missing value,\r\n"
    "Price,n/a,3.50,\r\n"
    "Übersetze,\"  spaced  \",日本語,src\r\n"
    "Write null,null,None of it,\r\n"
)


# pandas.read_csv's missing-value words (pandas._libs.parsers.STR_NA_VALUES).
PANDAS_NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",
             "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}


def write_csv_cases(out, built):
    """<name>.csv written by pandas (DataFrame.to_csv, the usual way a CSV dataset is made) for the
    flat formats, and tricky.csv; each with <name>_csv.expected.json: the rows as Python's csv module
    reads them (every cell the text it is, an empty cell "") put through expected_row. They are
    datasets.load_dataset("csv")'s rows but where pandas makes a cell missing (an empty cell, "NA",
    "None", ...: None there), which the check below asserts cell by cell."""
    import csv
    import pandas as pd
    (out / "tricky.csv").write_bytes(TRICKY_CSV.encode("utf-8"))
    cases = {"tricky": "alpaca"}
    for name in ("alpaca", "pc_text"):
        fmt, rows = built[name]
        pd.DataFrame(columns(rows)).to_csv(out / f"{name}.csv", index=False)
        cases[name] = fmt
    for name, fmt in cases.items():
        with open(out / f"{name}.csv", newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
        read = list(datasets.load_dataset("csv", data_files=str(out / f"{name}.csv"), split="train"))
        assert len(read) == len(rows), name
        missing = 0
        for ours, theirs in zip(rows, read):
            for k, v in ours.items():
                assert theirs[k] == v or (theirs[k] is None and v in PANDAS_NA), (name, k, v, theirs[k])
                missing += theirs[k] is None
        expected = [expected_row(fmt, r) for r in rows]
        (out / f"{name}_csv.expected.json").write_text(json.dumps(expected, ensure_ascii=False))
        print(f"{name}.csv: {len(rows)} rows ({fmt}); datasets has {missing} of their cells missing")


if __name__ == "__main__":
    main()
