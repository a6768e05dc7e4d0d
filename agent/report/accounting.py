"""Every problem accounted for, and what was never measured: the facts the report and the export state before
any number. Pure (no I/O): it reads sample records and their result.json as agent.report.run_reader stored them.

- The denominator of an arm is the problems its run *asked* for (run.json's config `problems`), each with the
  samples it asked for (`samples`; a replay run scores every file it finds: at least one a problem). A problem
  is *judged* in an arm when it has at least k finished samples that are not `infra_error` (what pass@k needs);
  every other asked problem is *excluded*, named with why: no sample yet, samples still running, infra_error
  samples (with their short cause), too few judged samples. An arm with an excluded problem, an infra_error
  sample left, or an asked sample not finished, is *incomplete*: its numbers are shown over the judged
  problems and over all the asked ones (an infra_error, a sample never started or never finished counted as
  not solved).
- Speed is *not measured* where ranks shared a GPU (emulated: `--ranks-per-gpu` above 1, or every correct
  sample's result says so) or where nothing was timed (`--no-timing`, or no correct sample has a speedup):
  fast_p, speedups and their geometric mean are then "—" with that reason, never 0. CPU timings are measured,
  and labelled as what they are (harness.common.flags.timing_note).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.common import failures
from harness.common.flags import is_emulated
from harness.common.terminal import terminal_safe

# Why fast_p and speedups were not measured (shown beside every "—" that stands for them).
EMULATED_REASON = "emulated: ranks shared a GPU"
UNTIMED_REASON = "untimed (--no-timing)"
NO_TIMING_REASON = "untimed: no correct sample was timed"
NOT_MEASURED = "not measured"

NOT_STARTED = "not_started"  # the failure class of an asked sample that has no sample.json
UNFINISHED = "unfinished"  # sample.json says "running": a provider outage or a run stopped mid-way
MESSAGE_CHARS = 240  # an export's `message`: the first line, at most this long

# -- one sample ---------------------------------------------------------------------------------------
def clean_line(text: Any, limit: int = MESSAGE_CHARS) -> str:
    """The first non-empty line of `text`, without what a terminal would obey (harness.common.terminal) or any
    other control or format character (a candidate's error text reaches terminals and tables), at most `limit`
    characters."""
    for line in terminal_safe(str(text or "")).splitlines():
        kept = "".join(" " if ch == "\t" else ch for ch in line
                       if ch == "\t" or not unicodedata.category(ch).startswith("C"))
        kept = " ".join(kept.split())
        if kept:
            return kept if len(kept) <= limit else kept[: limit - 1] + "…"
    return ""


def _failure(result: Mapping[str, Any] | None) -> Mapping[str, Any]:
    failure = (result or {}).get("failure")
    return failure if isinstance(failure, Mapping) else {}


def infra_cause(record: Mapping[str, Any], result: Mapping[str, Any] | None) -> str | None:
    """A short cause of an infra_error sample ("multicast (refused)", "sandbox failed to start", "needs a CUDA device"),
    None for any other verdict."""
    if record.get("verdict") != failures.INFRA_ERROR:
        return None
    failure = _failure(result)
    cause = str(failure.get("infra_cause") or "")
    message = str(failure.get("message") or "")
    lowered = message.lower()
    # the emulation's refusal names the API it refused (harness.emulation.errors); so does a machine without it
    if cause in ("emulation", "environment", "") and ("multicast" in lowered or "multimem" in lowered):
        return "multicast (refused)"
    if cause == "emulation":
        for kind, text in (("[nccl]", "NCCL (refused by the emulation)"),
                           ("[symm_mem_op]", "symm_mem op (refused by the emulation)"),
                           ("[symm_mem_api]", "symm_mem API (refused by the emulation)")):
            if kind in lowered:
                return text
    if cause == "environment":
        if "needs cuda" in lowered:
            return failures.NEEDS_CUDA_LABEL
        package = lowered.split("needs the package ", 1)
        if len(package) == 2 and package[1].split():
            return f"needs package {clean_line(package[1].split()[0].rstrip(','), 60)}"
    if cause in failures.INFRA_CAUSE_LABELS:
        return failures.INFRA_CAUSE_LABELS[cause]
    return clean_line(message, 60) or "cause not recorded"


def failure_message(record: Mapping[str, Any], result: Mapping[str, Any] | None) -> str | None:
    """The failure's first line, cleaned (clean_line); None where the sample has none (correct, no code). A
    verdict from a held-out shape takes that shape's message (result.json is the visible shape's)."""
    if record.get("correct") or record.get("status", "finished") != "finished":
        return None
    result_verdict = (result or {}).get("verdict")
    if result_verdict is not None and result_verdict != record.get("verdict"):
        shapes = (record.get("held_out") or {}).get("shapes") if isinstance(record.get("held_out"), Mapping) else None
        for shape in shapes or []:
            if isinstance(shape, Mapping) and shape.get("verdict") == record.get("verdict") and shape.get("message"):
                return clean_line(shape["message"]) or None
    message = _failure(result).get("message")
    if message is None and record.get("error"):
        message = record["error"]
    return clean_line(message) or None


def failure_class(record: Mapping[str, Any]) -> str:
    """The verdict of a finished sample (correct, a failure class, no_code, infra_error); `not_started` for an
    asked sample without sample.json, `unfinished` for one still running."""
    status = record.get("status", "finished")
    if status == NOT_STARTED:
        return NOT_STARTED
    if status != "finished":
        return UNFINISHED
    return str(record.get("verdict") or "no_code")


# -- what a run asked -----------------------------------------------------------------------------------
def asked_problems(config: Mapping[str, Any], manifest: Mapping[str, Any] | None,
                   present: Sequence[str]) -> list[str]:
    """The problems the run asked for, in its order: run.json's config `problems`, else its manifest's, else
    (a run that records neither) those that have samples."""
    for source in (config, manifest or {}):
        listed = source.get("problems")
        if isinstance(listed, list) and listed:
            return list(dict.fromkeys(str(p) for p in listed))
    return sorted(set(present))


def samples_asked(config: Mapping[str, Any]) -> int | None:
    value = config.get("samples")
    return int(value) if isinstance(value, int) and value > 0 else None


# -- one arm ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Excluded:
    """An asked problem left out of the judged view, and why."""

    problem: str
    reason: str
    judged: int  # finished samples that are not infra_error
    asked: int
    infra_error: int
    unfinished: int
    not_started: int
    causes: tuple[str, ...] = ()  # short infra causes, most frequent first

    def as_dict(self) -> dict[str, Any]:
        return {"problem": self.problem, "reason": self.reason, "judged": self.judged, "asked": self.asked,
                "infra_error": self.infra_error, "unfinished": self.unfinished, "not_started": self.not_started,
                "infra_causes": list(self.causes)}


@dataclass(frozen=True)
class Accounting:
    """An arm's denominators: the problems asked, judged and excluded (with why)."""

    asked: tuple[str, ...]
    judged: tuple[str, ...]
    excluded: tuple[Excluded, ...]
    infra_samples: int
    samples_per_problem: dict[str, int] = field(default_factory=dict)  # asked samples, per asked problem
    missing_samples: int = 0  # asked samples not finished: never started, or still running

    @property
    def complete(self) -> bool:
        return not self.excluded and self.infra_samples == 0 and self.missing_samples == 0

    def as_dict(self) -> dict[str, Any]:
        return {"complete": self.complete, "asked": len(self.asked), "judged": len(self.judged),
                "asked_problems": list(self.asked), "judged_problems": list(self.judged),
                "excluded": [e.as_dict() for e in self.excluded], "infra_samples": self.infra_samples,
                "missing_samples": self.missing_samples}


