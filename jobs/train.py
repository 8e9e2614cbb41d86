"""`ray job submit -- python jobs/train.py ray.address=auto stage=stage1 [overrides]`: train one
picker stage (warmup | stage1 | stage2)."""

import sys

from ctxpick.cli import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
