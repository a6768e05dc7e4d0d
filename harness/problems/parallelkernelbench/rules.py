"""Where this harness and PKB's own judge the same file differently, the rule that made the difference.

`compare(ours, pkb)` takes our EvalResult (harness.records.results; the object or its JSON dict) and PKB's verdict
(harness.problems.parallelkernelbench.own_harness.PkbVerdict, object or dict) for the same file, problem and world
size, and says
whether they agree on correctness, whether both count it fast, and, for each difference, which rule of
harness/problems/parallelkernelbench/rules.json explains it, with the evidence it was read from. The rules are data:
an ordered
list of condition sets over both results, each with a one-line explanation; the first that applies names
the difference and the others that apply are listed beside it.

Two kinds of difference:
- verdict: one harness says correct and the other does not;
- speedup: both say correct, and one counts it fast (speedup > 1, and for us no disqualifying flag) while
  the other does not, or their speedups differ by more than the file's `speedup_ratio_tolerance`.

Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

RULES_FILE = Path(__file__).with_name("rules.json")
KINDS = ("verdict", "speedup")
BOOL_CONDITIONS = ("ours_correct", "pkb_correct", "ours_fast_eligible")
LIST_CONDITIONS = ("ours_verdict", "pkb_verdict", "pkb_outcome", "ours_phase")
CONDITIONS = frozenset(BOOL_CONDITIONS + LIST_CONDITIONS + ("ours_flags", "ours_message"))
# Results that are nobody's judgement: left out of the agreement rate and listed apart.
UNJUDGED_VERDICTS = frozenset({"infra_error"})
UNJUDGED_PKB_OUTCOMES = frozenset({"reference_failed", "harness_environment", "no_verdict", "interrupted",
                                   "time_limit"})


@dataclass(frozen=True)
class Facts:
    """What the rules look at, read from both results."""

    ours_correct: bool
    ours_verdict: str
    ours_flags: frozenset[str]
    ours_message: str
    ours_phase: str
    ours_speedup: float | None
    ours_fast_eligible: bool
    pkb_correct: bool
    pkb_verdict: str
    pkb_outcome: str
    pkb_message: str
    pkb_speedup: float | None

    @property
    def ours_fast(self) -> bool:
        return self.ours_correct and self.ours_fast_eligible and self.ours_speedup is not None and self.ours_speedup > 1

    @property
    def pkb_fast(self) -> bool:
        return self.pkb_correct and self.pkb_speedup is not None and self.pkb_speedup > 1

    @property
    def speedup_ratio(self) -> float | None:
        """PKB's speedup over ours (None unless both were timed)."""
        if self.ours_speedup and self.pkb_speedup:
            return self.pkb_speedup / self.ours_speedup
        return None


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def facts(ours: Any, pkb: Any) -> Facts:
    failure = _get(ours, "failure")
    return Facts(
        ours_correct=bool(_get(ours, "correct")), ours_verdict=str(_get(ours, "verdict")),
        ours_flags=frozenset(_get(ours, "flags") or ()),
        ours_message=str(_get(failure, "message", "") or "") if failure is not None else "",
        ours_phase=str(_get(failure, "phase", "") or "") if failure is not None else "",
        ours_speedup=_get(ours, "speedup"), ours_fast_eligible=bool(_get(ours, "fast_eligible", True)),
        pkb_correct=bool(_get(pkb, "correct")), pkb_verdict=str(_get(pkb, "verdict")),
        pkb_outcome=str(_get(pkb, "outcome")), pkb_message=str(_get(pkb, "message", "") or ""),
        pkb_speedup=_get(pkb, "speedup"),
    )


@dataclass(frozen=True)
class Rule:
    id: str
    kind: str
    explain: str
    when: tuple[Mapping[str, Any], ...]  # alternatives; each: every condition must hold

    def applies(self, f: Facts) -> bool:
        return any(self._holds(alternative, f) for alternative in self.when)

    @staticmethod
    def _holds(conditions: Mapping[str, Any], f: Facts) -> bool:
        for key, want in conditions.items():
            if key in BOOL_CONDITIONS:
                if getattr(f, key) != want:
                    return False
            elif key in LIST_CONDITIONS:
                if getattr(f, key) not in want:
                    return False
            elif key == "ours_flags":
                if not f.ours_flags & set(want):
                    return False
            elif key == "ours_message":
                if not re.search(want, f.ours_message):
                    return False
        return True


@dataclass(frozen=True)
class RuleBook:
    rules: tuple[Rule, ...]
    speedup_ratio_tolerance: float

    def matching(self, kind: str, f: Facts) -> list[Rule]:
        return [r for r in self.rules if r.kind == kind and r.applies(f)]

    def explain(self, rule_id: str) -> str:
        return next(r.explain for r in self.rules if r.id == rule_id)


