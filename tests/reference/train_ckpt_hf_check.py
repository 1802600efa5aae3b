"""Checks our checkpoint bookkeeping against transformers' own code (called by tests/ckpt).

  rotate <dir> <limit> <best|-> [<dir> <limit> <best|-> ...]
                                runs transformers.trainer_utils.rotate_checkpoints(use_mtime=False)
                                on each <dir> (best checkpoint name, or - for none) and prints what
                                remains in it, one <dir>/<name> per line (one Python start for all
                                the layouts: importing transformers is most of its time)
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

        args = sys.argv[2:]
        if not args or len(args) % 3:
            print("rotate needs <dir> <limit> <best|-> triples", file=sys.stderr)
            return 2
        for out_dir, limit, best in zip(args[0::3], args[1::3], args[2::3]):
            best = None if best == "-" else os.path.join(out_dir, best)
            rotate_checkpoints(out_dir, save_total_limit=int(limit), best_model_checkpoint=best, use_mtime=False)
            for name in sorted(os.listdir(out_dir)):
                print(os.path.join(out_dir, name))
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
