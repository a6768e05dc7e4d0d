"""The messages between the judge and a pool's ranks, typed, in one place. Rank side and judge side; standard
library only (the rank imports it before any problem or candidate).

Requests (judge -> rank) are frozen dataclasses, one per operation, told apart by their `op`. A rank of each
role serves its own set (`REQUESTS[role]`: op -> class), so the same op may mean two things (a trusted rank's
"time_begin" times the reference on the sets it drew, a candidate rank's loads what the judge hands it). On the
pipe a request is a plain dict (`to_wire`), and the rank rebuilds it with `parse_request`, which refuses an
unknown op, a missing or unknown field and a value of the wrong type: the rank acts on typed fields only.

Replies (rank -> judge) are JSON the rank signs (harness.common.channel); a rank runs hostile code, so what
arrives is checked against the reply type of the request's op (`check_reply`: the envelope every reply has,
the fields that op's reply may carry, each of its declared type, sizes bounded) before the judge reads a field
of it. A reply that does not fit is the rank's failure (harness.launch.exchange turns it into one), never a
crash of the judge. The payloads of `trace` and `profile` replies are summaries of a trace with many fields:
they are checked as bounded JSON data, not field by field.
"""

# No `from __future__ import annotations`: TypedDict tells NotRequired fields from required ones only from
# evaluated annotations (Python 3.11), and the checker reads the same annotations.
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NotRequired, TypedDict, Union

# Bounds on what a message may hold (a reply's frame is bounded too: harness.common.channel.MAX_REPLY_BYTES).
MAX_TEXT = 1 << 20  # characters of one string
MAX_ITEMS = 1 << 20  # items of one list or dict
MAX_DEPTH = 32  # nesting of free-form JSON data


class ProtocolError(ValueError):
    """A message that does not fit its type; the text names the field and what is wrong."""


# -- requests -----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Request:
    """Every request: its operation's name is its class's `op`."""

    op: ClassVar[str] = ""


@dataclass(frozen=True, kw_only=True)
class Ping(Request):
    op: ClassVar[str] = "ping"


@dataclass(frozen=True, kw_only=True)
class Exit(Request):
    op: ClassVar[str] = "exit"


@dataclass(frozen=True, kw_only=True)
class Seal(Request):
    """The rank's reply key, sent before any problem or candidate code exists in its process."""

    op: ClassVar[str] = "seal"
    key: bytes


@dataclass(frozen=True, kw_only=True)
class Validate(Request):
    """The distributed reference against the problem's oracle over `trials` trials."""

    op: ClassVar[str] = "validate"
    problem: str
    shape: str
    seed: int
    trials: int


@dataclass(frozen=True, kw_only=True)
class Trace(Request):
    """The reference's collectives and FLOPs on the inputs of (seed, trial), for the roofline."""

    op: ClassVar[str] = "trace"
    problem: str
    shape: str
    seed: int = 0
    trial: int = 0
    flops: bool = True


