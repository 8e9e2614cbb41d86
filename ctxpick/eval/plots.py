"""The accuracy-vs-tokens plot of an evaluation, one per dataset."""

from __future__ import annotations

from pathlib import Path

from ctxpick.eval.report import MethodResult


def plot_accuracy_vs_tokens(results: list[MethodResult], out_dir: Path) -> list[Path]:
    """One PNG per dataset: judged accuracy against mean context tokens, one point per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for dataset in sorted({r.dataset for r in results}):
        rs = [r for r in results if r.dataset == dataset]
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in rs:
            (alo, ahi), (tlo, thi) = r.accuracy_ci, r.context_tokens_ci
            ax.errorbar(
                r.context_tokens,
                100 * r.accuracy,
                xerr=[[r.context_tokens - tlo], [thi - r.context_tokens]],
                yerr=[[100 * (r.accuracy - alo)], [100 * (ahi - r.accuracy)]],
                fmt="o",
                markersize=4,
                capsize=2,
                elinewidth=0.8,
            )
            ax.annotate(
                r.method,
                (r.context_tokens, 100 * r.accuracy),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.set_xlabel("mean context tokens sent to the generator")
        ax.set_ylabel("judged accuracy (%), 95% CI")
        ax.set_title(f"{dataset}: accuracy vs context ({rs[0].questions} questions)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"accuracy_vs_tokens_{dataset}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths
