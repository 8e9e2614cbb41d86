"""Loaders for the supported benchmarks in their upstream formats, all producing
:class:`~ctxpick.data.schema.Example`.

Every parser turns one upstream record into examples or raises :class:`RecordProblem`; the
driver :func:`load_examples` adds file and locator and either fails (``strict``) or records
the reject. Nothing is skipped silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxpick.data.errors import DataError, RecordProblem, Reject
from ctxpick.data.readers import UnparsableRecord, read_records
from ctxpick.data.schema import Document, Evidence, Example

# LoCoMo category 5 questions are adversarial: the correct answer is that the conversation
# does not say.
UNANSWERABLE = "Not mentioned in the conversation"

Parsed = Iterator["Example | Reject"]


def _require(rec: dict[str, Any], *fields: str) -> None:
    missing = [f for f in fields if f not in rec or rec[f] is None]
    if missing:
        raise RecordProblem(f"missing field(s) {', '.join(map(repr, missing))}")


def _rid(rec: Any, *keys: str) -> str:
    if isinstance(rec, dict):
        for k in keys:
            if isinstance(rec.get(k), str | int):
                return str(rec[k])
    return ""


def _answer_list(value: Any, what: str = "answer") -> list[str]:
    values = value if isinstance(value, list) else [value]
    answers = [str(v).strip() for v in values if v is not None and str(v).strip()]
    if not answers:
        raise RecordProblem(f"empty {what}")
    return answers


def _sentence_doc(doc_id: str, title: str, sentences: list[str]) -> Document:
    starts, pos = [], 0
    for s in sentences:
        starts.append(pos)
        pos += len(s)
    return Document(doc_id, "".join(sentences), title, tuple(starts))


# --- HotpotQA / 2WikiMultihopQA (title + sentence lists, sentence-level supporting facts) ---


def _parse_title_sentences(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    _require(rec, "_id", "question", "answer", "context")
    rid = str(rec["_id"])
    context = rec["context"]
    if not isinstance(context, list) or not context:
        raise RecordProblem("empty context", rid)
    docs, sent_spans = [], []
    for i, para in enumerate(context):
        if not (isinstance(para, list) and len(para) == 2 and isinstance(para[1], list)):
            raise RecordProblem(f"context[{i}] is not [title, [sentences]]", rid)
        title, sentences = str(para[0]), [str(s) for s in para[1]]
        doc = _sentence_doc(f"d{i}", title, sentences)
        docs.append(doc)
        ends = list(doc.sentence_starts[1:]) + [len(doc.text)]
        sent_spans.append(list(zip(doc.sentence_starts, ends, strict=True)))
    if not any(d.text.strip() for d in docs):
        raise RecordProblem("empty context", rid)
    by_title: dict[str, int] = {}
    for i, d in enumerate(docs):
        by_title.setdefault(d.title, i)
    facts = rec.get("supporting_facts") or []
    evidence = []
    for fact in facts:
        if not (isinstance(fact, list) and len(fact) == 2):
            raise RecordProblem(f"malformed supporting fact {fact!r}", rid)
        title, idx = fact
        if title not in by_title:
            continue  # fullwiki: the supporting page was not retrieved into the context
        di = by_title[title]
        if not isinstance(idx, int) or not 0 <= idx < len(sent_spans[di]):
            raise RecordProblem(
                f"supporting fact {fact!r} does not resolve: paragraph {title!r} has "
                f"{len(sent_spans[di])} sentences",
                rid,
            )
        start, end = sent_spans[di][idx]
        evidence.append(Evidence(di, start, end))
    meta = {k: rec[k] for k in ("type", "level") if k in rec}
    yield Example(
        id=rid,
        dataset=dataset,
        question=str(rec["question"]),
        answers=_answer_list(rec["answer"]),
        documents=docs,
        evidence=evidence if facts else None,
        gold_units=len(facts),
        gold_resolved=len(evidence),
        meta=meta,
    )


# --- paragraph lists with is_supporting: MuSiQue and IRCoT-processed files ---


def _parse_paragraphs(
    rid: str,
    paragraphs: Any,
    text_key: str,
) -> tuple[list[Document], list[Evidence], int]:
    if not isinstance(paragraphs, list) or not paragraphs:
        raise RecordProblem("empty context", rid)
    docs, evidence, units = [], [], 0
    for i, p in enumerate(paragraphs):
        if not isinstance(p, dict) or text_key not in p:
            raise RecordProblem(f"paragraph {i} has no {text_key!r}", rid)
        docs.append(Document(f"d{p.get('idx', i)}", str(p[text_key]), str(p.get("title", ""))))
        if p.get("is_supporting"):
            units += 1
            evidence.append(Evidence(i, 0, len(docs[-1].text)))
    if not any(d.text.strip() for d in docs):
        raise RecordProblem("empty context", rid)
    return docs, evidence, units


def _parse_musique(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    if "question_text" in rec:
        yield from _parse_ircot(rec, dataset)
        return
    _require(rec, "id", "question", "answer", "paragraphs")
    rid = str(rec["id"])
    docs, evidence, units = _parse_paragraphs(rid, rec["paragraphs"], "paragraph_text")
    for step in rec.get("question_decomposition") or []:
        idx = step.get("paragraph_support_idx")
        if idx is not None and not 0 <= idx < len(docs):
            raise RecordProblem(f"paragraph_support_idx {idx} out of range", rid)
    answerable = bool(rec.get("answerable", True))
    yield Example(
        id=rid,
        dataset=dataset,
        question=str(rec["question"]),
        answers=_answer_list([rec["answer"], *(rec.get("answer_aliases") or [])]),
        documents=docs,
        evidence=evidence if answerable else None,
        gold_units=units,
        gold_resolved=units,
        meta={"hops": rid.split("__")[0], "unanswerable": not answerable},
    )


def _ircot_answers(objs: Any) -> list[str]:
    out: list[str] = []
    for obj in objs or []:
        out += [str(s) for s in obj.get("spans") or [] if str(s).strip()]
        if str(obj.get("number") or "").strip():
            out.append(str(obj["number"]))
        date = obj.get("date") or {}
        parts = [str(date.get(k) or "").strip() for k in ("day", "month", "year")]
        if any(parts):
            out.append(" ".join(p for p in parts if p))
    return out


def _parse_ircot(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    _require(rec, "question_id", "question_text", "answers_objects", "contexts")
    rid = str(rec["question_id"])
    docs, evidence, units = _parse_paragraphs(rid, rec["contexts"], "paragraph_text")
    answers = _ircot_answers(rec["answers_objects"])
    if not answers:
        raise RecordProblem("empty answers_objects", rid)
    yield Example(
        id=rid,
        dataset=dataset,
        question=str(rec["question_text"]),
        answers=answers,
        documents=docs,
        evidence=evidence,
        gold_units=units,
        gold_resolved=units,
        meta={k: rec[k] for k in ("level", "type") if rec.get(k) is not None},
    )


def _parse_hotpot_like(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    if "question_text" in rec:
        return _parse_ircot(rec, dataset)
    return _parse_title_sentences(rec, dataset)


# --- LoCoMo: a conversation whose turns are the passages, one example per QA ---

_SESSION = re.compile(r"^session_(\d+)$")


def _parse_locomo(rec: dict[str, Any], dataset: str) -> Iterator[Example | Reject]:
    _require(rec, "sample_id", "conversation", "qa")
    cid = str(rec["sample_id"])
    conv = rec["conversation"]
    docs: list[Document] = []
    index: dict[str, int] = {}
    sessions = sorted((int(m.group(1)), k) for k in conv if (m := _SESSION.match(k)) and conv[k])
    for num, key in sessions:
        when = conv.get(f"session_{num}_date_time", "")
        for turn in conv[key]:
            if not all(k in turn for k in ("speaker", "dia_id", "text")):
                raise RecordProblem(f"{key} has a turn without speaker/dia_id/text", cid)
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            index[turn["dia_id"]] = len(docs)
            docs.append(Document(turn["dia_id"], text, f"session {num}, {when}".strip(", ")))
    if not docs:
        raise RecordProblem("conversation has no turns", cid)
    for qi, qa in enumerate(rec["qa"]):
        qid = f"{cid}/q{qi}"
        try:
            yield _locomo_example(qa, qid, docs, index, dataset)
        except RecordProblem as err:
            yield Reject("", f"qa[{qi}]", qid, err.problem)


def _locomo_example(
    qa: dict[str, Any], qid: str, docs: list[Document], index: dict[str, int], dataset: str
) -> Example:
    _require(qa, "question", "category")
    category = int(qa["category"])
    if category == 5:
        answers = [UNANSWERABLE]
    else:
        _require(qa, "answer")
        answers = _answer_list(qa["answer"])
    ids = [e.strip() for ev in qa.get("evidence") or [] for e in str(ev).split(";") if e.strip()]
    bad = [e for e in ids if e not in index]
    if bad:
        raise RecordProblem(f"evidence id(s) {bad} do not resolve to a dialogue turn", qid)
    evidence = [Evidence(index[e], 0, len(docs[index[e]].text)) for e in ids]
    meta: dict[str, Any] = {"category": category, "unanswerable": category == 5}
    if "adversarial_answer" in qa:
        meta["adversarial_answer"] = qa["adversarial_answer"]
    return Example(
        corpus_id=qid.split("/")[0],
        id=qid,
        dataset=dataset,
        question=str(qa["question"]),
        answers=answers,
        documents=docs,
        evidence=evidence if ids else None,
        gold_units=len(ids),
        gold_resolved=len(ids),
        meta=meta,
    )


# --- LongBench MultiFieldQA-en: one long document, no gold evidence ---


def _parse_longbench(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    _require(rec, "_id", "input", "context", "answers")
    rid = str(rec["_id"])
    if not str(rec["context"]).strip():
        raise RecordProblem("empty context", rid)
    yield Example(
        id=rid,
        dataset=dataset,
        question=str(rec["input"]),
        answers=_answer_list(rec["answers"], "answers"),
        documents=[Document("d0", str(rec["context"]))],
        evidence=None,
        meta={"length": rec.get("length")},
    )


# --- generic JSONL for users' own data (documented in README) ---


def _parse_generic(rec: dict[str, Any], dataset: str) -> Iterator[Example]:
    _require(rec, "id", "question", "answers", "passages")
    rid = str(rec["id"])
    passages = rec["passages"]
    if not isinstance(passages, list) or not passages:
        raise RecordProblem("empty passages", rid)
    docs = []
    for i, p in enumerate(passages):
        p = {"text": p} if isinstance(p, str) else p
        if not isinstance(p, dict) or not str(p.get("text", "")).strip():
            raise RecordProblem(f"passages[{i}] has no text", rid)
        docs.append(Document(str(p.get("id", f"d{i}")), str(p["text"]), str(p.get("title", ""))))
    index = {d.doc_id: i for i, d in enumerate(docs)}
    if len(index) != len(docs):
        raise RecordProblem("duplicate passage ids", rid)
    gold = rec.get("gold")
    evidence = None
    if gold is not None:
        bad = [g for g in gold if str(g) not in index]
        if bad:
            raise RecordProblem(f"gold id(s) {bad} are not passage ids", rid)
        evidence = [Evidence(index[str(g)], 0, len(docs[index[str(g)]].text)) for g in gold]
    return_meta = rec.get("meta") or {}
    yield Example(
        id=rid,
        dataset=dataset,
        question=str(rec["question"]),
        answers=_answer_list(rec["answers"], "answers"),
        documents=docs,
        evidence=evidence,
        gold_units=len(evidence or []),
        gold_resolved=len(evidence or []),
        meta=dict(return_meta),
    )


Parser = Callable[[dict[str, Any], str], Iterator["Example | Reject"]]

FORMATS: dict[str, Parser] = {
    "hotpotqa": _parse_hotpot_like,
    "2wikimultihopqa": _parse_hotpot_like,
    "musique": _parse_musique,
    "ircot": _parse_ircot,
    "locomo": _parse_locomo,
    "multifieldqa_en": _parse_longbench,
    "jsonl": _parse_generic,
}


def detect_format(record: dict[str, Any]) -> str:
    """Guess a format from one record's keys (``--format auto``)."""
    keys = set(record)
    if {"sample_id", "conversation", "qa"} <= keys:
        return "locomo"
    if "question_text" in keys and "contexts" in keys:
        return "ircot"
    if "paragraphs" in keys:
        return "musique"
    if {"input", "context", "answers"} <= keys:
        return "multifieldqa_en"
    if "evidences" in keys or "entity_ids" in keys:
        return "2wikimultihopqa"
    if "supporting_facts" in keys:
        return "hotpotqa"
    if {"question", "answers", "passages"} <= keys:
        return "jsonl"
    raise RecordProblem(f"cannot tell the format from keys {sorted(keys)}; pass --format")