@dataclass(frozen=True, kw_only=True)
class Profile(Request):
    """A per-rank kernel timeline of the reference (no `candidate`) or of a loaded candidate."""

    op: ClassVar[str] = "profile"
    problem: str
    shape: str
    candidate: str | None = None
    seed: int = 0
    warmup: int = 3
    iters: int = 5
    mode: Literal["timeline", "ncu", "nsys"] = "timeline"
    tag: str = "0"


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One correctness trial of the schedule: its id and kind ("probe": the precision probe's inputs)."""

    id: int
    kind: str


@dataclass(frozen=True, kw_only=True)
class RefTrials(Request):
    """Every correctness trial on a trusted rank: inputs and expected outputs written to `dir`."""

    op: ClassVar[str] = "ref_trials"
    problem: str
    shape: str
    seed: int
    dir: str
    trials: list[TrialSpec]


@dataclass(frozen=True, kw_only=True)
class JudgedCall:
    """A timed call whose output the judge checks: its trial, and whether it is the precision probe."""

    trial: int
    probe: bool = False


@dataclass(frozen=True, kw_only=True)
class RefSets(Request):
    """Timing's input sets on a trusted rank, and the expected outputs of the judged calls."""

    op: ClassVar[str] = "ref_sets"
    problem: str
    shape: str
    seed: int
    trial_base: int
    dir: str
    fresh: int = 0
    judged: list[JudgedCall] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # harness.config.TimingConfig, dumped
    refill: bool = True


@dataclass(frozen=True, kw_only=True)
class RefTimeBegin(Request):
    """A trusted rank's timing of the reference on the sets ref_sets drew."""

    op: ClassVar[str] = "time_begin"
    problem: str
    fresh: bool = False
    clone_inputs: bool = False


@dataclass(frozen=True, kw_only=True)
class Setup(Request):
    """Before the candidate: the problem (its inputs' recipe and a checkout's import path) and every process
    group the inputs name, in order."""

    op: ClassVar[str] = "setup"
    problem: str | None = None
    shape: str | None = None
    groups: list[list[int] | None] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LoadCandidate(Request):
    """Import the candidate file. `problem` and `shape` ride along from senders' shared base; unused here."""

    op: ClassVar[str] = "load_candidate"
    candidate: str
    params: int
    problem: str | None = None
    shape: str | None = None


@dataclass(frozen=True, kw_only=True)
class Call(Request):
    """One call of the candidate on the inputs in the file `inputs`; its output copy goes to `output`."""

    op: ClassVar[str] = "call"
    candidate: str
    inputs: str
    output: str
    previous_output: str | None = None
    return_inputs: str | None = None
    delay_s: float = 0.0
    lazy_delay_s: float = 0.0
    busy_bytes: int = 1 << 20


class Recipe(TypedDict):
    """How a rank draws one call's inputs (harness.common.seeds.fill_recipe; harness.rank.refill.draw)."""

    shared: int
    private: int
    probe: NotRequired[int | None]


@dataclass(frozen=True, kw_only=True)
class CallTimeBegin(Request):
    """A candidate rank's timing set-up: its sets drawn from `set_fills`, else loaded from the files named."""

    op: ClassVar[str] = "time_begin"
    candidate: str
    clone_inputs: bool = False
    set_fills: list[Recipe] | None = None
    sets: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)


TimedKind = Literal["warmup", "timed", "host", "fresh"]


@dataclass(frozen=True, kw_only=True)
class TimePrepare(Request):
    """Before a timed call: hand the previous call's output over (if judged), draw this call's inputs."""

    op: ClassVar[str] = "time_prepare"
    kind: TimedKind
    set: int
    fill: Recipe | None = None
    keep_previous: str | None = None
    check_previous: bool = False


@dataclass(frozen=True, kw_only=True)
class TimeCall(Request):
    """One timed call, on the inputs its `TimePrepare` drew (a call without one is refused)."""

    op: ClassVar[str] = "time_call"
    kind: TimedKind
    set: int
    spin_us: float = 0.0
    fill: Recipe | None = None
    keep_previous: str | None = None
    check_previous: bool = False


@dataclass(frozen=True, kw_only=True)
class TimeEnd(Request):
    """The end of a timing phase: the last judged output handed over, the sets' fingerprints."""

    op: ClassVar[str] = "time_end"
    keep_previous: str | None = None
    check_previous: bool = False


def _table(*classes: type[Request]) -> dict[str, type[Request]]:
    return {cls.op: cls for cls in classes}


# What each role serves ("exit" and "seal" are the serving loop's own; every rank takes them).
REQUESTS: dict[str, dict[str, type[Request]]] = {
    "trusted": _table(Ping, Exit, Seal, Validate, Trace, Profile, RefTrials, RefSets, RefTimeBegin, TimePrepare,
                      TimeCall, TimeEnd),
    "candidate": _table(Ping, Exit, Seal, Setup, LoadCandidate, Call, CallTimeBegin, TimePrepare, TimeCall,
                        TimeEnd, Profile),
}


def to_wire(message: Request) -> dict[str, Any]:
    """The plain dict that travels on a rank's request pipe."""
    return {"op": message.op, **dataclasses.asdict(message)}


def parse_request(raw: object, role: str) -> tuple[Request, str]:
    """(the typed request, its nonce) from what arrived on a rank's request pipe; ProtocolError otherwise."""
    if type(raw) is not dict:
        raise ProtocolError(f"a request must be a dict, not {type(raw).__name__}")
    body = dict(raw)
    op, nonce = body.pop("op", None), body.pop("nonce", "")
    if type(nonce) is not str:
        raise ProtocolError("the request's nonce is not a string")
    served = REQUESTS[role]
    if type(op) is not str or op not in served:
        raise ProtocolError(f"op {op!r} is not served by a {role} rank")
    return _build(served[op], body, op), nonce


