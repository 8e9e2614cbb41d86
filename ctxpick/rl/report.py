"""Training curves and the numbers the two-stage recipe is judged by."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

from ctxpick.table import markdown_table


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def stage_summary(name: str, steps: list[dict[str, Any]], window: int = 5) -> list[str]:
    """First and last ``window`` steps: reward, coverage of the mined set, mean |S|, valid."""
    grpo = [s for s in steps if "reward" in s]
    if not grpo:
        final_loss = steps[-1]["loss"] if steps else float("nan")
        return [name, str(len(steps)), "-", "-", "-", "-", "-", f"loss {final_loss:.3f}"]
    first, last = grpo[:window], grpo[-window:]

    def m(rows: list[dict[str, Any]], key: str) -> float:
        return mean(r[key] for r in rows)

    return [
        name,
        str(len(grpo)),
        f"{m(first, 'reward'):+.3f}",
        f"{m(last, 'reward'):+.3f}",
        f"{m(last, 'coverage'):.2f}",
        f"{m(last, 'mean_size'):.2f}",
        f"{m(last, 'format_valid'):.0%}",
        f"val {grpo[-1]['val/reward']:+.3f}" if "val/reward" in grpo[-1] else "",
    ]


def training_table(stages: dict[str, Path], window: int = 5) -> str:
    header = [
        "stage",
        "steps",
        f"reward (first {window})",
        f"reward (last {window})",
        f"coverage (last {window})",
        f"passages picked (last {window})",
        "format valid",
        "final",
    ]
    rows = [stage_summary(n, read_metrics(p), window) for n, p in stages.items() if p.exists()]
    return markdown_table([header, *rows])


def plot_training(stages: dict[str, Path], out: Path) -> Path:
    """Reward and mean |S| per step, stages laid end to end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.8))
    offset = 0
    for name, path in stages.items():
        steps = [s for s in read_metrics(path) if "reward" in s] if path.exists() else []
        if not steps:
            continue
        x = [offset + s["step"] for s in steps]
        ax_r.plot(x, [s["reward"] for s in steps], marker=".", label=f"{name} (train)")
        val = [(offset + s["step"], s["val/reward"]) for s in steps if "val/reward" in s]
        if val:
            ax_r.plot(*zip(*val, strict=True), "o--", label=f"{name} (val)")
        ax_s.plot(x, [s["mean_size"] for s in steps], marker=".", label=name)
        offset = x[-1]
    ax_r.set(xlabel="GRPO step", ylabel="mean reward", title="reward")
    ax_s.set(xlabel="GRPO step", ylabel="passages picked", title="mean |S| (valid outputs)")
    for ax in (ax_r, ax_s):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