def _causes(rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None]]) -> tuple[str, ...]:
    found = Counter(c for r, res in rows if (c := infra_cause(r, res)) is not None)
    return tuple(c for c, _ in found.most_common())


def _reason(judged: int, asked: int, k: int, infra: int, unfinished: int, not_started: int,
            causes: tuple[str, ...]) -> str:
    parts = []
    if infra:
        parts.append(f"{infra} infra_error" + (f" ({', '.join(causes)})" if causes else ""))
    if unfinished:
        parts.append(f"{unfinished} unfinished")
    if not_started:
        parts.append(f"{not_started} not started")
    what = "; ".join(parts)
    if judged == 0:
        return f"no sample judged: {what}" if what else "no sample judged"
    return f"{judged} of {asked} samples judged, pass@{k} needs {k}" + (f": {what}" if what else "")


def account(records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any] | None],
            asked: Sequence[str], samples: int | None, k: int) -> Accounting:
    """The accounting of one arm's records (results[i] is records[i]'s result.json, None where none)."""
    by_problem: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any] | None]]] = {}
    for record, result in zip(records, results, strict=True):
        by_problem.setdefault(str(record.get("problem")), []).append((record, result))
    problems = list(dict.fromkeys([*asked, *sorted(by_problem)]))  # a sample of a problem not asked still counts
    judged: list[str] = []
    excluded: list[Excluded] = []
    per_problem: dict[str, int] = {}
    infra_total = missing = 0
    for problem in problems:
        rows = by_problem.get(problem, [])
        finished = [(r, res) for r, res in rows if r.get("status", "finished") == "finished"]
        infra = [(r, res) for r, res in finished if r.get("verdict") == failures.INFRA_ERROR]
        n_judged = len(finished) - len(infra)
        n_asked = max(samples or 1, len(rows))
        per_problem[problem] = n_asked
        unfinished = len(rows) - len(finished)
        not_started = max(0, n_asked - len(rows))
        infra_total += len(infra)
        missing += unfinished + not_started
        if n_judged >= k:
            judged.append(problem)
            continue
        causes = _causes(infra)
        excluded.append(Excluded(problem, _reason(n_judged, n_asked, k, len(infra), unfinished, not_started, causes),
                                 n_judged, n_asked, len(infra), unfinished, not_started, causes))
    return Accounting(tuple(problems), tuple(judged), tuple(excluded), infra_total, per_problem, missing)


