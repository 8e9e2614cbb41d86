"""`ray job submit -- python jobs/mine.py ray.address=auto [overrides]`: evidence mining."""

import sys

from ctxpick.cli import main

if __name__ == "__main__":
    main(["mine", *sys.argv[1:]])
