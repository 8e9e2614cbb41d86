"""Training plumbing without models: picker examples, batching and resume cursor, prompt
groups and sharding, the sweep table."""

import json

import pytest
import yaml

from ctxpick.config import ConfigError
from ctxpick.picker.examples import examples_from_record, warm_start_pick
from ctxpick.picker.format import FORMATS, parse_pick, render_pick
from ctxpick.rl.batching import TrainSequence, micro_batches, plan_updates
from ctxpick.rl.prompt_stream import PromptStream, TrainState
from ctxpick.rl.sweep import sweep_table


def _record(n=6, gold=("p4", "p1"), split="train", rewrites=("reworded?",)):
    pool = [{"pid": f"p{i}", "title": f"T{i}", "text": " ".join(["w"] * 50)} for i in range(n)]
    return {
        "id": "q",
        "dataset": "d",
        "question": "orig?",
        "answers": ["a"],
        "pool": pool,
        "kept": True,
        "gold_minimal": list(gold),
        "rewrites": list(rewrites),
        "split": split,
    }


def test_picker_examples_keep_gold_cut_and_shuffle():
    exs = examples_from_record({**_record(), "human_gold": ["p5"]}, 4, 0, "shuffle")
    assert [e.id for e in exs] == ["q", "q#rw1"] and exs[1].question == "reworded?"
    for e in exs:
        assert len(e.passages) == 4
        assert {e.passages[i - 1].pid for i in e.gold} == {"p1", "p4"}  # gold always kept
        assert {e.passages[i - 1].pid for i in e.human_gold} == {"p5"}  # then human evidence
        assert all(len(p.text.split()) == 50 for p in e.passages)  # cut only for the prompt
    orders = {
        tuple(p.pid for p in examples_from_record(_record(), 4, s, "shuffle")[0].passages)
        for s in range(6)
    }
    assert len(orders) > 1  # the order depends on the seed: no positional shortcut
    assert examples_from_record({**_record(), "kept": False}, 4, 0) == []
    with pytest.raises(ValueError, match="exceeds picker.max_passages=1"):
        examples_from_record(_record(), 1, 0)
    pick = warm_start_pick(exs[0], 40)
    assert pick.ids == tuple(sorted(exs[0].gold + exs[0].human_gold))
    assert all(f"T{i}" in pick.rationale for i in (1, 4, 5))


def _bridge_record():
    """A 2Wiki training question (its two evidence passages: a bridge, then the answer)."""
    texts = [
        (
            "Sebastian Kneipp (film)",
            "Sebastian Kneipp is a 1958 Austrian film directed by "
            "Wolfgang Liebeneiner and starring Carl Wery.",
        ),
        ("Carl Wery", "Carl Wery was a German actor."),
        (
            "Wolfgang Liebeneiner",
            "Wolfgang Liebeneiner (6 October 1905 - 28 November 1987) was "
            "a German actor and film director.",
        ),
        ("Kneipp", "Kneipp is a German brand of bath products."),
    ]
    pool = [{"pid": f"p{i}", "title": t, "text": x} for i, (t, x) in enumerate(texts)]
    return {
        **_record(gold=("p0", "p2"), rewrites=()),
        "question": "When did the director of film Sebastian Kneipp die?",
        "answers": ["28 November 1987"],
        "pool": pool,
    }


