"""Where the repository keeps what every floor may read: the Hydra configs and the bundled
samples (a module of its own so that no lower floor imports :mod:`ctxpick.config`)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
SAMPLES_DIR = Path(__file__).resolve().parent / "data" / "samples"
