"""Picker output parser, reward terms for both readings of Eq. 8, GRPO maths by hand."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxpick.picker.format import (
    FORMATS,
    InvalidPick,
    Pick,
    output_regex,
    parse_pick,
    read_pick,
    render_pick,
)
from ctxpick.rewards.reward import RewardSpec, score_output, set_reward
from ctxpick.rl.grpo import GRPOConfig, group_advantages, grpo_token_loss


def test_parser_accepts_the_documented_format():
    assert parse_pick(" <rationale> needs A and B </rationale>\n<ids>[3, 1]</ids>\n", 5) == Pick(
        "needs A and B", (3, 1)
    )
    assert parse_pick("<rationale>none needed</rationale><ids>[]</ids>", 5).ids == ()
    pick = Pick("x", (2, 4))
    assert parse_pick(render_pick(pick), 4) == pick


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<ids>[1]</ids>", "missing <rationale>"),
        ("<rationale>r</rationale>", "missing <ids>"),
        ("<rationale>r</rationale><ids>[1]", "missing <ids>"),
        ("<rationale>  </rationale><ids>[1]</ids>", "empty rationale"),
        ("<rationale>r</rationale><ids>[1, 1]</ids>", "duplicate id 1"),
        ("<rationale>r</rationale><ids>[0]</ids>", "id 0 out of range 1..5"),
        ("<rationale>r</rationale><ids>[6]</ids>", "id 6 out of range 1..5"),
        ("<rationale>r</rationale><ids>[1.5]</ids>", "non-integer id 1.5"),
        ('<rationale>r</rationale><ids>["2"]</ids>', "non-integer id '2'"),
        ("<rationale>r</rationale><ids>[true]</ids>", "non-integer id True"),
        ("<rationale>r</rationale><ids>1, 2</ids>", "ids are not a JSON list"),
        ('<rationale>r</rationale><ids>{"a": 1}</ids>', "ids are not a JSON list"),
        ("<rationale>r</rationale><ids>[1, 2</ids>", "ids are not a JSON list"),
        ("Sure! <rationale>r</rationale><ids>[1]</ids>", "text outside"),
        ("<ids>[1]</ids><rationale>r</rationale>", "text outside"),
    ],
)
def test_parser_names_what_is_wrong(text, reason):
    with pytest.raises(InvalidPick, match=reason.replace("[", r"\[").replace("(", r"\(")):
        parse_pick(text, 5)


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_output_format_round_trips_and_constrains(name):
    """What the warm start renders, the parser reads back and constrained decoding allows; a
    pick in another format is refused by name."""
    import re

    fmt = FORMATS[name]
    pick = Pick("" if name == "ids" else "needs A", (1, 3))
    text = render_pick(pick, fmt)
    assert parse_pick(f" {text}\n", 5, fmt) == pick
    assert re.fullmatch(output_regex(5, fmt), text)
    for other in set(FORMATS.values()) - {fmt}:
        with pytest.raises(InvalidPick):
            parse_pick(render_pick(Pick("r", (1,)), other), 5, fmt)
    assert score_output(text, 5, (1, 3), RewardSpec(1, 0.5, output_format=fmt)).coverage == 1.0
    paper = score_output(text, 5, (1,), RewardSpec(1, 0.5))  # the reward reads its spec's format
    assert paper.format_ok == (fmt == FORMATS["rationale_ids"])


def test_constrained_regex_matches_valid_outputs_only():
    import re

    rx = re.compile(output_regex(12))
    assert rx.fullmatch("<rationale>a b</rationale><ids>[3, 12]</ids>")
    assert rx.fullmatch("<rationale>a</rationale><ids>[]</ids>")
    assert rx.fullmatch(f"<rationale>a</rationale><ids>{list(range(1, 13))}</ids>")
    assert not rx.fullmatch("<rationale>a</rationale><ids>[13]</ids>")
    assert not rx.fullmatch("<rationale></rationale><ids>[1]</ids>")
    # ascending only, so a list cannot repeat an id or run past the pool's size
    assert not rx.fullmatch("<rationale>a</rationale><ids>[12, 3]</ids>")
    assert not rx.fullmatch("<rationale>a</rationale><ids>[2, 2]</ids>")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 13), max_size=14), st.integers(1, 12))
def test_constrained_ids_are_exactly_the_ascending_lists_of_the_pool(ids, n):
    import re

    text = f"<ids>{ids}</ids>"
    allowed = bool(re.fullmatch(output_regex(n, FORMATS["ids"]), text))
    assert allowed == (ids == sorted(set(ids)) and all(i <= n for i in ids))
    if allowed:
        assert parse_pick(text, n, FORMATS["ids"]).ids == tuple(ids)


@pytest.mark.parametrize(
    "text,ids,rationale",
    [
        ("<ids>[2, 4]</ids><rationale>[2] names the cap", (2, 4), "[2] names the cap"),
        ("<ids>[2, 4]</ids><rationale>[2] names it</rat", (2, 4), "[2] names it"),
        ("<ids>[2, 4]</ids>\n<ration", (2, 4), ""),
        ("<ids>[1]</ids><rationale>a<b then <", (1,), "a<b then"),
        ("<ids>[1]</ids><rationale>a </rat\n", (1,), "a </rat"),  # not a tag cut at the end
        ("<ids>[]</ids>", (), ""),
    ],
)
def test_an_ids_first_output_cut_in_its_rationale_keeps_its_decision(text, ids, rationale):
    """The reader a caller uses keeps the complete decision; the training reward does not:
    a rationale that runs past the budget still costs the format penalty."""
    fmt = FORMATS["ids_rationale"]
    assert read_pick(text, 5, fmt, truncated=True) == Pick(rationale, ids, cut=True)
    for strict in (lambda: parse_pick(text, 5, fmt), lambda: read_pick(text, 5, fmt)):
        with pytest.raises(InvalidPick):  # the reward's reading; an output that stopped itself
            strict()
    assert not score_output(text, 5, ids, RewardSpec(1, 0.5, output_format=fmt)).format_ok
    whole = render_pick(Pick("r", ids), fmt)
    assert read_pick(whole, 5, fmt) == parse_pick(whole, 5, fmt) == Pick("r", ids)


@pytest.mark.parametrize(
    "text,fmt,reason",
    [
        ("<ids>[2, 9]</ids><rationale>cut", "ids_rationale", "id 9 out of range"),
        ("<ids>[2, 4", "ids_rationale", "missing <ids>"),
        ("<ids>[2]</ids><rationale>r</rationale> more", "ids_rationale", "text outside"),
        ("<ids>[2]</ids> then <rationale>cut", "ids_rationale", "missing <rationale>"),
        ("<rationale>cut before the ids", "rationale_ids", "missing <rationale>"),
        ("<rationale>r</rationale><ids>[2]</ids><rationale>", "rationale_ids", "text outside"),
    ],
)
def test_any_other_defect_stays_invalid_when_read(text, fmt, reason):
    with pytest.raises(InvalidPick, match=reason):
        read_pick(text, 5, FORMATS[fmt], truncated=True)


@pytest.mark.parametrize(
    ("size", "printed", "described"),
    # The worked example in ctxpick/rewards/reward.py: |S_gold| = 2, m = 3, γ = 0.5.
    [
        (2, 1.0, 1.0),
        (3, 1.0, 1 - 0.5 / 3),
        (4, 1.0, 1 - 0.5 * 2 / 3),
        (5, 1.0, 0.5),
        (6, 0.0, -0.5),
    ],
)
def test_eq8_worked_example(size, printed, described):
    selected = [1, 2, *range(3, size + 1)]
    for eq8, want in (("printed", printed), ("described", described)):
        terms = set_reward(selected, [1, 2], RewardSpec(margin=3, gamma=0.5, eq8=eq8))
        assert terms.coverage == 1.0 and terms.size == size
        assert terms.reward == pytest.approx(want)
        assert terms.over_margin == (size > 5)


def test_reward_terms_partial_coverage_tight_margin_and_format():
    spec = RewardSpec(margin=0, gamma=0.5)
    half = set_reward([1], [1, 2], spec)
    assert (half.reward, half.coverage, half.penalty) == (0.5, 0.5, 0.0)
    # m = 0: any passage beyond |S_gold| gives the floor (0 here), even with full coverage
    assert set_reward([1, 2, 3], [1, 2], spec).reward == 0.0
    # a smaller, wrong selection of the right size is still scored by coverage
    assert set_reward([3, 4], [1, 2], spec).reward == 0.0
    bad = score_output("<ids>[1]</ids>", 4, [1], spec)
    assert (bad.reward, bad.format_ok) == (-1.0, False) and "rationale" in bad.reason
    with pytest.raises(ValueError, match="eq8"):
        RewardSpec(margin=1, gamma=0.5, eq8="other")
    with pytest.raises(ValueError, match="format_penalty=-1.0 must be below the worst valid"):
        RewardSpec(margin=1, gamma=1.0, eq8="described")


@settings(max_examples=400, deadline=None)
@given(
    gold_size=st.integers(0, 6),
    overlap=st.integers(0, 6),
    extra=st.integers(0, 12),
    margin=st.integers(0, 5),
    gamma=st.floats(0, 1),
    eq8=st.sampled_from(["described", "printed"]),
)
def test_reward_cannot_be_gamed(gold_size, overlap, extra, margin, gamma, eq8):
    """Over random (|S|, |S_gold|, overlap, m, γ): a selection beyond the margin scores no more
    than the worst valid selection inside it, and an invalid output below every valid one."""
    overlap = min(overlap, gold_size)
    spec = RewardSpec(margin, gamma, eq8, format_penalty=-1.0 - gamma - 1e-3)
    gold = list(range(1, gold_size + 1))
    picked = gold[:overlap] + list(range(100, 100 + extra))
    terms = set_reward(picked, gold, spec)
    n = gold_size + 12 + 100
    # Every valid selection inside the margin for this gold set: any overlap, any extra.
    inside = [
        set_reward(gold[:k] + list(range(100, 100 + e)), gold, spec).reward
        for k in range(gold_size + 1)
        for e in range(0, 13)
        if max(0, k + e - gold_size) <= margin
    ]
    assert min(inside) >= spec.floor - 1e-12
    if terms.over_margin:
        assert terms.reward <= min(inside) + 1e-12
    else:
        assert terms.reward >= spec.floor - 1e-12
    invalid = score_output("<ids>[1]</ids>", n, gold, spec)
    assert not invalid.format_ok and invalid.reward < min(inside + [terms.reward])


@pytest.mark.parametrize(
    ("eq8", "margin", "gamma", "gold", "before", "after"),
    # The three cases issue 18 found: one more gold passage lowered the reward.
    [
        ("described", 0, 0.25, [1, 2], [1, 9], [1, 2, 9]),
        ("described", 1, 0.5, [1, 2, 3], [1, 2, 9], [1, 2, 3, 9]),
        ("printed", 1, 0.5, [1, 2], [1, 8, 9], [1, 2, 8, 9]),
    ],
)
def test_one_more_gold_passage_never_costs(eq8, margin, gamma, gold, before, after):
    spec = RewardSpec(margin, gamma, eq8, format_penalty=-2.0)
    assert set_reward(after, gold, spec).reward >= set_reward(before, gold, spec).reward


def test_reward_is_monotone_in_gold_and_in_the_rest():
    """Over every subset S of 8 passages, gold sizes 1-4, margins 0-3, several gammas and both
    readings: adding a gold passage never lowers the reward, adding a non-gold one never raises
    it, and an invalid output scores below every valid selection."""
    passages = range(1, 9)
    subsets = [
        frozenset(p for p in passages if mask >> (p - 1) & 1) for mask in range(1 << len(passages))
    ]
    for eq8, margin, gamma, size in itertools.product(
        ("described", "printed"), range(4), (0.0, 0.25, 0.5, 1.0), range(1, 5)
    ):
        spec = RewardSpec(margin, gamma, eq8, format_penalty=-2.0)
        gold = [2, 5, 7, 8][:size]
        reward = {s: set_reward(sorted(s), gold, spec).reward for s in subsets}
        for s in subsets:
            for p in set(passages) - s:
                grown = reward[s | {p}]
                if p in gold:
                    assert grown >= reward[s] - 1e-12, (eq8, margin, gamma, gold, sorted(s), p)
                else:
                    assert grown <= reward[s] + 1e-12, (eq8, margin, gamma, gold, sorted(s), p)
        invalid = score_output("<ids>[1]</ids>", len(passages), gold, spec)
        assert not invalid.format_ok and invalid.reward < min(reward.values())


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, -1.0, -1.0])
    adv = group_advantages(r, group_size=2)
    # group 1: mean .5, std (unbiased) = .7071 -> ±.7071; group 2: all equal -> 0; group 3: 0
    assert adv.tolist() == pytest.approx([0.70710, -0.70710, 0, 0, 0, 0], abs=1e-4)
    raw = group_advantages(r, group_size=2, std_normalize=False)
    assert raw.tolist() == pytest.approx([0.5, -0.5, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(r, group_size=4)


def test_grpo_loss_by_hand():
    """Two sequences of two tokens; eps_low = 0.2, eps_high = 0.28."""
    cfg = GRPOConfig(eps_low=0.2, eps_high=0.28)
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.5, 1.0], [0.5, 1.0]]))  # ratios
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = grpo_token_loss(logp, old, adv, mask, cfg)
    # seq 1 (A=+1): min(1.5, 1.28) = 1.28 (clipped) ; min(1, 1) = 1
    # seq 2 (A=-1): min(-0.5, -0.8) = -0.8 (clipped) ; second token masked out
    assert loss.item() == pytest.approx(-(1.28 + 1.0 - 0.8))
    assert stats["clipped"].item() == 2
    # k3 KL to a reference: exp(d) - d - 1 with d = ref - logp, added with kl_coef
    ref = torch.zeros(2, 2)
    kl_cfg = GRPOConfig(kl_coef=0.1)
    loss_kl, stats_kl = grpo_token_loss(logp, old, adv, mask, kl_cfg, ref_logp=ref)
    k3 = [math.exp(-math.log(x)) + math.log(x) - 1 for x in (1.5, 1.0, 0.5)]
    assert stats_kl["kl"].item() == pytest.approx(sum(k3), rel=1e-5)
    assert loss_kl.item() == pytest.approx(loss.item() + 0.1 * sum(k3), rel=1e-5)


def test_grpo_gradient_is_the_policy_gradient_on_policy():
    """With old = current (detached), d loss / d logp = -A per unmasked token."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = grpo_token_loss(
        logp, logp.detach(), torch.tensor([0.5]), torch.tensor([[1.0, 1.0]]), GRPOConfig()
    )
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -0.5])


