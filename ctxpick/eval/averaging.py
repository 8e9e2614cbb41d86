"""What an average over datasets is over: the same datasets for every method compared."""

from __future__ import annotations

from dataclasses import dataclass

# A reference, not a compared method: it exists only where a dataset annotates gold evidence.
REFERENCE = "oracle"


def _top_k(label: str) -> bool:
    """A Top-K row (``bm25@5``): ``eval.topk_by_dataset`` may run other Ks on some datasets."""
    return label.partition("@")[2].isdigit()


@dataclass(frozen=True)
class Averaging:
    """Which datasets each method's average is over: the same ones for every method, so two
    averages always compare like with like. They are the datasets every compared method
    has. A Top-K row that ``eval.topk_by_dataset`` does not run everywhere does not narrow them
    (else ``locomo: [100]`` would leave no dataset to average over): it gets no average
    instead. The oracle does not narrow them either; its average is over those it has."""

    common: list[str]
    present: dict[str, set[str]]  # method -> the datasets it has

    @classmethod
    def of(cls, pairs: set[tuple[str, str]], methods: list[str]) -> Averaging:
        """``pairs``: the (dataset, method) pairs with results."""
        present = {m: {d for d, x in pairs if x == m} for m in methods}
        present = {m: ds for m, ds in present.items() if ds}
        every = set().union(*present.values())
        compared = [m for m in present if m != REFERENCE]
        narrowing = [present[m] for m in compared if not _top_k(m)] or [
            present[m] for m in compared
        ]
        return cls(sorted(set.intersection(*narrowing) if narrowing else every), present)

    def over(self, method: str) -> list[str]:
        """The datasets of ``method``'s average: the common ones, or none if it lacks one of
        them (the oracle: the common ones it has)."""
        has = self.present.get(method, set())
        if method == REFERENCE:
            return [d for d in self.common if d in has]
        return self.common if set(self.common) <= has else []

    def note(self) -> str:
        """The line under a table that says what its averages are over."""
        text = f"Averages over {', '.join(self.common) or 'no dataset'}"
        compared = [m for m in self.present if m != REFERENCE]
        left = sorted(set().union(*self.present.values()) - set(self.common))
        if left:
            missing = [
                f"{d} (no {', '.join(m for m in compared if d not in self.present[m])})"
                for d in left
            ]
            text += f": the datasets every method has; left out: {'; '.join(missing)}"
        unaveraged = [m for m in compared if not self.over(m)]
        if unaveraged and self.common:
            text += f". No average (not run on all of them): {', '.join(unaveraged)}"
        if REFERENCE in self.present and self.over(REFERENCE) != self.common:
            over = ", ".join(self.over(REFERENCE)) or "none"
            text += f". {REFERENCE}: over {over} (gold evidence)"
        return text + "."