def test_a_contributions_rationale_says_what_each_chosen_passage_adds():
    """stage.rationale=contributions: each chosen passage once, in the ids' order, with the
    question's words it is first to name, the chosen passage its text leads to, and the answer
    where its text holds it; written before the ids, it parses back to the same pick."""
    [ex] = examples_from_record(_bridge_record(), 4, 0)
    pick = warm_start_pick(ex, 40, rationale="contributions")
    assert pick.ids == (1, 3)
    assert pick.rationale == (
        "[1] names Sebastian, Kneipp; leads to [3]. [3] names director; gives 28 November 1987."
    )
    text = render_pick(pick, FORMATS["rationale_ids"])
    assert parse_pick(text, 4, FORMATS["rationale_ids"]) == pick
    # a chosen passage that adds none of these is still named, by what it is about
    lone = warm_start_pick(
        examples_from_record({**_bridge_record(), "gold_minimal": ["p1"]}, 4, 0)[0],
        40,
        rationale="contributions",
    )
    assert lone.rationale == "[2] is about Carl Wery."
    # Words, not substrings: an answer "1987" is not given by "19870"; a possessive or another
    # case does not make a question's word new; a passage without a title is still named.
    record = {**_bridge_record(), "answers": ["1987"]}
    record["question"] = "When did the kneipp film director of Sebastian Kneipp's film die?"
    record["pool"][2] = {**record["pool"][2], "title": None, "text": "He died in 19870."}
    [ex] = examples_from_record(record, 4, 0)
    assert warm_start_pick(ex, 40, rationale="contributions").rationale == (
        "[1] names kneipp, Sebastian. [3] is about this passage."
    )
    with pytest.raises(ValueError, match="stage.rationale must be one of"):
        warm_start_pick(ex, 40, rationale="why")


def test_a_contributions_rationale_reads_what_the_picker_is_shown():
    """What a passage names, leads to and gives is read in its title and the words the picker
    is shown, as words: a plural or possessive ending counts, a longer word does not; a
    possessive question word is the word; a title's disambiguator is not looked for, unless
    what is left is one word, which passages use for other things."""
    record = _bridge_record()
    record["question"] = "It's the Beatles' Come: when did the director of Kneipp's films die?"
    record["pool"][0] = {
        **record["pool"][0],
        "title": "Sebastian Kneipp (1958 film)",
        "text": "It was a comedy by the Beatles. The director's last film was Sebastian Kneipp.",
    }
    record["pool"][2] = {
        **record["pool"][2],
        "text": "He died on 28 November 1987, after directing Sebastian Kneipp.",
    }
    [ex] = examples_from_record(record, 4, 0)
    # "Beatles'" is named by "Beatles", "director" by "director's", "Come" not by "comedy";
    # "It" is no term; [3] says "Sebastian Kneipp", [1]'s title without "(1958 film)".
    assert warm_start_pick(ex, 40, rationale="contributions").rationale == (
        "[1] names Beatles, director. [3] names Kneipp; leads to [1]; gives 28 November 1987."
    )
    # Cut to the picker's first 4 words, only [1]'s title names anything.
    assert warm_start_pick(ex, 4, rationale="contributions").rationale == (
        "[1] names Kneipp. [3] is about Wolfgang Liebeneiner."
    )
    record["pool"][0]["title"] = "It (2017 film)"
    record["pool"][2]["text"] = "He died on 28 November 1987; it was his last year."
    [ex] = examples_from_record(record, 4, 0)
    assert warm_start_pick(ex, 40, rationale="contributions").rationale == (
        "[1] names Beatles, director. [3] gives 28 November 1987."
    )


