"""TensorBoard's own code as the reference for alpaca-train's event files (issue 20).

  framing FILE N...      FILE must hold one TFRecord per payload size N (payload byte j of record i
                         is (7*j + i) % 256), byte for byte what tensorboard's RecordWriter writes;
                         tensorboard's PyRecordReader (which checks both CRCs) must read it back.
  dump DIR               prints {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text]]},
                         "first_event": {...}, "ui_scalar_tags": [...], "ui_text_tags": [...]} as JSON,
                         read with EventAccumulator (and plugin_event_accumulator, which the
                         TensorBoard UI uses).
  compare DIR METRICS [--killed]
                         every number of every metrics.jsonl line must be an event with HF's tag
                         (transformers' rewrite_logs), the same step and the value as float32; the
                         args text must be there, and no other scalar (--killed: except after the
                         last logged step); prints a JSON summary, exits 1 on any mismatch.
Exits non-zero with a message on any difference.
"""
import glob
import io
import json
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow  # noqa: E402
from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402


def payload(i, n):
    return bytes((7 * j + i) % 256 for j in range(n))


def framing(path, sizes):
    expected = io.BytesIO()
    w = RecordWriter(expected)
    for i, n in enumerate(sizes):
        w.write(payload(i, n))
    got = open(path, "rb").read()
    if got != expected.getvalue():
        first = next((k for k, (a, b) in enumerate(zip(got, expected.getvalue())) if a != b), min(len(got), len(expected.getvalue())))
        sys.exit(f"framing differs from tensorboard's RecordWriter at byte {first} (sizes {len(got)} vs {len(expected.getvalue())})")
    reader = pywrap_tensorflow.PyRecordReader_New(path.encode(), 0, None, None)
    for i, n in enumerate(sizes):
        reader.GetNext()  # raises DataLossError on a bad CRC
        if reader.record() != payload(i, n):
            sys.exit(f"record {i} reads back different")
    print(json.dumps({"records": len(sizes), "bytes": len(got)}))


def event_files(d):
    files = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))
    if not files:
        sys.exit(f"no events.out.tfevents.* file in {d}")
    return files


def dump(d):
    files = event_files(d)
    first = next(iter(EventFileLoader(files[0]).Load()))
    acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = {}
    for t in tags["tensors"]:
        if acc.SummaryMetadata(t).plugin_data.plugin_name == "text":
            texts[t] = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()] for e in acc.Tensors(t)]
    ui = plugin_event_accumulator.EventAccumulator(d, size_guidance={plugin_event_accumulator.TENSORS: 0})
    ui.Reload()

    def ui_tags(plugin):
        try:
            return sorted(ui.PluginTagToContent(plugin))
        except KeyError:  # no tag of that plugin
            return []
    return {"files": [os.path.basename(f) for f in files],
            "first_event": {"file_version": first.file_version, "step": first.step, "wall_time": first.wall_time},
            "scalars": scalars, "texts": texts,
            "ui_scalar_tags": ui_tags("scalars"), "ui_text_tags": ui_tags("text")}


def compare(d, metrics_path, killed=False):
    from transformers.integrations.integration_utils import rewrite_logs

    got = dump(d)
    problems = []
    raw = [x for x in open(metrics_path) if x.strip()]
    if killed and raw and not raw[-1].endswith("\n"):
        raw.pop()  # killed mid-line: that line was not logged
    lines = [json.loads(x) for x in raw]
    # (tag, step) -> the values logged there, in order: HF's rewrite sends every log call's "epoch"
    # to train/epoch, so the last step can carry it more than once (train log, eval, final summary).
    want = {}
    for entry in lines:
        logs = {k: v for k, v in entry.items() if k != "step"}
        for tag, v in rewrite_logs(logs).items():
            want.setdefault((tag, entry["step"]), []).append(float("nan") if v is None else float(np.float32(v)))
    have = {}
    for tag, events in got["scalars"].items():
        for step, value in events:
            have.setdefault((tag, step), []).append(value)
    n = sum(len(v) for v in want.values())
    for key, values in sorted(want.items()):
        seen = have.get(key, [])
        same = len(seen) == len(values) and all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(seen, values))
        if not same:
            problems.append(f"{key[0]} at step {key[1]}: events {seen}, metrics.jsonl {values}")
    # A killed run may have written the event records of its last log call and died before the
    # metrics.jsonl line (events are written first): extra events only after the last logged step.
    last_step = max((e["step"] for e in lines), default=0)
    extra = [k for k in have if k not in want and not (killed and k[1] > last_step)]
    if extra:
        problems.append(f"events that metrics.jsonl does not have: {sorted(extra)[:5]}")
    args = got["texts"].get("args/text_summary", [])
    if len(args) != 1:
        problems.append(f"args/text_summary: {len(args)} events (want 1)")
    else:
        json.loads(args[0][1])  # the effective arguments as JSON
    if set(got["ui_scalar_tags"]) != set(got["scalars"]):
        problems.append(f"the UI's reader sees scalar tags {got['ui_scalar_tags']}")
    if got["first_event"]["file_version"] != "brain.Event:2":
        problems.append(f"first event is {got['first_event']}")
    summary = {"log_lines": len(lines), "values": n, "tags": sorted(got["scalars"]), "files": got["files"],
               "steps": sorted({e["step"] for e in lines}), "texts": sorted(got["texts"]), "problems": problems}
    print(json.dumps(jsonable(summary)))
    sys.exit(1 if problems else 0)


def jsonable(x):
    """Python's json writes NaN, which is not JSON; say "nan" instead."""
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [jsonable(v) for v in x]
    return x


def main():
    cmd = sys.argv[1]
    if cmd == "framing":
        framing(sys.argv[2], [int(x) for x in sys.argv[3:]])
    elif cmd == "dump":
        print(json.dumps(jsonable(dump(sys.argv[2]))))
    elif cmd == "compare":
        compare(sys.argv[2], sys.argv[3], killed="--killed" in sys.argv[4:])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
