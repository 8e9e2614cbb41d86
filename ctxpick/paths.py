"""Where the repository keeps what every floor may read: the Hydra configs and the bundled
samples (a module of its own so that no lower floor imports :mod:`ctxpick.config`), and the
one way a file's content is fingerprinted (pinned model files, evaluation record keys)."""

import hashlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
SAMPLES_DIR = Path(__file__).resolve().parent / "data" / "samples"


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
