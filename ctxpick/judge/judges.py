"""The answer judge: deterministic rules, an LLM judge (the paper's semantic-equivalence
rubric, prompt in ``conf/judge``), or a cascade that asks the LLM only when the rules cannot
decide. Verdicts are cached by (question, gold answers, prediction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxpick.engines.base import Engine, SamplingConfig
from ctxpick.engines.http_engine import HTTPEngine, HTTPEngineConfig
from ctxpick.judge.rules import abstains, contains_answer, exact_match, rule_judge, token_f1


@dataclass
class JudgeConfig:
    mode: str = "cascade"  # rules | llm | cascade
    system: str = "Reply CORRECT or INCORRECT."
    user: str = "Question: {question}\nGold answer(s): {answers}\nPredicted answer: {prediction}"
    max_tokens: int = 4
    # The rules also accept a prediction whose token F1 against a gold answer reaches this.
    f1_threshold: float = 0.8
    engine: str = "generator"  # generator | http
    http: HTTPEngineConfig = field(default_factory=HTTPEngineConfig)

    def __post_init__(self) -> None:
        if self.mode not in ("rules", "llm", "cascade"):
            raise ValueError(f"judge.mode must be rules, llm or cascade, not {self.mode!r}")
        if not 0 < self.f1_threshold <= 1:
            raise ValueError(f"judge.f1_threshold must be in (0, 1], got {self.f1_threshold}")
        if self.engine not in ("generator", "http"):
            raise ValueError(f"judge.engine must be generator or http, not {self.engine!r}")
        for key in ("{question}", "{answers}", "{prediction}"):
            if key not in self.user:
                raise ValueError(f"judge.user prompt must contain {key}")


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answers: tuple[str, ...]
    prediction: str
    unanswerable: bool = False


def rule_verdict(item: JudgeItem, f1_threshold: float = 0.8) -> bool | None:
    """The rules' verdict, or None when only a semantic judge can tell."""
    pred, answers = item.prediction, list(item.answers)
    if item.unanswerable:
        return abstains(pred)
    if exact_match(pred, answers) or contains_answer(pred, answers):
        return True
    if token_f1(pred, answers) >= f1_threshold:
        return True
    if abstains(pred) or token_f1(pred, answers) == 0.0:
        return False
    return None


def parse_verdict(text: str) -> bool:
    words = text.strip().upper().split()
    return bool(words) and words[0].strip(".:!*") == "CORRECT"


class Judge:
    def __init__(self, cfg: JudgeConfig, engine: Engine | None = None) -> None:
        if cfg.mode != "rules" and engine is None:
            raise ValueError(f"judge mode {cfg.mode!r} needs an engine")
        self.cfg = cfg
        self.engine = engine
        self.cache: dict[JudgeItem, bool] = {}
        self.llm_calls = 0

    def __call__(self, items: list[JudgeItem]) -> list[bool]:
        todo = list(dict.fromkeys(i for i in items if i not in self.cache))
        ask = []
        for item in todo:
            verdict = None if self.cfg.mode == "llm" else rule_verdict(item, self.cfg.f1_threshold)
            if verdict is None and self.cfg.mode == "rules":
                verdict = rule_judge(item.prediction, list(item.answers), item.unanswerable)
            if verdict is None:
                ask.append(item)
            else:
                self.cache[item] = verdict
        if ask:
            chats = [
                [
                    {"role": "system", "content": self.cfg.system},
                    {
                        "role": "user",
                        "content": self.cfg.user.format(
                            question=i.question,
                            answers=" | ".join(i.answers),
                            prediction=i.prediction,
                        ),
                    },
                ]
                for i in ask
            ]
            greedy = SamplingConfig(temperature=0.0, max_tokens=self.cfg.max_tokens)
            outs = self.engine.generate(chats, greedy)  # type: ignore[union-attr]
            self.llm_calls += len(ask)
            for item, out in zip(ask, outs, strict=True):
                self.cache[item] = parse_verdict(out[0].text)
        return [self.cache[i] for i in items]


def make_judge(cfg: JudgeConfig, generator: Engine | None) -> Judge:
    """The configured judge: on the generator's engine, or on its own HTTP endpoint."""
    if cfg.mode == "rules":
        return Judge(cfg)
    return Judge(cfg, HTTPEngine(cfg.http) if cfg.engine == "http" else generator)
