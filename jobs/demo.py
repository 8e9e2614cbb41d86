"""`ray job submit -- python jobs/demo.py [overrides]`: the main job on a running cluster."""

import sys

from ctxpick.cli import main

if __name__ == "__main__":
    main(["demo", *sys.argv[1:]])
