"""Reads one of our sharded checkpoints (checkpoint-N/sharded, written by 2 ranks) with torch's
own DCP Hugging Face storage and compares the model tensors with our HF export.

usage: read_dcp_checkpoint.py SHARDED_DIR HF_EXPORT_SAFETENSORS WORK_DIR

1. torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files (one
   process, no process group) merges the per-rank files into WORK_DIR/consolidated.
2. HuggingFaceStorageReader.read_metadata() lists every tensor with its global shape and chunks,
   and torch.distributed.checkpoint.load(..., no_dist=True) fills a state dict from them.
Both must equal the export bitwise. Exit 0 on success.
"""
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files


def main() -> int:
    sharded, export, work = sys.argv[1:4]
    ours = load_file(export)
    reader = HuggingFaceStorageReader(sharded)
    meta = reader.read_metadata()
    names = sorted(meta.state_dict_metadata)
    assert names == sorted(ours), f"tensor names differ: {sorted(set(names) ^ set(ours))}"
    chunks = sum(len(m.chunks) for m in meta.state_dict_metadata.values())

    out = os.path.join(work, "consolidated")
    os.makedirs(out, exist_ok=True)
    consolidate_safetensors_files(sharded, out, fqn_to_index_mapping={n: 1 for n in names})
    merged = load_file(os.path.join(out, "model-00001-of-00001.safetensors"))
    for n in names:
        assert torch.equal(merged[n], ours[n]), f"consolidated {n} differs from the export"

    state = {n: torch.empty(tuple(meta.state_dict_metadata[n].size), dtype=ours[n].dtype) for n in names}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(sharded), no_dist=True)
    for n in names:
        assert torch.equal(state[n], ours[n]), f"dcp.load {n} differs from the export"
    print(f"torch read {len(names)} tensors from {chunks} chunks: consolidate_safetensors_files and "
          f"dcp.load(HuggingFaceStorageReader, no_dist=True) equal the HF export")
    return 0


if __name__ == "__main__":
    sys.exit(main())
