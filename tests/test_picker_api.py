"""The Python API's decisions around the engine's output (pure: a scripted engine): kept
passages in retriever order, caller ids, the fallback policies, the token budget."""

import pytest

from ctxpick.engines.base import Completion
from ctxpick.picker.format import FORMATS
from ctxpick.picker.inference import Picker
from ctxpick.picker.selection import Selection, as_passages
from ctxpick.picker.spec import PickerSpec


class Scripted:
    """Answers each chat with the next scripted output; records the batch sizes and the
    output pattern each call was constrained to."""

    def __init__(self, *outputs):
        self.outputs, self.calls, self.regexes = list(outputs), [], []

    def generate(self, chats, sampling):
        self.calls.append(len(chats))
        self.regexes.append(sampling.regex)
        return [[_completion(self.outputs.pop(0))] for _ in chats]


def _completion(output):
    """A scripted output: its text, or (text, finish_reason)."""
    text, finish = (output, "stop") if isinstance(output, str) else output
    return Completion(text, [], 0, finish)


CANDIDATES = ["alpha one", {"id": "b", "text": "beta two two", "title": "B"}, "gamma three"]


def picker(*outputs, **options):
    return Picker(
        Scripted(*outputs),
        PickerSpec("sys", 3, 50, 32),
        count_tokens=lambda t: len(t.split()),
        **options,
    )


def test_kept_passages_come_in_retriever_order_with_the_callers_ids():
    sel = picker("<rationale>r</rationale><ids>[3, 2]</ids>").pick("q", CANDIDATES)
    assert isinstance(sel, Selection) and sel.valid and sel.fallback is None
    assert sel.indices == [1, 2] and sel.ids == ["b", 2]
    assert sel.passages == [CANDIDATES[1], CANDIDATES[2]] and sel.rationale == "r"
    # tokens as the generator would read them: "[1] (title) text"
    assert sel.tokens_in == 3 + 5 + 3 and sel.tokens_kept == 5 + 3


@pytest.mark.parametrize("policy,kept", [("top_k", [0, 1]), ("all", [0, 1, 2])])
def test_an_invalid_output_falls_back_and_says_so(policy, kept):
    sel = picker("I think passage 2", fallback=policy, fallback_k=2).pick("q", CANDIDATES)
    assert not sel.valid and sel.indices == kept
    assert policy in sel.fallback and "invalid output" in sel.fallback


def test_an_ids_first_output_cut_in_its_rationale_is_served_as_decided():
    spec = PickerSpec("sys", 3, 50, 32, FORMATS["ids_rationale"])
    cut = ("<ids>[3]</ids><rationale>[3] names the</ration", "length")
    stopped = ("<ids>[3]</ids><rationale>[3] names the", "stop")  # ended unclosed on its own
    p = Picker(Scripted(cut, stopped, ("<ids>[3]</ids> no", "length")), spec)
    read, *broken = p.pick_many(["q"] * 3, [CANDIDATES] * 3)
    assert read.valid and read.fallback is None and read.indices == [2]
    assert read.rationale == "[3] names the" and read.rationale_cut
    for sel in broken:
        assert not sel.valid and sel.indices == [0, 1] and "invalid output" in sel.fallback
        assert not sel.rationale_cut
    [decision] = Picker(Scripted(cut), spec).decide(["q"], [as_passages(CANDIDATES)])
    assert decision.valid and decision.rationale_cut and decision.reason == ""


@pytest.mark.parametrize(
    "in_spec,given,constrained",
    [(True, None, True), (True, False, False), (False, None, False), (False, True, True)],
)
def test_a_picker_decodes_as_its_picker_json_says_unless_told(in_spec, given, constrained):
    spec = PickerSpec("sys", 3, 50, 32, constrained=in_spec)
    p = Picker(Scripted("<rationale>r</rationale><ids>[1]</ids>"), spec, constrained=given)
    assert p.pick("q", CANDIDATES).valid
    assert (p.engine.regexes[0] is not None) == constrained == p.decodes_constrained
    with pytest.raises(ValueError, match="picker constrained 1: expected a bool"):
        Picker(Scripted(), spec, constrained=1)


@pytest.mark.parametrize(
    "bad,error,message",
    [
        ({"fallback": "none"}, ValueError, "fallback"),
        ({"fallback_k": 0}, ValueError, "fallback_k"),
        ({"constrained": "yes"}, ValueError, "constrained"),
        ({"max_batch": 4}, TypeError, r"unknown options \['max_batch'\]"),
        ({"batch_wait_s": float("inf")}, ValueError, "finite wait_s"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size >= 1"),
    ],
)
def test_from_pretrained_refuses_a_bad_option_before_any_engine_starts(bad, error, message):
    started = []
    with pytest.raises(error, match=message):
        Picker.from_pretrained("smollm2-135m", engine=started.append, **bad)
    assert not started


def test_the_token_budget_cuts_the_last_kept_passages():
    sel = picker("<rationale>r</rationale><ids>[1, 2, 3]</ids>").pick("q", CANDIDATES, 9)
    assert sel.indices == [0, 1] and sel.budget_cut and sel.tokens_kept == 8


def test_token_counts_the_caller_has_are_not_counted_again():
    """The service's ingress counts each candidate for its limits; the engine's thread takes
    those counts (same tokenizer, same "[i] (title) text" form) instead of counting again."""
    counted = []

    def count(text):
        counted.append(text)
        return len(text.split())

    p = Picker(
        Scripted("<rationale>r</rationale><ids>[1, 2, 3]</ids>"),
        PickerSpec("sys", 3, 50, 32),
        count_tokens=count,
    )
    given = p.pick_many(["q"], [CANDIDATES], [9], [[3, 5, 3]])[0]
    assert not counted
    assert given.indices == [0, 1] and given.budget_cut
    assert (given.tokens_in, given.tokens_kept) == (11, 8)


def test_pick_many_is_one_engine_call():
    p = picker(*["<rationale>r</rationale><ids>[1]</ids>"] * 3)
    sels = p.pick_many(["q1", "q2", "q3"], [CANDIDATES] * 3, [None, None, 1])
    assert p.engine.calls == [3] and [s.batch_size for s in sels] == [3, 3, 3]
    assert [s.indices for s in sels] == [[0], [0], []]


@pytest.mark.parametrize(
    "bad,message",
    [
        ([], "empty list"),
        ([{"title": "x"}], r"passages\[0\]"),
        ([{"text": "a", "title": 3}], "title"),
    ],
)
def test_bad_candidates_are_refused_naming_the_passage(bad, message):
    with pytest.raises(ValueError, match=message):
        picker("unused").pick("q", bad)
    with pytest.raises(ValueError, match="fallback"):
        picker(fallback="none")


def test_a_candidate_without_an_id_is_known_by_its_position():
    # as an HTTP body's passage arrives: {"id": null, ...}
    sel = picker("<rationale>r</rationale><ids>[1]</ids>").pick("q", [{"id": None, "text": "a"}])
    assert sel.ids == [0]