@dataclass
class LoadResult:
    path: str
    format: str
    records: int = 0
    examples: list[Example] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)


def load_examples(
    path: str | Path,
    fmt: str = "auto",
    *,
    strict: bool = True,
    limit: int | None = None,
    rejects_path: str | Path | None = None,
) -> LoadResult:
    """Load every example of ``path``.

    ``strict`` raises :class:`DataError` at the first bad record; otherwise bad records are
    collected in ``LoadResult.rejects`` (and appended to ``rejects_path`` as JSONL).
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown data format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    result = LoadResult(str(path), fmt)

    def reject(r: Reject) -> None:
        if strict:
            raise DataError(r)
        result.rejects.append(r)

    for locator, rec in read_records(path):
        if limit is not None and len(result.examples) >= limit:
            break
        result.records += 1
        if isinstance(rec, UnparsableRecord):
            reject(Reject(str(path), locator, "", rec.problem))
            continue
        if not isinstance(rec, dict):
            reject(
                Reject(str(path), locator, "", f"expected a JSON object, got {type(rec).__name__}")
            )
            continue
        try:
            if result.format == "auto":
                result.format = detect_format(rec)
            for item in FORMATS[result.format](rec, result.format):
                if isinstance(item, Reject):
                    reject(
                        Reject(str(path), f"{locator} {item.locator}", item.record_id, item.problem)
                    )
                elif limit is None or len(result.examples) < limit:
                    result.examples.append(item)
        except RecordProblem as err:
            reject(Reject(str(path), locator, err.record_id or _rid(rec, "_id", "id"), err.problem))
    if rejects_path and result.rejects:
        with open(rejects_path, "a", encoding="utf-8") as fh:
            for r in result.rejects:
                fh.write(json.dumps(r.to_dict()) + "\n")
    return result


def load_sources(
    sources: list[Any], strict: bool, rejects_path: Path | None = None
) -> list[Example]:
    """Load every configured source (``ctxpick.config.DataSource``), reporting counts."""
    examples: list[Example] = []
    for src in sources:
        res = load_examples(
            src.resolved_path(),
            src.format,
            strict=strict,
            limit=None if src.limit is None else src.offset + src.limit,
            rejects_path=rejects_path,
        )
        chosen = res.examples[src.offset :]
        print(f"  {src.path}: {len(chosen)} questions, {len(res.rejects)} rejects", flush=True)
        examples += chosen
    return examples