def speed_not_measured(records: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> str | None:
    """Why an arm's speed (fast_p, speedups, their geometric mean) was not measured; None where it was. A run
    whose ranks shared GPUs, or that ran --no-timing, measured none; otherwise an arm whose correct samples are
    all emulated, or all untimed. An arm with no correct sample measured that none is fast."""
    if int(config.get("ranks_per_gpu") or 1) > 1:
        return EMULATED_REASON
    if config.get("skip_timing") is True:
        return UNTIMED_REASON
    correct = [r for r in records if r.get("status", "finished") == "finished" and r.get("correct")]
    if correct and all(is_emulated(r) for r in correct):
        return EMULATED_REASON
    if correct and all(r.get("speedup") is None for r in correct):
        return NO_TIMING_REASON
    return None


def sample_speed_not_measured(record: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """Why one sample's speed was not measured (its fast_1 is then unknown, not false); None where it was or
    where it needs none (a wrong sample is never fast)."""
    if int(config.get("ranks_per_gpu") or 1) > 1 or is_emulated(record):
        return EMULATED_REASON if record.get("correct") else None
    if not record.get("correct"):
        return None
    if record.get("speedup") is None:
        return UNTIMED_REASON if config.get("skip_timing") is True else NO_TIMING_REASON
    return None


def not_measured_text(reason: str) -> str:
    """The cell of a figure that was not measured: a dash and the reason, never 0."""
    return f"— ({NOT_MEASURED}: {reason})"


# -- said in words ---------------------------------------------------------------------------------------
def incomplete_line(label: str, accounts: Mapping[str, Any]) -> str:
    """One sentence on an incomplete arm (Accounting.as_dict()): what was judged, each problem left out and
    why, the infra_error samples left."""
    excluded = accounts.get("excluded") or []
    text = f"{label}: {accounts['judged']} of {accounts['asked']} asked problems judged"
    if excluded:
        text += "; left out: " + "; ".join(f"{e['problem']} ({e['reason']})" for e in excluded)
    if accounts.get("infra_samples"):
        text += f"; {accounts['infra_samples']} infra_error sample(s) not judged again yet"
    if accounts.get("missing_samples"):
        text += f"; {accounts['missing_samples']} asked sample(s) not started or unfinished"
    return text


INCOMPLETE_TITLE = "Incomplete"
INCOMPLETE_HELP = ("numbers are shown over the judged problems and over all asked problems (what was not judged "
                   "counted as not solved); comparisons use only problems judged in both arms")


def run_summary_lines(records: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any] | None],
                      config: Mapping[str, Any], manifest: Mapping[str, Any] | None = None) -> list[str]:
    """What the end of `pkb run` should say beside its table (plain text, one line each): per condition, the
    problems left out and why when the run is incomplete, and the speed that was not measured. k = 1: a problem
    counts as judged with one judged sample. Empty for a complete, measured run."""
    asked = asked_problems(config, manifest, [str(r.get("problem")) for r in records])
    out = []
    conditions = list(dict.fromkeys([*(str(c) for c in config.get("conditions") or []),
                                     *(str(r.get("condition")) for r in records)]))
    for condition in conditions:
        pairs = [(r, res) for r, res in zip(records, results, strict=True) if str(r.get("condition")) == condition]
        accounts = account([r for r, _ in pairs], [res for _, res in pairs], asked, samples_asked(config), 1)
        if not accounts.complete:
            out.append(f"{INCOMPLETE_TITLE}: " + incomplete_line(condition, accounts.as_dict()))
        reason = speed_not_measured([r for r, _ in pairs], config)
        if reason is not None:
            out.append(f"{condition}: fast_p and speedups {NOT_MEASURED} ({reason})")
    return out
