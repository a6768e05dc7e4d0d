"""The search's archive: every candidate ever proposed, what became of it, and every decision about it.

One SQLite file in the run folder (runs/<id>/archive.sqlite), the single source of truth of a search: the
loop's decisions are read back from it, `--resume` continues from it, the live view and the report read
it. Every change is one transaction, so a search killed at any moment leaves the archive as it was
before or after a step, never half way.

A candidate is a row of `candidates`, keyed by its slot `id` (0, 1, 2, ... over the whole search) and
written in three steps, each recorded as it happens:

    decided    the loop chose its problem, strategy, island and parent(s)
    proposed   the model answered (source, or none; tokens, dollars, the model's seconds; with an agent
               proposer its tool calls and their device seconds)
    evaluated  the harness scored it (verdict, failure evidence, speedup, roofline fraction and binding
               resource, flags, trusted, GPU seconds, stage seconds, the whole EvalResult)

`trusted`: correct, timed, and free of the integrity flags that void a speedup (harness.common.flags). Only trusted
candidates are ever parents, and the best trusted candidates of each problem are re-measured on fresh seeds
and the held-out shapes (table `rescores`: one row per round of agent.remeasure) before a report names one.
`stops` holds why each problem stopped; `island_members` the migrations between islands; `bounds` each
problem's roofline bound; `sessions` each start of the search process (for the wall-clock budget, which
does not count the time a killed search lay dead).

`canonical()` is the archive without what depends on the clock (timestamps, seconds, stage times): two
searches with the same seed, the same model and a deterministic evaluator have equal canonical archives,
however often one of them was killed and resumed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.records.redaction import redact_text

SCHEMA = "pkb-search-archive/1"
DECIDED = "decided"
PROPOSED = "proposed"
EVALUATED = "evaluated"
# Verdicts of candidates that never reached the harness.
NO_CODE = "no_code"
MODEL_ERROR = "model_error"

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY,
    problem TEXT NOT NULL,
    seq INTEGER NOT NULL,
    island INTEGER,
    parents TEXT NOT NULL,
    strategy TEXT NOT NULL,
    selection TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_at TEXT,
    model TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    cost_usd REAL,
    cost_known INTEGER,
    model_s REAL,
    note TEXT,
    source TEXT,
    sha256 TEXT,
    path TEXT,
    proposed_at TEXT,
    verdict TEXT,
    correct INTEGER,
    failure_phase TEXT,
    failure_rank INTEGER,
    failure_message TEXT,
    failure_evidence TEXT,
    speedup REAL,
    candidate_ms REAL,
    reference_ms REAL,
    roofline_fraction REAL,
    binding TEXT,
    flags TEXT,
    fast_eligible INTEGER,
    trusted INTEGER,
    gpu_s REAL,
    stages TEXT,
    eval_s REAL,
    attempts INTEGER,
    result TEXT,
    evaluated_at TEXT,
    elapsed_s REAL,
    proposer_gpu_s REAL,
    tool_calls TEXT,
    UNIQUE (problem, seq)
);
CREATE TABLE IF NOT EXISTS stops (
    problem TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    at_slot INTEGER NOT NULL,
    detail TEXT NOT NULL,
    at TEXT
);
CREATE TABLE IF NOT EXISTS island_members (
    problem TEXT NOT NULL,
    island INTEGER NOT NULL,
    candidate INTEGER NOT NULL,
    since_slot INTEGER NOT NULL,
    PRIMARY KEY (problem, island, candidate)
);
CREATE TABLE IF NOT EXISTS rescores (
    problem TEXT NOT NULL,
    candidate INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    correct INTEGER NOT NULL,
    speedup REAL,
    roofline_fraction REAL,
    flags TEXT NOT NULL,
    trusted INTEGER NOT NULL,
    gpu_s REAL,
    eval_s REAL,
    result TEXT,
    at TEXT,
    record TEXT,
    PRIMARY KEY (problem, candidate, seed)
);
CREATE TABLE IF NOT EXISTS bounds (
    problem TEXT PRIMARY KEY,
    bound_ms REAL,
    binding TEXT,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY,
    started_at TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL,
    active_s REAL NOT NULL,
    executor TEXT,
    capacity INTEGER
);
"""

# Columns that depend on the clock or the machine's speed, left out of canonical().
_CLOCK_COLUMNS = frozenset({"decided_at", "proposed_at", "evaluated_at", "model_s", "stages", "eval_s", "elapsed_s",
                            "result", "path", "gpu_s", "proposer_gpu_s", "at"})