def test_a_stage_recorded_before_later_options_resumes_under_their_old_values(tmp_path):
    """A folder whose settings.json predates stage.rationale and async rollouts, and left
    dynamic sampling out when off, holds a stage trained without them: the same config resumes
    there, and turning any of them on is refused, naming the key. The draws cap is read only
    by dynamic sampling, so with it off another cap resumes too."""
    from ctxpick.config import ConfigError, compose
    from ctxpick.rl.stage_settings import SETTINGS_FILE, check_stage_settings

    base = ["stage=warmup", f"output_dir={tmp_path}"]
    check_stage_settings(compose(base), tmp_path)
    recorded = json.loads((tmp_path / SETTINGS_FILE).read_text())
    # The record as the code before these options wrote it, with dynamic sampling off.
    del recorded["stage"]["rationale"], recorded["stage"]["rationale_version"]
    for key in ("dynamic_sampling", "max_prompt_draws", "async_level"):
        del recorded["rl"][key]
    (tmp_path / "final").mkdir()
    for same in ([], ["rl.max_prompt_draws=20"]):
        (tmp_path / SETTINGS_FILE).write_text(json.dumps(recorded))
        check_stage_settings(compose([*base, *same]), tmp_path)  # resumes
    for override, key in (
        ("stage.rationale=contributions", "stage.rationale"),
        ("rl.dynamic_sampling=true", "rl.dynamic_sampling"),
        ("rl.async_level=1 rl.learner.grpo.tis_cap=2.0", "rl.async_level"),
        ("+rl.dataset_repeats.musique=3", "rl.dataset_repeats.musique"),
    ):
        (tmp_path / SETTINGS_FILE).write_text(json.dumps(recorded))
        with pytest.raises(ConfigError, match=rf"other settings \({key}: \S+ there \(not recorded"):
            check_stage_settings(compose([*base, *override.split()]), tmp_path)
    # A record of dynamic sampling on holds its cap: another cap is another stage.
    on = [*base, "rl.dynamic_sampling=true"]
    (tmp_path / SETTINGS_FILE).unlink()
    (tmp_path / "final").rmdir()
    check_stage_settings(compose(on), tmp_path)
    (tmp_path / "final").mkdir()
    check_stage_settings(compose(on), tmp_path)
    with pytest.raises(ConfigError, match=r"rl\.max_prompt_draws: 12 there, 20 now"):
        check_stage_settings(compose([*on, "rl.max_prompt_draws=20"]), tmp_path)
    # A contributions warm start recorded before its targets were mended is not the new one.
    contrib = [*base, "stage.rationale=contributions"]
    (tmp_path / SETTINGS_FILE).unlink()
    (tmp_path / "final").rmdir()
    check_stage_settings(compose(contrib), tmp_path)
    (tmp_path / "final").mkdir()
    old = json.loads((tmp_path / SETTINGS_FILE).read_text())
    del old["stage"]["rationale_version"]
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(old))
    with pytest.raises(ConfigError, match=r"stage\.rationale_version: 1 there \(not recorded"):
        check_stage_settings(compose(contrib), tmp_path)


def test_a_stage_records_the_dtype_its_learner_computes_in(tmp_path, monkeypatch):
    """`auto` is recorded as what it resolves to: the same config on a CPU without bf16
    instructions trains in float32, another stage, refused where a bf16 stage was trained
    (a record from before the option: bf16, the one dtype then); naming bf16 resumes it. GPU
    learners compute in bf16 whatever the driver's CPU has, and rollouts are given the same."""
    import torch

    from ctxpick.config import ConfigError, compose
    from ctxpick.rl.stage_settings import SETTINGS_FILE, check_stage_settings

    base = ["stage=warmup", f"output_dir={tmp_path}"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True})
    check_stage_settings(compose(base), tmp_path)
    recorded = json.loads((tmp_path / SETTINGS_FILE).read_text())
    assert recorded["rl"]["learner"]["dtype"] == "bfloat16"
    del recorded["rl"]["learner"]["dtype"]
    (tmp_path / "final").mkdir()
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(recorded))
    check_stage_settings(compose(base), tmp_path)  # resumes on a bf16 CPU
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx2": True})
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(recorded))
    with pytest.raises(ConfigError, match=r"rl\.learner\.dtype: 'bfloat16' there \(not recorded"):
        check_stage_settings(compose(base), tmp_path)
    check_stage_settings(compose([*base, "rl.learner.dtype=bfloat16"]), tmp_path)
    assert compose(base).rl.learner.compute_dtype() == "float32"
    gpu = compose([*base, "rl.learner.num_gpus_per_actor=1"]).rl.learner
    assert gpu.compute_dtype() == "bfloat16"
    assert gpu.deepspeed_config(1, "bfloat16")["bf16"] == {"enabled": True}
    assert gpu.deepspeed_config(1, "float32")["bf16"] == {"enabled": False}


