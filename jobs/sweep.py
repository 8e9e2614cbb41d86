"""`ray job submit -- python jobs/sweep.py ray.address=auto stage=stage2 rl.mined=...
stage.redundancy_margin=0,1,2`: train one stage per combination, concurrently on the cluster
(``hydra/launcher=ray``), and end with the sweep's comparison table (``sweep.md``)."""

import sys

from ctxpick.cli import main

if __name__ == "__main__":
    main(["train", "--multirun", "hydra/launcher=ray", *sys.argv[1:]])