# Columns added after the first archives were written: an older archive gets them (NULL) when it is opened.
_ADDED_COLUMNS = (("candidates", "proposer_gpu_s", "REAL"), ("candidates", "tool_calls", "TEXT"),
                  ("rescores", "record", "TEXT"))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Candidate:
    """One row of `candidates`, as the loop and the strategies see it."""

    id: int
    problem: str
    seq: int
    island: int | None
    parents: list[int]
    strategy: str
    status: str
    verdict: str | None = None
    correct: bool = False
    speedup: float | None = None
    roofline_fraction: float | None = None
    binding: str | None = None
    flags: list[str] = field(default_factory=list)
    trusted: bool = False
    source: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    gpu_s: float = 0.0  # the evaluation's device seconds
    proposer_gpu_s: float = 0.0  # an agent proposer's tools' device seconds (agent.search.episode)
    tool_calls: dict[str, int] = field(default_factory=dict)  # the proposer's tool calls by tool
    candidate_ms: float | None = None
    reference_ms: float | None = None
    failure_message: str | None = None
    elapsed_s: float | None = None
    selection: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status == EVALUATED

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def device_s(self) -> float:
        """Every device second the candidate cost: its proposer's tools and its evaluation."""
        return self.gpu_s + self.proposer_gpu_s


@dataclass
class Stop:
    problem: str
    reason: str
    at_slot: int
    detail: dict[str, Any]


@dataclass
class Rescore:
    problem: str
    candidate: int
    seed: int
    verdict: str
    correct: bool
    speedup: float | None
    roofline_fraction: float | None
    flags: list[str]
    trusted: bool
    gpu_s: float = 0.0
    # The whole round of agent.remeasure (held-out shapes, what the timing was), less its clock fields; None in
    # an archive written before rounds were kept.
    record: dict[str, Any] | None = None