def test_sampler_correction_weights_are_capped():
    cfg = GRPOConfig(tis_cap=2.0)
    logp = torch.zeros(1, 2, requires_grad=True)
    sampler = torch.log(torch.tensor([[0.25, 2.0]]))  # weights exp(0 - s) = 4 -> 2 (cap), 0.5
    loss, _ = grpo_token_loss(
        logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), cfg, sampler_logp=sampler
    )
    assert loss.item() == pytest.approx(-(2.0 + 0.5))


def test_lora_merges_into_the_original_names():
    """peft's adapters train alone; the merged state is W + (alpha / r) B A under the plain
    model's names, and computes what the adapted layer computes."""
    from contextlib import nullcontext

    from peft.tuners.lora import LoraLayer
    from torch import nn

    from ctxpick.rl.lora import apply_lora, merged_state

    torch.manual_seed(0)
    model = nn.Module()
    model.block = nn.Module()
    model.block.q_proj = nn.Linear(6, 4)
    model.head = nn.Linear(4, 3)
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    assert apply_lora(model, rank=2, alpha=4.0, targets=["q_proj"]) == 1
    layer = model.block.q_proj
    assert isinstance(layer, LoraLayer)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"block.q_proj.lora_A.default.weight", "block.q_proj.lora_B.default.weight"}
    x = torch.randn(5, 6)
    assert torch.allclose(layer(x), x @ plain["block.q_proj.weight"].T + plain["block.q_proj.bias"])
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    state = merged_state(model, lambda params: nullcontext())
    assert set(state) == set(plain)
    by_hand = plain["block.q_proj.weight"] + (4.0 / 2) * (
        layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    )
    assert torch.allclose(state["block.q_proj.weight"], by_hand, atol=1e-6)
    merged = nn.Linear(6, 4)
    merged.load_state_dict(
        {"weight": state["block.q_proj.weight"], "bias": state["block.q_proj.bias"]}
    )
    assert torch.allclose(merged(x), layer(x), atol=1e-5)
    with pytest.raises(ValueError, match="match no linear"):
        apply_lora(nn.Linear(2, 2), 2, 4.0, ["q_proj"])
