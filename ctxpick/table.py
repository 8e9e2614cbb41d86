"""Markdown tables for the reports the jobs print and write."""

from __future__ import annotations


def markdown_table(rows: list[list[str]]) -> str:
    """``rows[0]`` is the header; columns are padded so the table also reads as plain text."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