def test_picker_examples_in_pool_order_are_what_inference_shows():
    """rl.pool_order=pool: the first max_passages of the pool, in its rank, for the question
    and every rewrite alike: the prompt inference builds from the same retriever's pool."""
    exs = examples_from_record(_record(), 5, 0)
    for e in exs:
        assert [p.pid for p in e.passages] == ["p0", "p1", "p2", "p3", "p4"]
        assert e.gold == (2, 5)
    # a mined set not all shown cannot be picked: no example, rather than a wrong target
    assert examples_from_record(_record(), 4, 0) == []


def test_prompt_stream_is_seeded_and_resumable_across_epochs():
    exs = examples_from_record(_record(rewrites=("a?", "b?", "c?", "d?")), 6, 0)
    stream = PromptStream(exs, 2, seed=7)
    state = TrainState()
    run = [[e.id for e in stream.next_batch(state)] for _ in range(5)]  # 5 prompts: 2 per epoch
    assert state.epoch == 2 and state.cursor == 2
    assert len(set(run[0] + run[1])) == 4  # no prompt twice within an epoch
    # resume from a saved state: the same next batches
    again = TrainState(**json.loads(json.dumps(TrainState(epoch=1, cursor=2).__dict__)))
    assert [e.id for e in stream.next_batch(again)] == run[3]
    assert [e.id for e in stream.next_batch(again)] == run[4]
    with pytest.raises(ConfigError, match="rl.prompts_per_step=9"):
        PromptStream(exs, 9, 0)


def test_dataset_repeats_oversample_within_each_epoch():
    """rl.dataset_repeats: an epoch visits a named dataset's prompts that many times each and
    the others once, in a seeded order a saved cursor resumes; a name no prompt has is refused."""
    many = examples_from_record(_record(rewrites=("a?",)), 6, 0)  # 2 prompts of dataset d
    few = examples_from_record({**_record(rewrites=()), "id": "r", "dataset": "rare"}, 6, 0)
    stream = PromptStream(many + few, 3, seed=1, repeats={"rare": 4})
    state = TrainState()
    epoch = [e.id for _ in range(2) for e in stream.next_batch(state)]  # 6 = one epoch
    assert sorted(epoch) == sorted([e.id for e in many] + [few[0].id] * 4)
    assert state.epoch == 0
    again = TrainState(cursor=3)
    assert [e.id for e in stream.next_batch(again)] == epoch[3:]
    with pytest.raises(ConfigError, match=r"\['musique'\].*\['d', 'rare'\]"):
        PromptStream(many + few, 3, seed=1, repeats={"musique": 2})


def test_restoring_best_on_resume_writes_only_the_loaded_best_and_clears_a_swaps_leftovers(
    tmp_path, monkeypatch
):
    """rl.keep_best on resume: best/ already naming the best step stays (the leftovers of a
    swap that ended before its clean-up go); a best step the loaded checkpoint holds is
    written; one that no loaded checkpoint holds is not (nothing to write it from)."""
    import ctxpick.rl.trainer as trainer

    written = []
    monkeypatch.setattr(trainer, "_export_best", lambda run, cfg, out, st: written.append(st.step))
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / trainer.BEST_RECORD).write_text('{"step": 2, "val_reward": 0.5}')
    for stale in ("best.tmp", "best.old"):
        (tmp_path / stale).mkdir()
    trainer._restore_best(None, None, tmp_path, TrainState(step=3, best_step=2))
    assert [p.name for p in tmp_path.iterdir()] == ["best"] and written == []
    trainer._restore_best(None, None, tmp_path, TrainState(step=5, best_step=4))
    assert written == []
    trainer._restore_best(None, None, tmp_path, TrainState(step=4, best_step=4))
    assert written == [4]


def test_prompt_groups_micro_batches_and_equal_passes_per_rank():
    def seq(prompt, resp, group):
        return TrainSequence([*prompt, *resp], len(prompt), group=group)

    seqs = [seq([1, 2], [5], 0), seq([1, 2], [6, 7], 0), seq([1, 2], [8], 0)]
    seqs += [seq([3], [9], 1), seq([3], [4], 1)]
    assert [len(m.seqs) for m in micro_batches(seqs, 2)] == [2, 1, 2]
    assert [len(m.seqs) for m in micro_batches(seqs, 8)] == [3, 2]
    # The same prompt twice in a batch (two groups) is never merged into one group.
    twice = seqs[:3] + [seq([1, 2], [9], 2)]
    assert [len(m.seqs) for m in micro_batches(twice, 8)] == [3, 1]
    plans, tokens = plan_updates(seqs, 2, ranks=2)
    assert tokens == [6] and [len(p[0]) for p in plans] == [2, 2]
    # Any mix of group sizes, micro-batch sizes, ranks and mini-batches: every rank runs the
    # same number of passes in every mini-batch, and every real sequence is used exactly once.
    import random

    rng = random.Random(0)
    for _ in range(200):
        groups = rng.randint(1, 7)
        batch = [
            seq([g, 100 + g], [1] * rng.randint(1, 3), g)
            for g in range(groups)
            for _ in range(rng.randint(1, 5))
        ]
        ranks, minis = rng.randint(1, 4), rng.randint(1, groups)
        plans, tokens = plan_updates(batch, rng.randint(1, 4), ranks, minis)
        assert len({tuple(len(mini) for mini in plan) for plan in plans}) == 1
        used = [
            s for plan in plans for mini in plan for mb in mini if not mb.padding for s in mb.seqs
        ]
        assert sorted(map(id, used)) == sorted(map(id, batch))
        assert sum(tokens) == sum(len(s.ids) - s.prompt_len for s in batch)
    with pytest.raises(ValueError, match="2 prompt groups cannot fill"):
        plan_updates(seqs, 2, 1, mini_batches=3)


def test_mined_records_are_checked_field_by_field(tmp_path):
    from ctxpick.picker.examples import load_picker_examples

    good = _record()
    cases = [
        ({k: v for k, v in good.items() if k != "gold_minimal"}, "field 'gold_minimal' is missing"),
        ({**good, "pool": [{"pid": "p0"}]}, r"field 'pool\[0\].text'"),
        ({**good, "split": "dev"}, "field 'split' is 'dev'"),
        ({**good, "question": 3}, "field 'question' is int, not str"),
        ({**good, "gold_minimal": ["p99"]}, "field 'gold_minimal' names passages not in the pool"),
    ]
    for bad, message in cases:
        path = tmp_path / "mined.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=f"mined.jsonl: line 2: {message}"):
            load_picker_examples(path, 6, 0)
    path.write_text(json.dumps(good) + "\n{broken\n")
    with pytest.raises(ValueError, match="line 2: not JSON"):
        load_picker_examples(path, 6, 0)


def test_trained_picker_folder_carries_its_prompt(tmp_path):
    """The picker a stage trains is asked, at inference, with byte-identical chats."""
    from ctxpick.config import compose, picker_spec
    from ctxpick.picker.examples import examples_from_record
    from ctxpick.picker.inference import Picker
    from ctxpick.picker.spec import PickerSpec

    cfg = compose(["picker.max_passages=4", "picker.max_passage_words=7"])
    ex = examples_from_record(_record(gold=("p1", "p3")), 4, 0)[0]
    training_chat = picker_spec(cfg).chat(ex.question, ex.passages)
    picker_spec(cfg).save(tmp_path)
    # A later config with another prompt does not change what the trained picker is asked.
    other = compose(["picker.instruction=Something else", "picker.max_passage_words=3"])
    assert picker_spec(other) != picker_spec(cfg)
    picker = Picker.from_pretrained(tmp_path, engine=lambda folder: None, count_tokens=len)
    assert picker.chats([ex.question], [list(ex.passages)]) == [training_chat]
    assert training_chat[0]["content"] == cfg.picker.instruction
    (tmp_path / "picker.json").write_text('{"instruction": "x", "max_passages": 2}')
    with pytest.raises(ValueError, match="missing fields"):
        PickerSpec.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a trained picker"):
        PickerSpec.load(tmp_path / "nowhere")


