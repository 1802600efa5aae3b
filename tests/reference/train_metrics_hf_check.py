"""Prints what transformers computes for the metrics our trainer reports (tests/train/test_metrics).

  speed <runtime> <num_samples> <num_steps>   -> json of transformers.trainer_utils.speed_metrics
"""
import json
import os
import sys
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    if sys.argv[1] == "speed":
        from transformers.trainer_utils import speed_metrics

        runtime, samples, steps = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
        with mock.patch("time.time", return_value=1000.0 + runtime):
            print(json.dumps(speed_metrics("train", 1000.0, num_samples=samples, num_steps=steps), sort_keys=True))
        return 0
    print("unknown command", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
