"""Checks our checkpoint bookkeeping against transformers' own code (called by tests/ckpt).

  rotate <dir> <limit> [best]   runs transformers.trainer_utils.rotate_checkpoints(use_mtime=False)
                                on <dir> and prints the remaining checkpoint names, one per line
  state <trainer_state.json>    loads it with transformers.TrainerState.load_from_json and prints
                                global_step, max_steps, len(log_history), the last log entry
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> int:
    cmd = sys.argv[1]
    if cmd == "rotate":
        from transformers.trainer_utils import rotate_checkpoints

        out_dir, limit = sys.argv[2], int(sys.argv[3])
        best = os.path.join(out_dir, sys.argv[4]) if len(sys.argv) > 4 else None
        rotate_checkpoints(out_dir, save_total_limit=limit, best_model_checkpoint=best, use_mtime=False)
        for name in sorted(os.listdir(out_dir)):
            print(name)
        return 0
    if cmd == "state":
        from transformers import TrainerState

        s = TrainerState.load_from_json(sys.argv[2])
        print(json.dumps({"global_step": s.global_step, "max_steps": s.max_steps,
                          "num_logs": len(s.log_history), "last": s.log_history[-1] if s.log_history else None,
                          "epoch": s.epoch}, sort_keys=True))
        return 0
    print(f"unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