def test_sweep_table_collects_every_job(tmp_path):
    for job, margin, reward in (("0", 0, 0.41), ("1", 2, 0.37)):
        d = tmp_path / job
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(
            yaml.safe_dump(["stage=stage2", f"stage.redundancy_margin={margin}", "rl.mined=x"])
        )
        history = [
            {
                "step": 5,
                "val/reward": reward,
                "val/coverage": 0.5,
                "val/mean_size": 1.5,
                "val/format_valid": 1.0,
            }
        ]
        (d / "result.json").write_text(
            json.dumps({"step": 5, "stop_reason": "", "val_history": history})
        )
    table = sweep_table(tmp_path)
    lines = table.splitlines()
    assert (
        "stage.redundancy_margin=0" in lines[2] and "0.410" in lines[2] and "rl.mined" not in table
    )
    assert "stage.redundancy_margin=2" in lines[3] and "max_steps" in lines[3]
    assert sweep_table(tmp_path / "empty") is None


def test_constrained_rollouts_allow_only_each_prompts_own_ids():
    """Prompts with pools of different sizes each get the id pattern of their own pool."""
    import re

    from ctxpick.engines.base import Completion, SamplingConfig
    from ctxpick.picker.spec import PickerSpec
    from ctxpick.rl.rollout import sample_groups

    class Recorder:  # stands in for the engine pool: records what each chat was sent with
        def __init__(self):
            self.sent = {}

        def generate(self, chats, sampling, batch_size=16):
            for chat in chats:
                self.sent[chat[1]["content"]] = sampling.regex
            return [[Completion("x", [], 0)] for _ in chats]

    small = examples_from_record(_record(n=6, gold=("p1",), rewrites=()), 3, 0)[0]
    large = examples_from_record(_record(n=6, rewrites=()), 6, 0)[0]
    spec = PickerSpec("sys", 8, 10, 32)
    engines = Recorder()
    groups = sample_groups(engines, [large, small], spec, SamplingConfig(n=1), constrained=True)
    assert [g.example for g in groups] == [large, small]  # batch order kept
    for ex, n in ((small, 3), (large, 6)):
        regex = re.compile(engines.sent[spec.chat(ex.question, ex.passages)[1]["content"]])
        assert regex.fullmatch(f"<rationale>r</rationale><ids>[{n}]</ids>")
        assert not regex.fullmatch(f"<rationale>r</rationale><ids>[{n + 1}]</ids>")


def test_warm_start_weights_exactly_the_id_tokens():
    """stage.id_weight lands on the tokens of <ids>...</ids>, in either order of the tags, and
    the tokens are the ones the model writes (one encode, not pieces glued together)."""
    from transformers import AutoTokenizer

    from ctxpick.engines.models import resolve
    from ctxpick.picker.format import FORMATS, Pick, render_pick
    from ctxpick.rl.steps import weighted_target

    tok = AutoTokenizer.from_pretrained(resolve("smollm2-135m"))
    for fmt in FORMATS.values():
        text = render_pick(Pick("The answer needs [1] Foo.", (1, 3)), fmt)
        ids, weights = weighted_target(tok, text, 5.0)
        assert ids == tok.encode(text, add_special_tokens=False)
        heavy = tok.decode([i for i, w in zip(ids, weights, strict=True) if w == 5.0])
        assert "<ids>[1, 3]</ids>" in heavy and "answer" not in heavy
        assert set(weights) <= {1.0, 5.0}


def test_human_evidence_records_resume_and_keep_each_questions_split(tmp_path):
    """mining.miner=human: one record per question, appended once (a re-run adds nothing),
    split by the same hash as mined records; mining.max_questions takes the datasets in turn."""
    from conftest import SAMPLES

    from ctxpick.config import compose
    from ctxpick.data.loaders import load_examples
    from ctxpick.mining.rewrites import assign_split
    from ctxpick.mining.run import in_turn, write_human_gold
    from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
    from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

    examples = [
        *load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", "hotpotqa").examples[:4],
        *load_examples(SAMPLES / "musique_30.jsonl", "musique").examples[:2],
    ]
    chunked = Chunker(ChunkingConfig(method="window", window_words=40)).chunk_all(examples)
    pools = [PoolBuilder(PoolConfig(k=6)).build(c) for c in chunked]
    assert [p.dataset for p in in_turn(pools, 5)] == ["hotpotqa", "musique"] * 2 + ["hotpotqa"]
    cfg = compose(["mining.miner=human"])
    path = tmp_path / "mined.jsonl"
    first = write_human_gold(pools[:3], path, cfg)
    again = write_human_gold(pools, path, cfg)
    lines = path.read_text().splitlines()
    assert len(first) == 3 and len(again) == len(lines) == 6
    for line in lines:
        rec = json.loads(line)
        assert rec["split"] == assign_split(rec["id"], cfg.seed, tuple(cfg.mining.split_ratios))
        assert rec["kept"] == bool(rec["gold_minimal"])


def test_a_resumed_mining_run_builds_pools_only_for_new_questions(tmp_path, monkeypatch):
    """Re-running `ctxpick mine` into the same folder with more questions builds pools (chunks
    and retrieval: minutes on a large file) for the new questions only, and reports all."""
    from ctxpick.config import compose
    from ctxpick.mining.run import run_mining
    from ctxpick.retrieval.pools import PoolBuilder

    base = [
        "mining.miner=human",
        "data.path=sample:hotpotqa_distractor_30.jsonl",
        "data.format=hotpotqa",
        f"output_dir={tmp_path}",
        "wandb.mode=disabled",
    ]
    built: list[str] = []
    real_build = PoolBuilder.build

    def counting_build(self, item):
        built.append(item.example.id)
        return real_build(self, item)

    monkeypatch.setattr(PoolBuilder, "build", counting_build)
    run_mining(compose([*base, "data.limit=3"]))
    first = list(built)
    summary = run_mining(compose([*base, "data.limit=5"]))
    assert len(first) == 3 and len(built) == 5 and not set(built[3:]) & set(first)
    lines = (tmp_path / "mined.jsonl").read_text().splitlines()
    assert len(lines) == 5 and len({json.loads(x)["id"] for x in lines}) == 5
    assert summary["all"]["examples"] == 5


def test_a_build_lock_of_unknown_origin_is_waited_for_until_it_is_stale(tmp_path, capsys):
    """Another program's build holds its lock file as long as it builds: it is waited for and
    left to that program to remove; one older than any build is removed, as is one a learner
    that died loading the op left, however young (tests/test_learner.py kills one)."""
    import os
    import threading
    import time

    from ctxpick.rl.deepspeed_ops import STALE_AFTER_S, clear_build_lock

    lock = tmp_path / "lock"
    lock.touch()
    released = []

    def release():  # the other program's own removal: it fails if the lock went here
        lock.unlink()
        released.append(True)

    other = threading.Timer(1.5, release)
    other.start()
    clear_build_lock(lock, left_by_a_learner=False)
    other.join()
    assert released and "waiting for" in capsys.readouterr().out

    lock.touch()
    hour_ago = time.time() - max(3600, 2 * STALE_AFTER_S)
    os.utime(lock, (hour_ago, hour_ago))
    clear_build_lock(lock, left_by_a_learner=False)
    assert not lock.exists() and "s old, left by a process killed" in capsys.readouterr().out

    lock.touch()
    clear_build_lock(lock, left_by_a_learner=True)
    assert not lock.exists() and "left by a learner killed" in capsys.readouterr().out