def request_for(message: Request | dict[str, Any], role: str) -> Request:
    """A request given typed or as a dict (checked like the rank checks it): the judge's side of the pipe."""
    if isinstance(message, Request):
        if REQUESTS[role].get(message.op) is not type(message):
            raise ProtocolError(f"a {role} rank does not serve {type(message).__name__}")
        return message
    return parse_request(message, role)[0]


# -- replies ------------------------------------------------------------------------------------------
class Collectives(TypedDict, total=False):
    """Collectives the rank's monitor saw during a request (harness.rank.tripwires.CollectiveMonitor.since)."""

    calls: dict[str, int]
    sequence: int


class Reply(TypedDict):
    """What every reply holds. `died` is the judge's own mark of a rank whose process is gone."""

    ok: bool
    rank: int
    op: NotRequired[str]
    seconds: NotRequired[float]
    verdict: NotRequired[str]
    message: NotRequired[str]
    evidence: NotRequired[str]
    flags: NotRequired[list[str]]
    tripwire: NotRequired[list[str]]
    died: NotRequired[bool]


class ReadyReply(Reply, total=False):
    pid: int


class ValidateReply(Reply, total=False):
    max_abs_err: float
    trial: int


class TrialRecord(TypedDict):
    id: int
    fingerprint: list[int] | None
    mutated: bool
    groups: list[list[int] | None]
    seconds: float
    probe_note: NotRequired[str | None]


class RefTrialsReply(Reply, total=False):
    trials: list[TrialRecord]


class RefSetsReply(Reply, total=False):
    refill: bool
    why_not: str | None
    input_sets: int
    set_bytes: int
    l2_bytes: int
    fingerprints: list[list[int] | None]
    mutated: bool
    groups: list[list[int] | None]


class TimeBeginReply(Reply, total=False):
    input_sets: int
    modules: int


class LoadReply(Reply, total=False):
    collectives: Collectives


class CallReply(Reply, total=False):
    collectives: Collectives
    counted: bool
    previous_changed: bool
    unsupported: str | None
    changed_after_return: bool
    input_fingerprint: list[int]
    build: bool


class HandOver(Reply, total=False):
    """A timing request's hand-over of the previous call's output (harness.rank.timed)."""

    kept_bytes: int
    kept_intact: bool


class TimePrepareReply(HandOver, total=False):
    refill_ms: float
    refill_host_ms: float
    refilled: str  # how the call's inputs were made (harness.rank.timed.REFILLED; the judge accepts the plan's)


class TimeCallReply(TimePrepareReply, total=False):
    ms: float
    enqueue_us: float
    barrier_enqueue_us: float


class TimeEndReply(HandOver, total=False):
    fingerprints: list[list[int]]


# op -> the reply's type; None: the envelope is typed, the rest is bounded JSON data (trace, profile).
REPLIES: dict[str, type | None] = {
    "ready": ReadyReply, "ping": Reply, "seal": Reply, "setup": Reply, "validate": ValidateReply,
    "ref_trials": RefTrialsReply, "ref_sets": RefSetsReply, "time_begin": TimeBeginReply,
    "load_candidate": LoadReply, "call": CallReply, "time_prepare": TimePrepareReply, "time_call": TimeCallReply,
    "time_end": TimeEndReply, "trace": None, "profile": None,
}


def check_reply(op: str, reply: object) -> dict[str, Any]:
    """`reply` if it fits the reply type of `op` (see REPLIES), else ProtocolError naming what does not."""
    if type(reply) is not dict:
        raise ProtocolError(f"the reply is a {type(reply).__name__}, not a JSON object")
    kind = REPLIES.get(op, Reply)
    if kind is None:
        envelope = {k: v for k, v in reply.items() if k in Reply.__annotations__}
        _check(envelope, Reply, "reply", 0)
        for key, value in reply.items():
            if key not in envelope:
                _check(value, Any, f"reply.{key}", 1)
    else:
        _check(reply, kind, "reply", 0)
    return reply


