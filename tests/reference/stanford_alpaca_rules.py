"""The parts of stanford_alpaca's train.py the tokenizer references share: the prompt templates,
the label value of masked tokens, how a record becomes its source text, and the special-token rule
(smart_tokenizer_and_embedding_resize's dict). Standard library only: the transformers 4.28.1 venv
(slow_llama_428_reference.py) imports it as well as the main one."""

IGNORE_INDEX = -100
PROMPT_DICT = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}


def alpaca_sources(records):
    """train.py's sources: the input prompt when a record has a non-empty input, else the other."""
    return [PROMPT_DICT["prompt_input"].format_map(r) if r.get("input", "") != ""
            else PROMPT_DICT["prompt_no_input"].format_map(r) for r in records]


def train_py_rule(tok):
    """smart_tokenizer_and_embedding_resize's special_tokens_dict: pad, eos, bos, unk when missing.
    Returns the dict and how many tokens add_special_tokens added."""
    special = {}
    if tok.pad_token is None:
        special["pad_token"] = "[PAD]"
    if tok.eos_token is None:
        special["eos_token"] = "</s>"
    if tok.bos_token is None:
        special["bos_token"] = "<s>"
    if tok.unk_token is None:
        special["unk_token"] = "<unk>"
    n = tok.add_special_tokens(special)
    return special, n