class _Redacting:
    """The archive's connection for writes: every text parameter passes harness.records.redaction first, so no value
    of the harness's secrets (a candidate's output can carry one) reaches the file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, tuple(redact_text(a) if isinstance(a, str) else a for a in args))


class Archive:
    """The archive of one search. Thread-safe: one connection, every call under one lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")  # readers (the live view, a report) never block the loop
        # WAL + NORMAL: a committed step survives any kill of this process; a power cut may lose the last few
        # steps (never corrupts the file), which a resume then redoes. FULL would fsync every step.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_TABLES)
        for table, column, kind in _ADDED_COLUMNS:
            if column not in {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA,))
        found = self.meta("schema")
        if found != SCHEMA:
            raise ValueError(f"{path} is a {found} archive, not {SCHEMA}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[_Redacting]:
        """A transaction; every text written through it is redacted first (harness.records.redaction)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield _Redacting(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args))

    # -- meta -----------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = "
                       "excluded.value", (key, value))

    # -- candidates -----------------------------------------------------------------------------------
    def decide(self, slot: int, problem: str, seq: int, island: int | None, parents: list[int], strategy: str,
               selection: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO candidates (id, problem, seq, island, parents, strategy, selection, status, "
                       "decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (slot, problem, seq, island, json.dumps(parents), strategy,
                        json.dumps(selection, sort_keys=True), DECIDED, now()))

    def propose(self, slot: int, *, model: str, input_tokens: int, output_tokens: int, cost_usd: float,
                cost_known: bool, model_s: float, note: str, source: str | None, sha256: str | None,
                path: str | None, outcome: dict[str, Any] | None = None, proposer_gpu_s: float = 0.0,
                tool_calls: dict[str, int] | None = None) -> None:
        """Record the model's answer (with an agent proposer, its tools' device seconds and calls). A reply
        without code has nothing to evaluate: `outcome` then records its verdict in the same transaction."""
        with self._tx() as db:
            db.execute("UPDATE candidates SET status = ?, model = ?, input_tokens = ?, output_tokens = ?, "
                       "cost_usd = ?, cost_known = ?, model_s = ?, note = ?, source = ?, sha256 = ?, path = ?, "
                       "proposer_gpu_s = ?, tool_calls = ?, proposed_at = ? WHERE id = ? AND status = ?",
                       (PROPOSED, model, input_tokens, output_tokens, cost_usd, int(cost_known), model_s, note,
                        source, sha256, path, proposer_gpu_s, json.dumps(tool_calls or {}, sort_keys=True), now(),
                        slot, DECIDED))
            if outcome is not None:
                self._evaluated(db, slot, outcome)

    def evaluate(self, slot: int, outcome: dict[str, Any]) -> None:
        """Record the evaluation of a proposed candidate; `outcome` has the evaluated columns."""
        with self._tx() as db:
            self._evaluated(db, slot, outcome)

    @staticmethod
    def _evaluated(db: _Redacting, slot: int, outcome: dict[str, Any]) -> None:
        columns = ("verdict", "correct", "failure_phase", "failure_rank", "failure_message", "failure_evidence",
                   "speedup", "candidate_ms", "reference_ms", "roofline_fraction", "binding", "flags",
                   "fast_eligible", "trusted", "gpu_s", "stages", "eval_s", "attempts", "result", "elapsed_s")
        unknown = set(outcome) - set(columns)
        if unknown:
            raise ValueError(f"not columns of an evaluation: {sorted(unknown)}")
        values = [_column(outcome.get(c)) for c in columns]
        sets = ", ".join(f"{c} = ?" for c in columns)
        db.execute(f"UPDATE candidates SET status = ?, {sets}, evaluated_at = ? WHERE id = ? AND status = ?",
                   (EVALUATED, *values, now(), slot, PROPOSED))

    def candidates(self, problem: str | None = None, *, upto: int | None = None) -> list[Candidate]:
        """Candidates in slot order; `upto`: only slots below it."""
        sql, args = "SELECT * FROM candidates WHERE 1 = 1", list[Any]()
        if problem is not None:
            sql += " AND problem = ?"
            args.append(problem)
        if upto is not None:
            sql += " AND id < ?"
            args.append(upto)
        return [_candidate(r) for r in self._rows(sql + " ORDER BY id", args)]

    def candidate(self, slot: int) -> Candidate | None:
        rows = self._rows("SELECT * FROM candidates WHERE id = ?", (slot,))
        return _candidate(rows[0]) if rows else None

    def row(self, slot: int) -> dict[str, Any] | None:
        """Every column of one candidate, for reports."""
        rows = self._rows("SELECT * FROM candidates WHERE id = ?", (slot,))
        return dict(rows[0]) if rows else None

    def rows(self, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every candidate's columns (all of them, or `columns`: the result records are large)."""
        if columns is not None:
            known = {r["name"] for r in self._rows("PRAGMA table_info(candidates)")}
            unknown = [c for c in columns if c not in known]
            if unknown:
                raise ValueError(f"no such column(s): {', '.join(unknown)}")
        picked = ", ".join(columns) if columns is not None else "*"
        return [dict(r) for r in self._rows(f"SELECT {picked} FROM candidates ORDER BY id")]

    def next_slot(self) -> int:
        rows = self._rows("SELECT MAX(id) AS m FROM candidates")
        return 0 if rows[0]["m"] is None else int(rows[0]["m"]) + 1

    # -- stops, islands, bounds, rescores ---------------------------------------------------------------
    def stop(self, problem: str, reason: str, at_slot: int, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO stops (problem, reason, at_slot, detail, at) VALUES (?, ?, ?, ?, ?)",
                       (problem, reason, at_slot, json.dumps(detail, sort_keys=True), now()))

    def stops(self) -> dict[str, Stop]:
        return {r["problem"]: Stop(r["problem"], r["reason"], r["at_slot"], json.loads(r["detail"]))
                for r in self._rows("SELECT * FROM stops ORDER BY at_slot, problem")}

    def add_member(self, problem: str, island: int, candidate: int, since_slot: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO island_members (problem, island, candidate, since_slot) "
                       "VALUES (?, ?, ?, ?)", (problem, island, candidate, since_slot))

    def migrants(self, problem: str) -> list[tuple[int, int, int]]:
        """(island, candidate, since_slot) of every migration of `problem`."""
        return [(r["island"], r["candidate"], r["since_slot"]) for r in
                self._rows("SELECT * FROM island_members WHERE problem = ? ORDER BY since_slot, island, candidate",
                           (problem,))]

    def set_bound(self, problem: str, bound_ms: float | None, binding: str | None, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO bounds (problem, bound_ms, binding, detail) VALUES (?, ?, ?, ?)",
                       (problem, bound_ms, binding, json.dumps(detail, sort_keys=True, default=str)))

    def bounds(self) -> dict[str, tuple[float | None, str | None, dict[str, Any]]]:
        return {r["problem"]: (r["bound_ms"], r["binding"], json.loads(r["detail"]))
                for r in self._rows("SELECT * FROM bounds")}

    def add_rescore(self, r: Rescore, *, eval_s: float, result: str | None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO rescores (problem, candidate, seed, verdict, correct, speedup, "
                       "roofline_fraction, flags, trusted, gpu_s, eval_s, result, at, record) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (r.problem, r.candidate, r.seed, r.verdict, int(r.correct), r.speedup, r.roofline_fraction,
                        json.dumps(sorted(r.flags)), int(r.trusted), r.gpu_s, eval_s, result, now(),
                        None if r.record is None else json.dumps(r.record, sort_keys=True)))

    def rescores(self, problem: str | None = None) -> list[Rescore]:
        sql, args = "SELECT * FROM rescores", list[Any]()
        if problem is not None:
            sql, args = sql + " WHERE problem = ?", [problem]
        return [Rescore(r["problem"], r["candidate"], r["seed"], r["verdict"], bool(r["correct"]), r["speedup"],
                        r["roofline_fraction"], json.loads(r["flags"]), bool(r["trusted"]), r["gpu_s"] or 0.0,
                        json.loads(r["record"]) if r["record"] else None)
                for r in self._rows(sql + " ORDER BY problem, candidate, seed", args)]

    # -- sessions: the search's own wall clock ---------------------------------------------------------
    def start_session(self, executor: str, capacity: int) -> int:
        with self._tx() as db:
            cursor = db.execute("INSERT INTO sessions (started_at, heartbeat_at, active_s, executor, capacity) "
                                "VALUES (?, ?, 0, ?, ?)", (now(), now(), executor, capacity))
            return int(cursor.lastrowid or 0)

    def heartbeat(self, session: int, active_s: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE sessions SET heartbeat_at = ?, active_s = ? WHERE id = ?", (now(), active_s, session))

    def active_s(self, exclude: int | None = None) -> float:
        """Seconds the search has run in all sessions (but `exclude`), up to each one's last heartbeat."""
        rows = self._rows("SELECT SUM(active_s) AS s FROM sessions WHERE id != ?", (exclude if exclude else -1,))
        return float(rows[0]["s"] or 0.0)

    def sessions(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows("SELECT * FROM sessions ORDER BY id")]

    # -- comparison -------------------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Everything but what depends on the clock (see the module doc)."""
        def strip(rows: list[sqlite3.Row]) -> list[dict[str, Any]]:
            return [{k: r[k] for k in r.keys() if k not in _CLOCK_COLUMNS} for r in rows]

        return {
            "candidates": strip(self._rows("SELECT * FROM candidates ORDER BY id")),
            "stops": strip(self._rows("SELECT * FROM stops ORDER BY problem")),
            "island_members": strip(self._rows("SELECT * FROM island_members ORDER BY problem, island, candidate")),
            "rescores": strip(self._rows("SELECT * FROM rescores ORDER BY problem, candidate, seed")),
            "bounds": strip(self._rows("SELECT * FROM bounds ORDER BY problem")),
        }


def _column(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return value


def _candidate(r: sqlite3.Row) -> Candidate:
    return Candidate(
        id=r["id"], problem=r["problem"], seq=r["seq"], island=r["island"], parents=json.loads(r["parents"]),
        strategy=r["strategy"], status=r["status"], verdict=r["verdict"], correct=bool(r["correct"]),
        speedup=r["speedup"], roofline_fraction=r["roofline_fraction"], binding=r["binding"],
        flags=json.loads(r["flags"]) if r["flags"] else [], trusted=bool(r["trusted"]), source=r["source"],
        input_tokens=r["input_tokens"] or 0, output_tokens=r["output_tokens"] or 0, cost_usd=r["cost_usd"] or 0.0,
        cost_known=r["cost_known"] is None or bool(r["cost_known"]), gpu_s=r["gpu_s"] or 0.0,
        proposer_gpu_s=r["proposer_gpu_s"] or 0.0, tool_calls=json.loads(r["tool_calls"]) if r["tool_calls"] else {},
        candidate_ms=r["candidate_ms"], reference_ms=r["reference_ms"], failure_message=r["failure_message"],
        elapsed_s=r["elapsed_s"], selection=json.loads(r["selection"]) if r["selection"] else {},
    )
