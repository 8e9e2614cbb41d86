"""PickerClient against a real HTTP server on loopback that answers as a proxy in front of a
restarting service does: plain-text 503s, then the answer."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ctxpick.serve.client import PickerClient, PickerError

ANSWER = {
    "id": "r1",
    "model": "m",
    "ids": [0],
    "indices": [0],
    "passages": ["a"],
    "rationale": "r",
    "tokens_in": 2,
    "tokens_kept": 1,
    "valid": True,
    "fallback": None,
    "budget_cut": False,
    "latency_ms": 1.0,
    "batch_size": 1,
    "output": "<ids>[1]</ids><rationale>r</rationale>",
}


@pytest.fixture
def server():
    """Serves the scripted (status, content type, body) answers in order; records requests."""
    script, seen = [], []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            status, kind, body = script.pop(0)
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script, seen
    httpd.shutdown()
    httpd.server_close()


UNAVAILABLE = (503, "text/plain", b"upstream connect error or disconnect/reset before headers")
OK = (200, "application/json", json.dumps(ANSWER).encode())


def test_a_plain_text_503_is_retried_then_answered(server):
    url, script, seen = server
    client = PickerClient(url, max_attempts=4)
    script[:] = [UNAVAILABLE, UNAVAILABLE, OK]
    sel = client.pick("q", ["a", "b"])
    assert sel.indices == [0] and len(seen) == 3
    script[:] = [UNAVAILABLE, OK]
    assert asyncio.run(client.apick("q", ["a", "b"])).indices == [0] and len(seen) == 5
    client.close()


def test_an_answer_from_an_older_or_a_newer_server_is_read_with_the_schemas_types(server):
    """A newer server's added field, also inside an echoed passage, must not break a deployed
    client; an older server's answer (before `output` and `batch_size`) reads with their
    defaults; the Selection holds the schema's types (a count "5" is 5; an id "5" stays "5"),
    its passages as sent."""
    url, script, _ = server
    client = PickerClient(url)
    passage = {"id": "5", "text": "a", "title": None, "added_later": True}
    newer = {**ANSWER, "added_later": 1, "passages": [passage, "b"], "tokens_in": "5"}
    newer |= {"ids": ["5", 1], "indices": [0, 1]}  # an id keeps its type: "5" and 1
    older = {k: v for k, v in ANSWER.items() if k not in ("output", "batch_size")}
    script[:] = [(200, "application/json", json.dumps(b).encode()) for b in (newer, older)]
    sel = client.pick("q", [passage, "b"])
    assert (sel.ids, sel.passages, sel.tokens_in) == (["5", 1], [passage, "b"], 5)
    assert [type(i) for i in sel.ids] == [str, int]
    sel = asyncio.run(client.apick("q", ["a", "b"]))
    assert (sel.indices, sel.output, sel.batch_size, sel.passages) == ([0], "", 1, ["a"])
    client.close()


def test_a_plain_text_error_that_is_not_transient_is_raised_with_its_text(server):
    url, script, seen = server
    client = PickerClient(url, max_attempts=4)
    # A proxy's plain-text refusal: not transient (ctxpick.engines.retry), raised at once.
    script[:] = [(413, "text/plain", b"Request Entity Too Large")]
    with pytest.raises(PickerError, match="413: Request Entity Too Large") as err:
        client.pick("q", ["a"])
    assert err.value.status == 413 and len(seen) == 1
    script[:] = [UNAVAILABLE] * 2
    with pytest.raises(PickerError, match="503: upstream connect error"):
        PickerClient(url, max_attempts=2).pick("q", ["a"])
    client.close()


@pytest.mark.parametrize(
    "kind,body,why",
    [
        ("text/html", b"<html>captive portal</html>", "Expecting value"),
        ("application/json", b"[1, 2]", "valid dictionary"),
        ("application/json", json.dumps({"ids": [0]}).encode(), "Field required"),
        ("application/json", json.dumps({**ANSWER, "indices": None}).encode(), "indices"),
    ],
)
def test_a_malformed_200_is_raised_as_a_picker_error_naming_what_came(server, kind, body, why):
    """A proxy's page or another service answering 200 is not a pick: one clear error, not a
    JSONDecodeError or AttributeError from deep in the client, and not retried."""
    url, script, seen = server
    client = PickerClient(url, max_attempts=4)
    script[:] = [(200, kind, body)]
    with pytest.raises(PickerError, match="200: malformed answer") as err:
        client.pick("q", ["a"])
    assert why in str(err.value) and body.decode()[:20] in str(err.value)
    assert err.value.status == 200 and len(seen) == 1
    script[:] = [(200, kind, body)]
    with pytest.raises(PickerError, match="200: malformed answer"):
        asyncio.run(client.apick("q", ["a"]))
    assert len(seen) == 2
    client.close()
