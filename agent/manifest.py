"""What produced a run, in one record: run.json's (and search.json's) "manifest", and how two are compared.

    {"schema": "pkb-manifest/1",
     "code": {"commit": "4076da7...", "dirty": true, "diff_sha256": "...", "version": "0.1.0",
              "changed": {"agent/runner.py": "<sha256 of its content>", "tools/old.py": null}},
     "problem_source": {"kind": "suite"} | {"kind": "pkb", "path": "/abs/checkout", "commit": "...", "dirty": false,
                                   "diff_sha256": null, "changed": {}, "tree_sha256": "..."},
     "problem_sha256": {"all_reduce": "<sha256 of its source>", ...},
     "prompts_sha256": "<sha256 over prompts.hashes()>",
     "model": {"model": "openai:gpt-5.5", "temperature": null, "reasoning_effort": "high", ...},
     "seed": 0, "trials": 5, "budgets": {...}, "samples": 3, "device": "cuda", "world_size": 2,
     "ranks_per_gpu": 1, "shape": "default", "skip_timing": false, "guide_in_prompt": true, "precision": "bf16", ...,
     "executor": "local",
     "hardware": {"fingerprint": "<harness.records.environment.hardware_key>", "gpus": [...], "gpu_count": 1,
                  "cpu_count": 16, "platform": "..."}}

`code.changed` maps each file of the project that differs from its commit to the sha256 of its content then
(null: deleted): the tracked files git sees changed, and untracked files inside the project's source folders
(SOURCE_FOLDERS: new code). Nothing else counts: an untracked file elsewhere (a folder of solutions, a report
written beside the checkout) and every ignored file (runs/, caches) never change it. `code.dirty` says whether
anything changed; `diff_sha256` hashes `changed`, so two trees with different edits are told apart and two with
the same edits agree. `code_differences(a, b)` names the files in which two runs' code differs. Outside a git
checkout (an installed package) commit and dirty are null and `version` is what identifies the code.

`comparable(header)` flattens a run header into the keys a comparison must hold equal ("code.commit",
"model.temperature", "budgets", "hardware.fingerprint", ...); a run written before manifests existed has
null for what only a manifest records, so it never silently agrees with a run that has one. What may differ
between the two sides of a comparison is only the compared factor (agent.report.compare): the condition, or
the model with its settings (MODEL_KEYS).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = "pkb-manifest/1"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT_S = 20.0
# The project's source folders: an untracked file inside one is new code and changes the code's hash.
SOURCE_FOLDERS = ("agent", "harness", "tools", "problems", "prompts")

# The run config's keys that make up "the model": a comparison of two models may differ in all of them.
MODEL_KEYS = ("model", "temperature", "max_reply_tokens", "reasoning_effort", "thinking_budget", "base_url",
              "api_key_env", "models", "context_window", "prices")
# The run config's keys that describe the experiment besides the model and the condition: they must agree.
# "precision": a PKB checkout's dtype and tolerance, and the precision PKB's prompt names (null: this suite's own).
SETTING_KEYS = ("samples", "problems", "source", "device", "world_size", "ranks_per_gpu", "shape", "budgets", "seed",
                "trials", "skip_timing", "guide_in_prompt", "answer_tokens", "context_share", "prompt_cache",
                "precision")
# The comparable view's keys of the model's settings start with this.
MODEL_PREFIX = "model."


def _git(path: Path, *args: str) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _content_sha256(path: Path) -> str | None:
    """The sha256 of a changed file as it is now (a link: of its target's name); None where it is gone."""
    digest = hashlib.sha256()
    try:
        if path.is_symlink():
            digest.update(b"link:" + os.fsencode(os.readlink(path)))
        else:
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    except FileNotFoundError:
        return None
    except OSError as err:  # unreadable: recorded as such, so it never matches a readable file
        return f"unreadable: {err.strerror or err}"
    return digest.hexdigest()


def _names(raw: bytes) -> list[str]:
    return [os.fsdecode(name) for name in raw.split(b"\0") if name]


def git_state(path: Path, untracked_in: Sequence[str] | None = None) -> dict[str, Any]:
    """The commit checked out at `path` (the top of its work tree), the files that differ from it with their
    content's hash (module doc), whether there are any, and one hash over them; nulls where `path` is not the top
    of a git work tree or git is missing. Untracked files count only inside `untracked_in` (folders of the tree;
    None: anywhere); ignored files never."""
    top = _git(path, "rev-parse", "--show-toplevel")
    if top is None or Path(top.decode().strip()).resolve() != path.resolve():
        return {"commit": None, "dirty": None, "diff_sha256": None, "changed": None}
    commit = _git(path, "rev-parse", "HEAD")
    tracked = _git(path, "diff", "HEAD", "--name-only", "--no-renames", "-z")
    if untracked_in is None:
        untracked = _git(path, "ls-files", "--others", "--exclude-standard", "-z")
    elif untracked_in:
        untracked = _git(path, "ls-files", "--others", "--exclude-standard", "-z", "--", *untracked_in)
    else:
        untracked = b""
    if commit is None or tracked is None or untracked is None:
        return {"commit": None, "dirty": None, "diff_sha256": None, "changed": None}
    changed = {name: _content_sha256(path / name) for name in sorted(set(_names(tracked) + _names(untracked)))}
    digest = hashlib.sha256(json.dumps(changed, sort_keys=True).encode()).hexdigest() if changed else None
    return {"commit": commit.decode().strip(), "dirty": bool(changed), "diff_sha256": digest, "changed": changed}


@lru_cache(maxsize=1)
def code_state() -> dict[str, Any]:
    """This project's code: its git state (once per process: the code a process runs is what it loaded) and version."""
    from agent.versions import versions  # light, but only needed here

    return {**git_state(PROJECT_ROOT, SOURCE_FOLDERS), "version": versions().get("pkb_agent")}


def source_record(source: str | None, problem_hashes: Mapping[str, str]) -> dict[str, Any]:
    """This suite, or a PKB checkout: its commit when it is a git checkout, and a hash of its problems' sources."""
    if not source:
        return {"kind": "suite"}
    path = Path(source.partition(":")[2]).expanduser().resolve()
    tree = hashlib.sha256(json.dumps(dict(sorted(problem_hashes.items()))).encode()).hexdigest()
    return {"kind": "pkb", "path": str(path), **git_state(path), "tree_sha256": tree}


def prompts_digest(hashes: Mapping[str, str]) -> str:
    """One hash over every prompt file's hash (run.json keeps them one by one in prompt_hashes)."""
    return hashlib.sha256(json.dumps(dict(sorted(hashes.items()))).encode()).hexdigest()


def hardware(env: Mapping[str, Any]) -> dict[str, Any]:
    """What changes timings, with one fingerprint over it (harness.records.environment.hardware_key)."""
    from harness.records.environment import hardware_key  # torch: only when a manifest is written

    return {"fingerprint": hardware_key(dict(env)), "gpus": env.get("gpus"), "gpu_count": env.get("gpu_count"),
            "driver": env.get("driver"), "cuda": env.get("cuda"), "cpu_count": env.get("cpu_count"),
            "platform": env.get("platform"), "torch": env.get("torch")}


def build(config: Mapping[str, Any], *, problem_hashes: Mapping[str, str], prompt_hashes: Mapping[str, str],
          environment: Mapping[str, Any], executor: str | None) -> dict[str, Any]:
    """The manifest of a run (or a search) with this config (a RunConfig's dump, or a SearchConfig's)."""
    records = {
        "schema": MANIFEST_SCHEMA,
        "code": code_state(),
        "problem_source": source_record(config.get("source"), problem_hashes),
        "problem_sha256": dict(sorted(problem_hashes.items())),
        "prompts_sha256": prompts_digest(prompt_hashes),
        "model": {key: config.get(key) for key in MODEL_KEYS if key in config},
        "executor": executor,
        "hardware": hardware(environment),
    }
    settings = {key: config.get(key) for key in SETTING_KEYS if key in config}
    assert not set(settings) & set(records), "a setting would hide a record of the manifest"
    return {**records, **settings}


def problem_hashes(problems: Iterable[Any]) -> dict[str, str]:
    """name -> the hash of everything that defines its reference (harness.problems.problem.Problem.source_sha256)."""
    return {p.name: p.source_sha256 for p in problems}


# -- comparing --------------------------------------------------------------------------------------
def comparable(header: Mapping[str, Any]) -> dict[str, Any]:
    """A run header as flat keys that two sides of a comparison must share (see the module doc). The config is
    authoritative for the settings; the manifest adds what only it records (null for a run without one)."""
    config = header.get("config") or {}
    manifest = header.get("manifest") or {}
    code = manifest.get("code") or {}
    source = manifest.get("problem_source") or {}
    out: dict[str, Any] = {
        "code.commit": code.get("commit"), "code.dirty": code.get("dirty"), "code.diff_sha256": code.get("diff_sha256"),
        "code.version": code.get("version", (header.get("versions") or {}).get("pkb_agent")),
        "source.commit": source.get("commit"), "source.tree_sha256": source.get("tree_sha256"),
        "prompts_sha256": prompts_digest(header.get("prompt_hashes") or {}),
        "executor": manifest.get("executor"),
        "hardware.fingerprint": (manifest.get("hardware") or {}).get("fingerprint"),
    }
    for name, digest in (manifest.get("problem_sha256") or {}).items():
        out[f"problem_sha256.{name}"] = digest
    for key in MODEL_KEYS:
        out[MODEL_PREFIX + key] = config.get(key)
    for key in SETTING_KEYS:
        out[key] = config.get(key)
    return out


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Keys of two comparable views whose values differ (a key only one side has differs), sorted."""
    return sorted(k for k in set(a) | set(b) if not _same(a.get(k), b.get(k)))


def common(views: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """What several views share, and the keys on which they do not all agree (those take the first's value)."""
    views = list(views)
    if not views:
        return {}, []
    keys = sorted({k for v in views for k in v})
    differ = [k for k in keys if any(not _same(views[0].get(k), v.get(k)) for v in views[1:])]
    return {k: views[0].get(k) for k in keys}, differ


# -- which files differ -------------------------------------------------------------------------------
UNCHANGED = "unchanged"  # a file as its commit has it, in code_differences


def _code(header: Mapping[str, Any]) -> Mapping[str, Any]:
    return (header.get("manifest") or {}).get("code") or {}


def _commit_diff(a: str, b: str) -> set[str] | None:
    """Files that differ between two commits of this project's repository; None where either is unknown here."""
    raw = _git(PROJECT_ROOT, "diff", "--name-only", "--no-renames", "-z", a, b)
    return None if raw is None else set(_names(raw))


def code_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str] | None:
    """The files in which two runs' code differs (run headers, each with a manifest), sorted; None where the
    manifests cannot tell (no commit, no per-file record: runs written before it existed, or commits this
    checkout does not have). A file changed in one tree only counts as differing even where the edit matches the
    other commit's version."""
    code_a, code_b = _code(a), _code(b)
    changed_a, changed_b = code_a.get("changed"), code_b.get("changed")
    commit_a, commit_b = code_a.get("commit"), code_b.get("commit")
    if not isinstance(changed_a, dict) or not isinstance(changed_b, dict) or not commit_a or not commit_b:
        return None
    between = set() if commit_a == commit_b else _commit_diff(str(commit_a), str(commit_b))
    if between is None:
        return None
    differ = {name for name in set(changed_a) | set(changed_b)
              if changed_a.get(name, UNCHANGED) != changed_b.get(name, UNCHANGED)}
    differ |= {name for name in between if name not in changed_a or name not in changed_b}
    return sorted(differ)


def code_note(a: Mapping[str, Any], b: Mapping[str, Any], keys: Sequence[str], shown: int = 6) -> str:
    """Where `keys` (differing comparable keys) include the code's: which files differ, as a clause for a message
    ("; the code differs in agent/x.py, notes.md"); "" where the code agrees."""
    if not any(key.startswith("code.") for key in keys):
        return ""
    files = code_differences(a, b)
    if files is None:
        return "; which files of the code differ is not recorded (a run written before per-file hashes, or " \
               "a commit this checkout lacks)"
    if not files:
        return "; the code differs in no file (only in how its state was recorded)"
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return f"; the code differs in {', '.join(files[:shown])}{more}"
