"""DAPO's dynamic sampling, as pure selection over scored groups (fakes stand in for the
rollout engine and the reward service: the property is the selection, not the sampling)."""

import pytest

from ctxpick.config import ConfigError, compose
from ctxpick.rl.dynamic_sampling import carries_signal, draw_signal_groups, zero_variance_share


class FakeDraws:
    """Hands out prompt groups whose rewards come from a fixed script, one per prompt drawn,
    and records how many each draw asked for."""

    def __init__(self, script):
        self.script, self.asked, self.draws = list(script), [], []

    def __call__(self, n, d):
        self.asked.append(n)
        self.draws.append(d)
        out, self.script = self.script[:n], self.script[n:]
        return out


def test_signal_means_rewards_that_differ():
    assert carries_signal([0.0, 0.5, 0.5]) and not carries_signal([0.5, 0.5, 0.5])
    assert not carries_signal([1.0])  # a group of one has no relative advantage
    assert zero_variance_share([True, False, False, True]) == 0.5
    assert zero_variance_share([]) == 0.0


def test_flat_groups_are_replaced_until_enough_carry_signal():
    """3 wanted: the first draw has 1 flat group, the refill of 1 is flat again, the next
    refill carries signal; draws ask only for the shortfall, each with its own index."""
    flat, mixed = [0.0, 0.0], [0.0, 1.0]
    draws = FakeDraws([mixed, flat, mixed, flat, mixed, mixed])
    kept, drawn = draw_signal_groups(draws, carries_signal, want=3, cap=12)
    assert kept == [mixed, mixed, mixed] and len(drawn) == 5
    assert draws.asked == [3, 1, 1] and draws.draws == [0, 1, 2]
    assert zero_variance_share([carries_signal(g) for g in drawn]) == pytest.approx(2 / 5)


def test_the_cap_bounds_the_prompts_drawn_in_a_step():
    flat, mixed = [1.0, 1.0], [0.0, 1.0]
    draws = FakeDraws([flat, mixed, flat] + [flat] * 10)
    kept, drawn = draw_signal_groups(draws, carries_signal, want=3, cap=5)
    assert len(drawn) == 5 and kept == [mixed]  # trains on the one group with signal
    assert draws.asked == [3, 2]  # the last refill asks for what the cap leaves
    # No group with signal at all: the first draw is trained on as it stands.
    draws = FakeDraws([[float(i)] * 2 for i in range(10)])
    kept, drawn = draw_signal_groups(draws, carries_signal, want=2, cap=6)
    assert kept == [[0.0, 0.0], [1.0, 1.0]] and len(drawn) == 6


def test_groups_that_all_carry_signal_draw_nothing_more():
    draws = FakeDraws([[0.0, 1.0], [1.0, 0.5], [0.0, 0.0]])
    kept, drawn = draw_signal_groups(draws, carries_signal, want=2, cap=8)
    assert kept == drawn == [[0.0, 1.0], [1.0, 0.5]] and draws.asked == [2]


def test_dynamic_sampling_config_is_checked():
    assert compose([]).rl.dynamic_sampling is False
    with pytest.raises(ConfigError, match="max_prompt_draws=2 is below rl.prompts_per_step=4"):
        compose(["rl.dynamic_sampling=true", "rl.max_prompt_draws=2"])
