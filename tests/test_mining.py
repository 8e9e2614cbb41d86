"""Mining algorithms, judges, rewrites, splits and resume bookkeeping (no model needed)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fakes import FakeGenerator, fake_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.http_engine import HTTPEngine, HTTPEngineConfig, HTTPEngineError
from ctxpick.judge.judges import Judge, JudgeConfig, JudgeItem, parse_verdict, rule_verdict
from ctxpick.mining.miners import MINERS, GeneratorOracle, is_one_minimal
from ctxpick.mining.rewrites import assign_split, make_rewrites, parse_rewrites


@st.composite
def hidden_sets(draw):
    """A pool size, a necessary passage, and 1-3 sufficient sets that all contain it."""
    n = draw(st.integers(2, 24))
    necessary = draw(st.integers(0, n - 1))
    sets = draw(st.lists(st.sets(st.integers(0, n - 1), max_size=4), min_size=1, max_size=3))
    return n, necessary, [s | {necessary} for s in sets]


@pytest.mark.parametrize("miner", ["reference", "fast"])
@settings(max_examples=300, deadline=None)
@given(case=hidden_sets())
def test_miners_return_one_minimal_sets_holding_the_necessary_passage(miner, case):
    n, necessary, sufficient = case
    gen = FakeGenerator(sufficient)
    oracle = GeneratorOracle(fake_pool(n), gen, Judge(JudgeConfig(mode="rules")))
    res = MINERS[miner](oracle, n)
    assert res.kept and necessary in res.selected
    assert any(s <= set(res.selected) for s in sufficient)
    assert is_one_minimal(oracle, res.selected)
    assert gen.prompts == oracle.prompts  # every prompt is counted, none generated twice


@pytest.mark.parametrize("miner", ["reference", "fast"])
def test_wrong_on_full_pool_is_discarded_after_one_call(miner):
    oracle = GeneratorOracle(fake_pool(8), FakeGenerator([{99}]), Judge(JudgeConfig(mode="rules")))
    res = MINERS[miner](oracle, 8)
    assert not res.kept and res.reason == "wrong on full pool" and res.calls == res.prompts == 1


def test_fast_miner_needs_far_fewer_generator_calls():
    calls, prompts = {}, {}
    for miner in MINERS:
        calls[miner] = prompts[miner] = 0
        for seed in range(20):
            gen = FakeGenerator([{seed % 5, 7 + seed % 3}])
            oracle = GeneratorOracle(fake_pool(20), gen, Judge(JudgeConfig(mode="rules")))
            res = MINERS[miner](oracle, 20)
            calls[miner] += res.calls
            prompts[miner] += res.prompts
    assert calls["reference"] == prompts["reference"]  # Algorithm 1: one prompt per call
    # The fast miner sends more (but prefix-cached) prompts in far fewer batched calls; its
    # wall time is measured in benchmarks/bench_mining.py.
    assert calls["fast"] * 2 <= calls["reference"]


class CountingEngine:
    def __init__(self, reply):
        self.reply, self.prompts = reply, 0

    def generate(self, chats, sampling):
        self.prompts += len(chats)
        return FakeGenerator([{0}], self.reply).generate(
            [[{"role": "user", "content": "FACT0"}] for _ in chats], sampling
        )


def test_cascade_asks_the_llm_only_when_rules_cannot_decide_and_caches():
    engine = CountingEngine("CORRECT")
    judge = Judge(JudgeConfig(mode="cascade"), engine)
    items = [
        JudgeItem("q", ("Paris",), "Paris"),  # rules: yes
        JudgeItem("q", ("Paris",), "London"),  # rules: no overlap -> no
        JudgeItem("q", ("New York City",), "NYC, New York"),  # partial overlap -> LLM
        JudgeItem("q", ("x",), "not mentioned", unanswerable=True),
    ]
    assert judge(items) == [True, False, True, True]
    assert engine.prompts == 1
    judge(items)
    assert engine.prompts == 1  # cached
    llm_only = Judge(JudgeConfig(mode="llm"), CountingEngine("INCORRECT"))
    assert llm_only(items[:1]) == [False]
    assert rule_verdict(items[2]) is None
    assert rule_verdict(JudgeItem("q", ("New York City",), "York City, New"), 0.8)  # F1 = 1
    assert parse_verdict("CORRECT.") and not parse_verdict("INCORRECT") and not parse_verdict("")
    with pytest.raises(ValueError, match="needs an engine"):
        Judge(JudgeConfig(mode="llm"))


def test_rewrites_parse_dedupe_and_grouped_split():
    text = (
        "1. Which city is France's capital?\n- which city is France's capital?\nParis\n"
        '"What is the capital city of France?"\nWhat is the capital of France?'
    )
    got = parse_rewrites(text, "What is the capital of France?", 5)
    assert got == ["Which city is France's capital?", "What is the capital city of France?"]

    class Echo:
        def generate(self, chats, sampling):
            q = chats[0][1]["content"]
            return [[type("C", (), {"text": f"{q[:-1]} please?\nOk {q}"})()] for _ in chats]

    assert make_rewrites(Echo(), ["Who wrote Dune?"], k=2) == [
        ["Who wrote Dune please?", "Ok Who wrote Dune?"]
    ]
    splits = [assign_split(f"id{i}", 0, (0.8, 0.1, 0.1)) for i in range(2000)]
    assert 0.75 < splits.count("train") / 2000 < 0.85 and splits.count("test") > 100
    assert splits == [assign_split(f"id{i}", 0, (0.8, 0.1, 0.1)) for i in range(2000)]


class _Handler(BaseHTTPRequestHandler):
    fail_first = 0
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((body, self.headers.get("Authorization")))
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        text = body["messages"][-1]["content"].upper()
        reply = {
            "choices": [
                {"index": i, "message": {"content": text}, "finish_reason": "stop"}
                for i in range(body["n"])
            ],
            "usage": {"prompt_tokens": 7},
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def openai_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_http_engine_retries_and_keeps_order(openai_server, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "sk-test")
    _Handler.fail_first, _Handler.seen = 2, []
    cfg = HTTPEngineConfig(
        base_url=openai_server, model="m", api_key_env="TEST_KEY", backoff_s=0.01, concurrency=4
    )
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    out = HTTPEngine(cfg).generate(chats, SamplingConfig(n=2, max_tokens=5))
    assert [o[0].text for o in out] == [f"Q{i}" for i in range(6)]
    assert all(len(o) == 2 and o[0].prompt_tokens == 7 for o in out)
    assert len(_Handler.seen) == 8 and _Handler.seen[0][1] == "Bearer sk-test"
    assert _Handler.seen[0][0]["model"] == "m" and _Handler.seen[0][0]["max_tokens"] == 5
    _Handler.fail_first = 10
    with pytest.raises(HTTPEngineError, match="gave up after 2 tries"):
        HTTPEngine(
            HTTPEngineConfig(base_url=openai_server, max_retries=1, backoff_s=0.01)
        ).generate(chats[:1], SamplingConfig())
    with pytest.raises(ValueError, match="base_url"):
        HTTPEngineConfig(base_url="localhost:8000")
    with pytest.raises(ValueError, match="timeout_s > 0"):
        HTTPEngineConfig(base_url=openai_server, timeout_s=float("nan"))


def test_a_mining_rerun_with_other_settings_is_refused(tmp_path):
    """Records mined with one miner, generator (its dtype too) or pool are never mixed with
    another's."""
    from ctxpick.config import ConfigError, compose
    from ctxpick.mining.run import check_settings

    check_settings(compose([]), tmp_path)
    check_settings(compose(["mining.max_questions=5"]), tmp_path)  # more questions: fine
    with pytest.raises(ConfigError, match=r"other settings \(dtype, miner, model differ"):
        check_settings(compose(["mining.miner=human"]), tmp_path)
    with pytest.raises(ConfigError, match=r"other settings \(dtype differ"):
        check_settings(compose(["model.engine.dtype=float16"]), tmp_path)
    # Folders recorded before the dtype was: a vLLM generator's records were bf16.
    for miner, ok, refused in [("human", "float32", None), ("fast", "bfloat16", "float32")]:
        folder = tmp_path / miner
        folder.mkdir()
        check_settings(compose([f"mining.miner={miner}", f"model.engine.dtype={ok}"]), folder)
        recorded = json.loads((folder / "settings.json").read_text())
        del recorded["dtype"]
        (folder / "settings.json").write_text(json.dumps(recorded))
        check_settings(compose([f"mining.miner={miner}", f"model.engine.dtype={ok}"]), folder)
        if refused:
            with pytest.raises(ConfigError, match=r"\(dtype differ"):
                again = compose([f"mining.miner={miner}", f"model.engine.dtype={refused}"])
                check_settings(again, folder)
    with pytest.raises(ConfigError, match=r"\(pool differ"):
        check_settings(compose(["mining.pool.k=3"]), tmp_path)