# -- the checker ---------------------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls: type[Request] | type, body: dict[str, Any], where: str) -> Any:
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in body if k not in names)
    if unknown:
        raise ProtocolError(f"{where}: unknown field {unknown[0]!r}")
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if f.name not in body and not has_default:
            raise ProtocolError(f"{where}: field {f.name!r} is missing")
    values = {name: _convert(value, hints[name], f"{where}.{name}", 0) for name, value in body.items()}
    return cls(**values)


def _convert(value: Any, hint: Any, where: str, depth: int) -> Any:
    """`value` checked against `hint`; dicts become the dataclasses the hint names (requests' nested parts)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if type(value) is not dict:
            raise ProtocolError(f"{where} must be an object")
        return _build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
        _check(value, list, where, depth)
        return [_convert(item, typing.get_args(hint)[0], f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    _check(value, hint, where, depth)
    return value


def _check(value: Any, hint: Any, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"{where} is nested too deep")
    if hint is Any:
        _check_json(value, where, depth)
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if value is not None and len(others) == 1:  # X | None: say what is wrong with it as an X
            _check(value, others[0], where, depth)
            return
        for option in args:
            try:
                _check(value, option, where, depth)
                return
            except ProtocolError:
                continue
        raise ProtocolError(f"{where} has the wrong type ({type(value).__name__})")
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            raise ProtocolError(f"{where} is not one of {list(args)}")
        return
    if origin is list or hint is list:
        if type(value) is not list or len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where} must be a list of at most {MAX_ITEMS} items")
        for i, item in enumerate(value):
            _check(item, args[0] if args else Any, f"{where}[{i}]", depth + 1)
        return
    if origin is dict:
        if type(value) is not dict or len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where} must be an object of at most {MAX_ITEMS} fields")
        for key, item in value.items():
            if type(key) is not str:
                raise ProtocolError(f"{where} has a key that is not a string")
            _check(item, args[1], f"{where}[{key!r}]", depth + 1)
        return
    if typing.is_typeddict(hint):
        _check_typeddict(value, hint, where, depth)
        return
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if type(value) is not dict:
            _fail(where, "an object")
        _build(hint, value, where)
        return
    _check_scalar(value, hint, where)


def _check_typeddict(value: Any, hint: Any, where: str, depth: int) -> None:
    if type(value) is not dict:
        raise ProtocolError(f"{where} must be an object")
    hints = _hints(hint)
    for key in value:
        if key not in hints:
            raise ProtocolError(f"{where}: unknown field {str(key)[:64]!r}")
    for key in hint.__required_keys__:
        if key not in value:
            raise ProtocolError(f"{where}: field {key!r} is missing")
    for key, item in value.items():
        _check(item, hints[key], f"{where}.{key}", depth + 1)


def _check_scalar(value: Any, hint: Any, where: str) -> None:
    if hint is None or hint is type(None):
        ok = value is None
    elif hint is float:  # JSON writes 2.0 as 2.0, but a whole number may arrive as an int
        ok = type(value) in (int, float)
    elif hint in (bool, int, bytes):
        ok = type(value) is hint
    elif hint is str:
        ok = type(value) is str and len(value) <= MAX_TEXT
    else:
        raise ProtocolError(f"{where}: no check for the type {hint!r}")  # a type this module does not declare
    if not ok:
        _fail(where, getattr(hint, "__name__", str(hint)))


def _fail(where: str, wanted: str) -> None:
    raise ProtocolError(f"{where} must be {wanted}")


def _check_json(value: Any, where: str, depth: int) -> None:
    """Plain JSON data (str, int, float, bool, None, lists, objects with string keys), bounded."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"{where} is nested too deep")
    kind = type(value)
    if value is None or kind in (bool, int, float):
        return
    if kind is str:
        if len(value) > MAX_TEXT:
            raise ProtocolError(f"{where} is longer than {MAX_TEXT} characters")
        return
    if kind is list:
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where} has more than {MAX_ITEMS} items")
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)
        return
    if kind is dict:
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where} has more than {MAX_ITEMS} fields")
        for key, item in value.items():
            if type(key) is not str:
                raise ProtocolError(f"{where} has a key that is not a string")
            _check_json(item, f"{where}[{key[:64]!r}]", depth + 1)
        return
    raise ProtocolError(f"{where} is a {kind.__name__}, not JSON data")