def parse_rules(data: Mapping[str, Any], where: str = "rules") -> RuleBook:
    """A RuleBook from the JSON document; ValueError naming the first thing that is wrong."""
    tolerance = float(data.get("speedup_ratio_tolerance", 1.25))
    if tolerance < 1.0:
        raise ValueError(f"{where}: speedup_ratio_tolerance must be at least 1, not {tolerance}")
    rules = []
    for i, raw in enumerate(data.get("rules") or []):
        rid, kind, explain = raw.get("id"), raw.get("kind"), raw.get("explain")
        if not isinstance(rid, str) or not rid or kind not in KINDS or not isinstance(explain, str) or not explain:
            raise ValueError(f"{where}: rule {i} needs an id, a kind ({', '.join(KINDS)}) and an explanation")
        if "\n" in explain:
            raise ValueError(f"{where}: rule {rid!r}: the explanation must be one line")
        when = raw.get("when", {})
        alternatives = tuple(when) if isinstance(when, list) else (when,)
        for alt in alternatives:
            if not isinstance(alt, Mapping):
                raise ValueError(f"{where}: rule {rid!r}: `when` must be an object or a list of objects")
            unknown = set(alt) - CONDITIONS
            if unknown:
                raise ValueError(f"{where}: rule {rid!r}: unknown condition(s) {sorted(unknown)}")
            for key in BOOL_CONDITIONS:
                if key in alt and not isinstance(alt[key], bool):
                    raise ValueError(f"{where}: rule {rid!r}: {key} must be true or false")
            for key in (*LIST_CONDITIONS, "ours_flags"):
                if key in alt and not (isinstance(alt[key], list) and all(isinstance(v, str) for v in alt[key])):
                    raise ValueError(f"{where}: rule {rid!r}: {key} must be a list of strings")
            if "ours_message" in alt:
                re.compile(alt["ours_message"])
        rules.append(Rule(rid, kind, explain, alternatives))
    speedup_rules = [r for r in rules if r.kind == "speedup"]
    if not speedup_rules or speedup_rules[-1].when != ({},):
        raise ValueError(f"{where}: the last speedup rule must apply always (`when`: {{}}), so every speedup "
                         "difference is named")
    return RuleBook(tuple(rules), tolerance)


@lru_cache(maxsize=4)
def load_rules(path: Path = RULES_FILE) -> RuleBook:
    return parse_rules(json.loads(Path(path).read_text()), str(path))


@dataclass
class Difference:
    kind: str  # "verdict" or "speedup"
    rule: str  # the first rule that applies, or "unexplained"
    explain: str
    also: list[str] = field(default_factory=list)  # other rules that apply too
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Comparison:
    """Both verdicts on one file, and every difference with the rule that explains it."""

    ours_verdict: str
    pkb_verdict: str
    pkb_outcome: str
    agree: bool  # the same answer to "is it correct?"
    judged: bool  # both harnesses judged it (neither could not run it here): counts toward the agreement rate
    same_verdict: bool
    ours_speedup: float | None
    pkb_speedup: float | None
    ours_fast: bool
    pkb_fast: bool
    differences: list[Difference] = field(default_factory=list)

    @property
    def rules(self) -> list[str]:
        return [d.rule for d in self.differences]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


UNEXPLAINED = "unexplained"


def _difference(kind: str, matched: list[Rule], evidence: dict[str, Any]) -> Difference:
    if not matched:
        return Difference(kind, UNEXPLAINED,
                          "no rule of harness/problems/parallelkernelbench/rules.json applies: read both records",
                          evidence=evidence)
    return Difference(kind, matched[0].id, matched[0].explain, [r.id for r in matched[1:] if r.id != matched[0].id],
                      evidence)


def compare(ours: Any, pkb: Any, book: RuleBook | None = None) -> Comparison:
    """Our EvalResult against PKB's verdict on the same file (objects or their dicts)."""
    book = book or load_rules()
    f = facts(ours, pkb)
    differences: list[Difference] = []
    base = {"ours": {"verdict": f.ours_verdict, "message": f.ours_message[:300], "flags": sorted(f.ours_flags)},
            "pkb": {"verdict": f.pkb_verdict, "outcome": f.pkb_outcome, "message": f.pkb_message[:300]}}
    if f.ours_correct != f.pkb_correct:
        differences.append(_difference("verdict", book.matching("verdict", f), base))
    elif f.ours_correct and f.ours_speedup is not None and f.pkb_speedup is not None:
        ratio = f.speedup_ratio
        tol = book.speedup_ratio_tolerance
        beyond = ratio is not None and not (1 / tol <= ratio <= tol)
        if f.ours_fast != f.pkb_fast or beyond:
            evidence = {**base, "ours_speedup": f.ours_speedup, "pkb_speedup": f.pkb_speedup,
                        "pkb_over_ours": round(ratio, 4) if ratio else None, "ours_fast_eligible": f.ours_fast_eligible}
            trials = _get(pkb, "trials") or []
            spreads = [_rank_spread(_get(t, "solution_rank_ms") or []) for t in trials]
            if any(s is not None for s in spreads):
                evidence["pkb_solution_rank_spread"] = spreads  # slowest over fastest rank mean, per trial
            differences.append(_difference("speedup", book.matching("speedup", f), evidence))
    judged = f.ours_verdict not in UNJUDGED_VERDICTS and f.pkb_outcome not in UNJUDGED_PKB_OUTCOMES
    return Comparison(ours_verdict=f.ours_verdict, pkb_verdict=f.pkb_verdict, pkb_outcome=f.pkb_outcome,
                      agree=f.ours_correct == f.pkb_correct, judged=judged,
                      same_verdict=f.ours_verdict == f.pkb_verdict,
                      ours_speedup=f.ours_speedup, pkb_speedup=f.pkb_speedup, ours_fast=f.ours_fast,
                      pkb_fast=f.pkb_fast, differences=differences)


def _rank_spread(means: list[float]) -> float | None:
    values = [m for m in means if m and m > 0]
    return round(max(values) / min(values), 4) if len(values) > 1 else None
