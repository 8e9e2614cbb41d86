"""Training/validation prompts for the picker, built from the mined dataset.

Each kept question and each of its rewrites becomes one :class:`PickerExample`, its passages
ordered as ``rl.pool_order`` says:

* ``pool``: the mining pool's first ``max_passages``, in its rank. When mining queries the
  question as the inference retriever does, this is what the picker will be shown at inference,
  in the same order, so it trains on the task it is used for and may use the retriever's rank.
  A question whose mined set is not all among them is dropped: its target cannot be picked.
* ``shuffle``: every mined passage kept, then the best-ranked others, shuffled per example. For
  pools ranked with the answer (question_answer), whose order would leak it.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxpick.data.schema import Passage
from ctxpick.picker.format import Pick


@dataclass(frozen=True)
class PickerExample:
    id: str
    source_id: str  # the original question's id (rewrites share it)
    dataset: str
    question: str
    answers: tuple[str, ...]
    passages: tuple[Passage, ...]
    gold: tuple[int, ...]  # 1-based positions of the mined minimal set in ``passages``
    split: str
    human_gold: tuple[int, ...] = ()  # positions of the dataset's own evidence, where it has one


def truncate_words(text: str, max_words: int) -> str:
    words = text.split()
    return text if len(words) <= max_words else " ".join(words[:max_words]) + " ..."


def shown(p: Passage, max_words: int) -> Passage:
    """A passage as the picker sees it: its text cut to ``max_words`` words (training and
    inference show the same thing)."""
    return Passage(p.pid, p.doc_index, p.start, p.end, truncate_words(p.text, max_words), p.title)


# Fields a kept mined record must have, with their JSON types (see ctxpick/mining/job.py).
_RECORD_FIELDS = {
    "id": str,
    "dataset": str,
    "question": str,
    "answers": list,
    "pool": list,
    "gold_minimal": list,
    "split": str,
}
SPLITS = ("train", "val", "test")


def check_record(rec: object) -> None:
    """Raise ``ValueError`` naming the first missing or mistyped field of a mined record."""
    if not isinstance(rec, dict):
        raise ValueError(f"a record is a JSON object, not {type(rec).__name__}")
    if not rec.get("kept"):
        return
    for name, kind in _RECORD_FIELDS.items():
        if name not in rec:
            raise ValueError(f"field {name!r} is missing")
        if not isinstance(rec[name], kind):
            raise ValueError(f"field {name!r} is {type(rec[name]).__name__}, not {kind.__name__}")
    if rec["split"] not in SPLITS:
        raise ValueError(f"field 'split' is {rec['split']!r}, not one of {SPLITS}")
    pids = set()
    for i, p in enumerate(rec["pool"]):
        for name in ("pid", "text"):
            if not isinstance(p, dict) or not isinstance(p.get(name), str):
                raise ValueError(f"field 'pool[{i}].{name}' is missing or not a string")
        pids.add(p["pid"])
    for name in ("gold_minimal", "human_gold"):
        unknown = [pid for pid in rec.get(name) or () if pid not in pids]
        if unknown:
            raise ValueError(f"field {name!r} names passages not in the pool: {unknown}")
    if not isinstance(rec.get("rewrites", []), list):
        raise ValueError("field 'rewrites' is not a list")


def examples_from_record(
    rec: dict[str, Any], max_passages: int, seed: int, order: str = "pool"
) -> list[PickerExample]:
    """The picker examples of one mined record (none if mining discarded it, or, in ``pool``
    order, if its mined set is not all shown). Passages keep their full text:
    :class:`~ctxpick.picker.spec.PickerSpec` cuts them for the prompt, the same way at
    inference."""
    if not rec.get("kept"):
        return []
    gold_pids = list(rec["gold_minimal"])
    if len(gold_pids) > max_passages:
        raise ValueError(
            f"record {rec['id']}: mined set of {len(gold_pids)} passages exceeds "
            f"picker.max_passages={max_passages}"
        )
    human = set(rec.get("human_gold") or ())
    if order == "pool":
        chosen = rec["pool"][:max_passages]
        if not set(gold_pids) <= {p["pid"] for p in chosen}:
            return []
    else:
        # Mined passages first, then the human evidence, then the best-ranked others.
        rank = {p["pid"]: (p["pid"] not in gold_pids, p["pid"] not in human) for p in rec["pool"]}
        chosen = sorted(rec["pool"], key=lambda p: rank[p["pid"]])[:max_passages]
    out = []
    for k, question in enumerate([rec["question"], *rec.get("rewrites", [])]):
        passages_in = list(chosen)
        if order == "shuffle":
            random.Random(f"{seed}:{rec['id']}:{k}").shuffle(passages_in)
        passages = tuple(
            Passage(p["pid"], 0, 0, 0, p["text"], p.get("title", "")) for p in passages_in
        )
        gold = tuple(sorted(i + 1 for i, p in enumerate(passages_in) if p["pid"] in gold_pids))
        human_gold = tuple(sorted(i + 1 for i, p in enumerate(passages_in) if p["pid"] in human))
        out.append(
            PickerExample(
                id=rec["id"] if k == 0 else f"{rec['id']}#rw{k}",
                source_id=rec["id"],
                dataset=rec["dataset"],
                question=question,
                answers=tuple(rec["answers"]),
                passages=passages,
                gold=gold,
                split=rec["split"],
                human_gold=human_gold,
            )
        )
    return out


def load_picker_examples(
    mined_path: Path, max_passages: int, seed: int, order: str = "pool"
) -> dict[str, list[PickerExample]]:
    """``{split: examples}`` from a ``mined.jsonl``, validation and test without rewrites: they
    measure the picker on the original questions. A malformed record stops the load with its
    line number and the field at fault."""
    splits: dict[str, list[PickerExample]] = {s: [] for s in SPLITS}
    with Path(mined_path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
                check_record(rec)
                exs = examples_from_record(rec, max_passages, seed, order)
            except json.JSONDecodeError as err:
                raise ValueError(f"{mined_path}: line {n}: not JSON ({err})") from None
            except ValueError as err:
                raise ValueError(f"{mined_path}: line {n}: {err}") from None
            if exs:
                splits[rec["split"]].extend(exs if rec["split"] == "train" else exs[:1])
    return splits


# What a warm-start target's rationale says (stage.rationale), with the version of its targets:
# bumped when they change, so that a stage trained on the old ones is neither resumed nor
# returned as the new (see ctxpick/rl/stage_settings.py).
RATIONALES = {"titles": 1, "contributions": 2}
# Words a question shares with almost any passage: naming them says nothing about a passage.
_STOP = frozenset(
    "what which where when who whom whose why how does did was were are is the this that these "
    "those than then from with into onto about also have has had their there they them for and "
    "not but its both same other many much more most name named film song born".split()
)


def check_rationale(rationale: str) -> None:
    if rationale not in RATIONALES:
        raise ValueError(f"stage.rationale must be one of {tuple(RATIONALES)}, not {rationale!r}")


def warm_start_pick(ex: PickerExample, passage_words: int, *, rationale: str = "titles") -> Pick:
    """The supervised target of the optional warm start: the mined set together with the
    dataset's own evidence (no teacher model is needed). The union teaches the format and a
    recall-first habit for Stage I to refine and Stage II to compress: mined sets alone are
    often a single passage, and a picker copying them never samples a larger set for GRPO to
    compare. Its rationale names the chosen passages' titles, or (``contributions``) what each
    adds in the ``passage_words`` the picker is shown: see :func:`contributions`."""
    check_rationale(rationale)
    ids = tuple(sorted(set(ex.gold) | set(ex.human_gold)))
    if rationale == "contributions":
        return Pick(contributions(ex, ids, passage_words), ids)
    parts = [f"[{i}] {ex.passages[i - 1].title or 'this passage'}" for i in ids]
    return Pick(f"The answer needs {', '.join(parts)}.", ids)


def contributions(
    ex: PickerExample, ids: tuple[int, ...], passage_words: int, max_words: int = 6
) -> str:
    """A rationale saying what each chosen passage adds, from the record alone and from what
    the picker is shown of it (its title and first ``passage_words`` words): the question's
    words it is first to name, the chosen passage it leads to (its text names that one's
    title: the bridge of a multi-hop question) and the answer, where its text holds one. Read
    before the ids, it is meant to let the count follow from the question (one passage per
    hop) rather than from a dataset's usual size; measured, it has not (benchmarks/RESULTS.md)."""
    spelled: dict[str, str] = {}  # each word once, as first spelled, in the question's order
    for word in re.findall(r"\b\w[\w'-]*", ex.question):
        word = re.sub(r"'s?$", "", word)  # "Kneipp's", "Beatles'"
        if len(word) >= 4:
            spelled.setdefault(word.lower(), word)
    terms = [w for low, w in spelled.items() if low not in _STOP]
    answers = [a for a in ex.answers if a.strip() and a.lower() not in ("yes", "no")]
    bare = {j: _bare(ex.passages[j - 1].title) for j in ids}
    named: set[str] = set()
    parts = []
    for i in ids:
        p = ex.passages[i - 1]
        text = truncate_words(p.text, passage_words)
        new = [t for t in terms if _names(f"{p.title or ''} {text}", t, inflected=True)]
        new = [t for t in new if t.lower() not in named][:2]
        named |= {t.lower() for t in new}
        bits = [f"names {', '.join(new)}"] if new else []
        bits += [
            f"leads to [{j}]"
            for j in ids
            if bare[j] and bare[j] != bare[i] and _names(text, bare[j])
        ][:1]
        if answer := next((a for a in answers if _names(text, a)), None):
            bits.append(f"gives {truncate_words(answer, max_words)}")
        about = f"is about {truncate_words(p.title or 'this passage', 4)}"
        parts.append(f"[{i}] {'; '.join(bits) or about}")
    return ". ".join(parts) + "."


def _bare(title: str | None) -> str:
    """A title without its disambiguator, where what is left names one thing: text that names
    "Sebastian Kneipp (film)" says "Sebastian Kneipp"; but "It (2017 film)" stays whole, as
    "it" in a passage is no link to it."""
    bare = re.sub(r"\s*\([^()]*\)$", "", title or "")
    return bare if len(bare.split()) > 1 else title or ""


def _names(text: str, phrase: str, inflected: bool = False) -> bool:
    """``text`` holds ``phrase`` as words (case aside): "India" is not in "Indian", nor "2" in
    "1923", nor "come" in "comedy"; ``inflected`` also takes a plural or possessive ending, so
    "film" names "films" and "film's"."""
    end = r"(?:e?s|'s?)?(?!\w)" if inflected else r"(?!\w)"
    return re.search(rf"(?<!\w){re.escape(phrase.lower())}{end}", text.lower()) is not None
