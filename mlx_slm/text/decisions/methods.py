"""How a decision question is answered beyond its raw letters, and the one rule that binds a
saved method to the question it was made for.

Exact is not right: on the seed's tickets the generic prompt's raw letters were 64.7 % right
(every ticket got about 0.36 / 0.27 / 0.36), and the same probabilities divided by their mean
over the run 90.0 %. So a question's *method* may change its answer, each step opt-in and said:

* ``style``: how it is asked: "letters" (Transformers' DECISION_PROMPT, exact; the default),
  "names" (the options listed and read by their own names, scored whole: `prompt.styled`) or
  "prompt" (the names style's question as the system message, the state as the user's: a
  classifier of the question's own, untrained: `Method.classified`, `OwnClassifiers`);
* ``permute``: 1, or 2 (the options asked in both orders, forward and reversed, and the two
  answers' probabilities averaged, which cancels a preference for the first option);
* ``prior``: what the raw answer is divided by (`Calibrator.apply`: log p - log prior, then
  renormalised): none; "batch" (the mean answer over the run's first N states, or a prior a
  task fitted from a sample of the user's states: `eval --fit-prior`); "contextual" (the
  answer to content-free states, several fillers averaged); "fit" (a bias per option and a
  temperature fitted on gold answers, `eval --fit`);
* ``head``: a head trained on the question's own prompt (`train --decisions`): its answer
  replaces the letters';
* ``tuned``: a classifier trained for the question (`train --decisions --finetune lora|auto`: the
  question as its system message, the state as its text; LoRA adapters or a head, classify's
  own), a task file beside the decision task: its answer replaces the letters' (`tuned_prompt`);
* ``none``: "none of these" for a trained choice question (`train --decisions --none-label OPTION
  [--none-threshold P|auto]`, `NoneOf`): the question's own none option, learned from its examples
  as any option, is also the answer when no other option reaches P. The probabilities stay the
  method's; only the choice changes, and the answer's `x_method` says so.

The raw answer (the style's, order-averaged) is kept beside the final one (`x_raw_probabilities`
on the routes, `raw` in a `DecisionResult`): it stays exact. A saved method is bound to its
question by `DecisionQuestion.digest` (the question itself, whatever the route, file form or
id it came in); a question asked under a fitted question's id but worded otherwise is answered
without the fitted method, and the answer says so (`Methods.for_question`'s note).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..calibration import CalibrationError, Calibrator
from ..heads import Head, HeadError
from ..out_of_scope import answers as out_of_scope_answers
from .errors import DecisionError
from .prompt import STYLES, names, names_text, styled
from .questions import DecisionQuestion
from .settings import temperature_problem

PRIORS = ("none", "batch", "contextual")  # what a run may divide its answers by (`--calibrate`)
PERMUTES = (1, 2)
# Content-free states for the contextual prior (Zhao et al. 2021 used "N/A", "[MASK]" and ""): the
# answer to each is a guess at the model's bias; one filler alone moved the seed's tickets from 44 %
# to 83 % right, so several are averaged.
FILLERS = ("N/A", "...", "[empty]", "-", "none")


def threshold_text(t: float) -> str:
    """A probability threshold in as few digits as keep it apart from 0 and 1 (0.99999999 is not
    "below 1", which reads as "always")."""
    for digits in range(3, 18):
        got = f"{t:.{digits}g}"
        if float(got) not in (0.0, 1.0) or t in (0.0, 1.0):
            return got
    return repr(t)


@dataclass(frozen=True)
class NoneOf:
    """ "None of these" for a choice question: `option` (the answer name of one of its options, the
    one meaning none) is the answer when it is the likeliest, as any option, or when no other
    option reaches `min_confidence` (None: no threshold; the rule is `text.out_of_scope.answers`,
    classify's own). `chosen`: how the threshold was chosen (`--none-threshold auto`: the target,
    the held-out figures), or empty."""

    option: str
    min_confidence: float | None = None
    chosen: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        t = self.min_confidence
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0):
            raise DecisionError(("none_of_these",), f"min_confidence is a probability from 0 to 1, got {t!r}")

    def check(self, q: DecisionQuestion) -> None:
        if q.type != "choice" or self.option not in q.answer_names():
            raise DecisionError(
                ("none_of_these",),
                f"question {q.key!r}: 'none of these' answers one of a choice's options, and {self.option!r} is "
                f"none of {list(q.answer_names())[:8] if q.type == 'choice' else 'its answers (not a choice)'}",
            )

    def changes(self, q: DecisionQuestion, p: np.ndarray) -> bool:
        """Whether the rule answers the none option where the likeliest option is another."""
        names = q.answer_names()
        said = out_of_scope_answers(np.asarray(p, dtype=np.float64)[None], names, self.option, self.min_confidence)
        return said[0] is None and names[int(np.argmax(p))] != self.option

    def record(self) -> dict[str, Any]:
        return {"option": self.option, "min_confidence": self.min_confidence}

    def to_dict(self) -> dict[str, Any]:
        return {**self.record(), **({"chosen": dict(self.chosen)} if self.chosen else {})}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> NoneOf:
        if not isinstance(d, dict) or not isinstance(d.get("option"), str):
            raise DecisionError((), f"{where}: 'none_of_these' is an object with the 'option' it answers")
        try:
            return cls(d["option"], d.get("min_confidence"), d.get("chosen") or {})
        except DecisionError as e:
            raise DecisionError((), f"{where}: 'none_of_these': {e.msg}") from None


@dataclass(frozen=True)
class Method:
    """How one question is answered (see the module docstring). `calibrator` is a fitted one
    (a task's: "fit" or a fitted "batch" prior) over the question's `answer_names`; `prior` is
    what a run divides by when there is none ("batch" and "contextual" are found per run);
    `head` a trained head. `key` and `digest` name the question a saved method was made for
    (None: the run's own settings, for any question); `report` its fit's figures."""

    style: str = "letters"
    permute: int = 1
    prior: str = "none"
    calibrator: Calibrator | None = None
    head: Head | None = None
    key: str | None = None
    digest: str | None = None
    report: Mapping[str, Any] = field(default_factory=dict, compare=False)
    tuned: str | None = None  # a classify task answering the question (its path, once read with the task)
    none: NoneOf | None = None  # "none of these" (a trained choice question's)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise DecisionError(("style",), f"the prompt style is one of {', '.join(STYLES)}, got {self.style!r}")
        if self.permute not in PERMUTES:
            raise DecisionError(("permute",), f"permute is 1 or 2 (both orders averaged), got {self.permute!r}")
        if self.prior not in PRIORS:
            raise DecisionError(("calibrate",), f"the prior is one of {', '.join(PRIORS)}, got {self.prior!r}")

    @property
    def is_raw(self) -> bool:
        """Nothing beyond Transformers' decision path: the letters, one order, no prior, no head."""
        return self == Method()

    @property
    def trained(self) -> bool:
        """Answered by a model trained for the question (a head, or a tuned classifier), not by letters."""
        return self.head is not None or self.tuned is not None

    def asks(self, q: DecisionQuestion) -> tuple[str, int]:
        """(style, orders) as `q` is asked: order averaging applies to a choice's options (a
        score's levels keep their order); the names style to the questions it applies to
        (`prompt.names`). A trained head's method asks as the head was trained (letters, one order:
        `Decider.features`), whatever style a saved method beside it names."""
        if self.head is not None:
            return "letters", 1
        style = self.style if names(q) is not None or self.style == "prompt" else "letters"
        return style, (self.permute if q.type == "choice" else 1)

    def classified(self, q: DecisionQuestion) -> bool:
        """Whether `q` is answered by a classifier of its own (its own pass over the state, not a
        branch of the decision prompt): a trained one (`tuned`), or the "prompt" style's."""
        return self.tuned is not None or self.asks(q)[0] == "prompt"

    def check(self, q: DecisionQuestion) -> None:
        """A saved method fits the question it is applied to: its calibrator's or head's options
        are the question's (`answer_names`), in order."""
        want = tuple(q.answer_names())
        for what, labels in (("calibration", self.calibrator), ("head", self.head)):
            got = getattr(labels, "labels", None)
            if got is not None and tuple(got) != want:
                raise DecisionError(
                    (what,),
                    f"question {q.key!r}: its saved {what} was made for the options {list(got)}, not {list(want)}",
                )
        if self.none is not None:
            self.none.check(q)

    def answer(self, raw: np.ndarray, prior: Calibrator | None = None) -> np.ndarray:
        """The final probabilities from the raw ones (the style's, order-averaged; a head's own):
        the fitted calibrator where there is one, else the run's `prior` (batch or contextual:
        the decider gives one only to a method that asks for it, never to a saved one), else the
        raw answer itself (the same array: exact)."""
        cal = self.calibrator or prior
        if cal is None:
            return raw
        with np.errstate(divide="ignore"):
            lp = np.log(np.asarray(raw, dtype=np.float64))
        return np.exp(cal.apply(lp))  # a 0 (-inf) read at the floor its fit read: `Calibrator.apply`'s own

    def record(
        self, prior: Calibrator | None = None, q: DecisionQuestion | None = None, final: np.ndarray | None = None
    ) -> dict[str, Any]:
        """What was applied, as an answer's `x_method` and a run's summary say it (`q`: the question
        it answered: the style and orders it was really asked in, `asks`; `final`: its answer's
        probabilities, where "none of these" may have changed its choice: `answered_none`)."""
        cal = self.calibrator or prior
        if self.tuned is not None:  # its classifier reads the question as the names style lists it (`tuned_prompt`)
            style, permute = ("names" if q is None or names(q) is not None else "letters"), 1
        else:
            style, permute = self.asks(q) if q is not None else (self.style, self.permute)
        out: dict[str, Any] = {"style": style, "permute": permute}
        out["calibration"] = self.prior if cal is None else cal.method  # (a run's prior not found yet: its kind)
        if cal is not None and self.calibrator is not None:
            out["fitted"] = True
        if self.head is not None:
            out["trained"] = "head"
        if self.tuned is not None:
            out["trained"] = str(self.report.get("trained", "classifier"))
        if self.key is not None:
            out["fitted_as"] = self.key
        if self.none is not None:
            out["none_of_these"] = self.none.record()
            if q is not None and final is not None:
                out["none_of_these"]["answered_none"] = self.none.changes(q, final)
        return out

    # ------------------------------------------------------------------ saved in a task
    def to_dict(self) -> dict[str, Any]:
        """A saved method (a task's `decisions.methods` entry): `from_dict` reads it back."""
        out: dict[str, Any] = {"key": self.key, "digest": self.digest, "style": self.style, "permute": self.permute}
        if self.calibrator is not None:
            out["calibrator"] = self.calibrator.to_dict()
        if self.head is not None:
            out["head"] = self.head.to_dict()
        if self.tuned is not None:
            out["tuned"] = self.tuned
        if self.none is not None:
            out["none_of_these"] = self.none.to_dict()
        if self.report:
            out["report"] = dict(self.report)
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Method:
        """A saved method; a bad field is a `DecisionError` naming `where` and the field."""
        if not isinstance(d, dict) or not isinstance(d.get("digest"), str) or not isinstance(d.get("key"), str):
            raise DecisionError((), f"{where}: a method is an object with its question's 'key' and 'digest'")
        try:
            cal = Calibrator.from_dict(d["calibrator"]) if d.get("calibrator") is not None else None
            head = Head.from_dict(d["head"], f"{where}: head") if d.get("head") is not None else None
        except CalibrationError as e:
            raise DecisionError((), f"{where}: {e}") from None
        except HeadError as e:  # (it names `where` already: read as f"{where}: head")
            raise DecisionError((), str(e)) from None
        report = d.get("report") or {}
        if not isinstance(report, dict):
            raise DecisionError(
                (), f"{where}: 'report' is an object (the fit's or the training's figures), got {report!r:.60}"
            )
        tuned = d.get("tuned")
        if tuned is not None and (not isinstance(tuned, str) or not tuned or "/" in tuned or "\\" in tuned):
            raise DecisionError((), f"{where}: 'tuned' names a task file beside this one, got {tuned!r}")
        style, permute = d.get("style", "letters"), d.get("permute", 1)
        none = NoneOf.from_dict(d["none_of_these"], where) if d.get("none_of_these") is not None else None
        return cls(style, permute, "none", cal, head, d["key"], d["digest"], report, tuned, none)


@dataclass(frozen=True)
class Methods:
    """Every saved method by the digest of its question, and the run's own settings (`default`,
    for any other question): which applies to an asked question is `for_question`'s rule."""

    saved: Mapping[str, Method] = field(default_factory=dict)
    default: Method = Method()

    @classmethod
    def of(cls, saved: Iterable[Method] = (), default: Method | None = None) -> Methods:
        """Saved methods by digest; two for one question (its wording and options under two ids,
        fitted or trained apart) refused: a method is bound to the question, not its id, so one of
        them would answer both, silently."""
        out: dict[str, Method] = {}
        for m in saved:
            if m.digest is None:
                continue
            if m.digest in out:
                raise DecisionError(
                    ("methods",),
                    f"questions {out[m.digest].key!r} and {m.key!r} are the same question (the same wording and "
                    "options under two ids) with a method each: a method is bound to the question, not its id; "
                    "fit or train one of them",
                )
            out[m.digest] = m
        return cls(out, default or Method())

    @property
    def is_raw(self) -> bool:
        return not self.saved and self.default.is_raw

    def for_question(self, q: DecisionQuestion) -> tuple[Method, str | None]:
        """(the method for `q`, a note or None): its saved method where its digest has one (whatever
        its id or route), else the run's default; the note says when `q` goes by the id of a
        fitted question but is not that question (changed wording or options: answered without it)."""
        got = self.saved.get(q.digest)
        if got is not None:
            return got, None
        same_id = [m for m in self.saved.values() if m.key == q.key]
        if same_id:
            made, again = ("trained", "train") if same_id[0].trained else ("fitted", "fit")
            return self.default, (
                f"question {q.key!r} differs from the one {made} under that id (its wording, options or "
                f"descriptions changed): answered without the {made} settings; {again} it again to use them"
            )
        return self.default, None

    def beside(self, home: str) -> Methods:
        """These methods with each tuned classifier's task file found in `home` (the decision task's folder)."""
        saved = {k: replace(m, tuned=os.path.join(home, m.tuned)) if m.tuned else m for k, m in self.saved.items()}
        return replace(self, saved=saved)

    @property
    def heads(self) -> list[Head]:
        """The trained heads of the saved methods (each checked against the model it runs on)."""
        return [m.head for m in self.saved.values() if m.head is not None]

    def with_default(self, **changes: Any) -> Methods:
        return replace(self, default=replace(self.default, **changes))

    def to_list(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in self.saved.values()]

    @classmethod
    def from_record(
        cls, methods: Any, temperatures: Mapping[str, Any], questions: Sequence[DecisionQuestion], where: str
    ) -> Methods:
        """A task's saved methods: its `methods` list, and (tasks of before) its `temperatures` by
        key, each read as a temperature-only fit of the task's question of that key."""
        got: list[Method] = []
        if methods is not None:
            if not isinstance(methods, list):
                raise DecisionError((), f"{where}: 'methods' is a list of fitted questions")
            got += [Method.from_dict(m, f"{where}: method {i}") for i, m in enumerate(methods, 1)]
        by_key = {q.key: q for q in questions}
        for key, t in (temperatures or {}).items():
            why = temperature_problem(t)
            if why is not None:
                raise DecisionError((), f"{where}: the temperature of question {str(key)[:60]!r} {why}")
            q = by_key.get(key)
            if q is None:
                raise DecisionError((), f"{where}: a temperature for {key!r}, which is none of the task's questions")
            labels = q.answer_names()
            cal = Calibrator("fit", labels, (0.0,) * len(labels), float(t), 0, {"from": "temperatures"})
            got.append(Method(calibrator=cal, key=key, digest=q.digest))
        by_digest = {q.digest: q for q in questions}
        before = {q.digest_before: q.digest for q in questions if q.digest_before != q.digest}
        # a task saved before a score's level labels were in its digest: its methods are its own questions'
        got = [
            replace(m, digest=before[m.digest]) if m.digest in before and m.digest not in by_digest else m for m in got
        ]
        for m in got:  # a task edited by hand: a saved calibration, head or none option not its question's
            if m.digest in by_digest:  # (a method for none of them: `DecisionPlan.loaded`, under the model's
                m.check(by_digest[m.digest])  # decision settings, which a noul's digest depends on)
        return cls.of(got)


def trained_phrase(trained: str) -> str:
    """How a summary or report names a record's `trained`: "head" (on the decision prompt),
    "learned head" (a classifier's head, the question its own prompt), "fine-tuned"."""
    known = {"head": "trained head", "learned head": "trained head (the question its own prompt)"}
    return {**known, "fine-tuned": "fine-tuned classifier"}.get(trained, f"trained ({trained})")


def tuned_prompt(q: DecisionQuestion, typed: bool = True) -> tuple[str, tuple[str, ...]]:
    """A tuned classifier's system message and labels for `q`: the question as the names style asks
    it (its options listed by name, however many; a noul's Yes/No), and the names it answers with,
    in `q`'s option order (braces doubled where `typed`: the message is filled as typed; else as
    it is, the "prompt" style's, built here and never filled). The listing is what
    `classify`'s own prompt gives its fine-tune: on BANKING77 (77 intents, 10 labelled a intent) the
    instructions alone fine-tuned to 0.851 and the listed question to 0.862, as `classify`'s 0.862
    (benchmarks/results/decision-accuracy.md). It costs training steps (every step reads it); an
    answer reads it once, as the classifier's cached prompt head."""
    named = styled(q, "names")
    said = names_text(named)
    return (said.replace("{", "{{").replace("}", "}}") if typed else said), tuple(named.labels)


def order_back(p: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """Probabilities read in a permuted order (`order[i]`: the option shown i-th) back in the
    question's own order."""
    out = np.empty_like(np.asarray(p, dtype=np.float64))
    out[np.asarray(order)] = p
    return out


def orders(q: DecisionQuestion, n: int) -> list[tuple[int, ...]]:
    """The option orders `q` is asked in: its own, and (n = 2) reversed."""
    k = len(q.options)
    return [tuple(range(k)), tuple(reversed(range(k)))][:n]


def permuted(q: DecisionQuestion, order: Sequence[int], relabel: Any) -> DecisionQuestion:
    """`q` with its options shown in `order` (labels from `relabel(type, names)`: the letters
    follow the shown order, names move with their options)."""
    if list(order) == list(range(len(q.options))):
        return q
    options = tuple(q.options[i] for i in order)
    descriptions = tuple(q.descriptions[i] for i in order)
    moved = replace(q, options=options, descriptions=descriptions, levels=q.levels)
    return replace(moved, labels=relabel(q.type, moved.answer_names()))
