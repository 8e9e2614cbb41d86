"""Resumable JSONL outputs: a bad line never costs the records around it, and an append after
a torn last line (the record in flight when a job was killed) replaces that fragment."""

import json
import logging

from ctxpick.jsonl import JsonlWriter, read_done


def _line(rec_id, **kw):
    return json.dumps({"id": rec_id, **kw}) + "\n"


def test_a_bad_line_is_reported_and_every_valid_record_kept(tmp_path, caplog):
    path = tmp_path / "examples.jsonl"
    content = (
        _line("a").encode()
        + b'{"id": "broken", "po\n'  # a hand edit, or a line torn mid-file
        + _line("b").encode()
        + b"\xff\xfe not utf-8\n"
        + b'["no", "id"]\n'
        + _line("c").encode()
        + b'{"id": "torn", "pa'  # the line in flight when the driver was killed
    )
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="ctxpick.jsonl"):
        done = read_done(path)
    assert set(done) == {"a", "b", "c"}
    assert path.read_bytes() == content  # nothing is removed
    where = sorted(r.getMessage().split(": ")[0] for r in caplog.records)
    assert where == [f"{path}:{n}" for n in (2, 4, 5, 7)]


def test_an_append_after_a_torn_line_starts_a_new_line(tmp_path):
    torn = tmp_path / "torn.jsonl"
    torn.write_text(_line("a") + '{"id": "torn", "pa')
    writer = JsonlWriter(torn)
    writer.write({"id": "b"})
    writer.close()
    assert torn.read_text() == _line("a") + _line("b")  # every line parses for any reader

    # a last record complete but for its newline is kept, and so is the next one
    unterminated = tmp_path / "unterminated.jsonl"
    unterminated.write_text(_line("a") + json.dumps({"id": "b"}))
    writer = JsonlWriter(unterminated)
    writer.write({"id": "c"})
    writer.close()
    assert set(read_done(unterminated)) == {"a", "b", "c"}

    fresh = tmp_path / "fresh.jsonl"
    for _ in range(2):  # a new file, then an append to a clean one: no blank line
        writer = JsonlWriter(fresh)
        writer.write({"id": "x"})
        writer.close()
    assert fresh.read_text() == _line("x") * 2
