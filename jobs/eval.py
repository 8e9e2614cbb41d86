"""`ray job submit -- python jobs/eval.py ray.address=auto data.path=FILE [overrides]`: every
configured method on a dataset (pickers via `+eval.pickers.NAME=FOLDER`)."""

import sys

from ctxpick.cli import main

if __name__ == "__main__":
    main(["eval", *sys.argv[1:]])
