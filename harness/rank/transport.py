"""Moving values between processes as data. Rank side and judge side; torch and the standard library.

Two directions, two formats, because they differ in who is trusted:

- **Outputs** (a rank -> the judge): a file the judge parses without running anything it holds. A JSON
  header (its length first) describes the tree of the value: lists, tuples, dicts with string or int
  keys, plain scalars, strided tensors and sparse COO tensors; the tensors' raw bytes follow, each at
  an offset the header names. `read_tree` checks every field of a header written by a process that may
  be hostile (sizes, offsets, dtypes, nesting depth, total bytes) and raises TransportError with a
  one-line reason; it never unpickles, and nothing may follow the last tensor's bytes. The judge opens
  the file through harness.common.hostile_files (no link followed on the way, a regular file, a size limit
  checked before reading), so a candidate cannot point it at a file outside its scratch.
- **Inputs** (the clean reference pool -> a candidate rank): torch.save / torch.load, because PKB inputs
  hold modules, dataclasses and process groups. Only the trusted side writes these and only rank
  processes read them, so pickle runs in the direction where it grants nothing. A process group cannot
  be pickled: it travels as a GroupRef (its ranks) and the candidate rank substitutes the group it
  made for those ranks before the first call (`groups_of`, `with_groups`).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.common import hostile_files
from harness.rank import pristine

HEADER_LIMIT = 16 << 20  # bytes of JSON header a reader accepts
MAX_DEPTH = 32
ALIGN = 64
MAGIC = b"PKBT1\0"
# dtypes a tree may carry; anything else in a header is refused
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2)}


class TransportError(ValueError):
    """A value that cannot be written, or a file that is not a well-formed tree; one line."""


class OutputTooLarge(TransportError):
    """An output file larger than the judge reads for this output (nothing of it was read)."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size, self.limit = size, limit


class UnsupportedValue(TransportError):
    """The value holds something outside the output format (the message names what and where)."""


# -- outputs: writing (in a rank: what runs here runs where the candidate ran) -------------------------
# Everything below reads the candidate's value through harness.rank.pristine (functions bound before any
# candidate existed, torch's modes off) and writes with os functions bound here, at import: a candidate
# that rebinds ctypes.string_at, builtins.open, json or torch.Tensor methods changes nothing written.
_encode_str = getattr(json.encoder, "c_encode_basestring_ascii", None) or json.encoder.encode_basestring_ascii
_int_repr, _float_repr = int.__repr__, float.__repr__
_str_join = str.join


def describe_unsupported(value: Any, where: str = "out") -> str | None:
    """Why `value` cannot travel as an output, or None. Reads types only: it calls nothing on the value
    (sequence items are read through the base class, tensors' attributes through the C getters)."""
    with pristine.quiet():
        return _unsupported(value, where)


def _unsupported(value: Any, where: str) -> str | None:
    kind = pristine.builtin_type(value)
    if kind is torch.Tensor:
        layout, dtype = pristine.layout_of(value), pristine.dtype_of(value)
        if layout is not pristine.strided and layout is not pristine.sparse_coo:
            return f"{where} is a tensor with layout {layout}"
        if str(dtype).removeprefix("torch.") not in DTYPES:
            return f"{where} has dtype {dtype}"
        return None
    if pristine.builtin_isinstance(value, torch.Tensor):
        return f"{where} is a {kind.__module__}.{kind.__name__}, not a plain torch.Tensor"
    # Subclasses too (torch.Size, the named tuples of torch.return_types): they travel as plain tuples
    # and lists, which is all the judge compares; their items are read through the base class, so no
    # method of theirs runs.
    if pristine.builtin_isinstance(value, (list, tuple)):
        for i, item in pristine.builtin_enumerate(pristine.items(value)):
            issue = _unsupported(item, f"{where}[{i}]")
            if issue:
                return issue
        return None
    if kind is dict:
        for key, item in pristine.dict_items(value):
            if pristine.builtin_type(key) not in (str, int):
                return f"{where} has a key of type {pristine.builtin_type(key).__name__}"
            issue = _unsupported(item, f"{where}[{key!r}]")
            if issue:
                return issue
        return None
    if value is None or kind in (bool, int, float, str):
        return None
    return f"{where} is a {kind.__module__}.{kind.__name__}, not a tensor, scalar, list, tuple or dict"


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return pristine.host_bytes(t)


def _json(node: Any) -> str:
    """The header's JSON (dicts with str keys, lists, str, int, finite float, bool, None) from C primitives."""
    kind = pristine.builtin_type(node)
    if node is None:
        return "null"
    if kind is bool:
        return "true" if node else "false"
    if kind is int:
        return _int_repr(node)
    if kind is float:
        return _float_repr(node)
    if kind is str:
        return _encode_str(node)
    if kind is list:
        return "[" + _str_join(",", [_json(x) for x in node]) + "]"
    if kind is dict:
        return "{" + _str_join(",", [_encode_str(str(k)) + ":" + _json(v) for k, v in pristine.dict_items(node)]) + "}"
    raise UnsupportedValue(f"cannot encode a {kind.__name__} in a header")


def write_tree(path: Path, value: Any) -> int:
    """Write `value` (see describe_unsupported) to `path`; return the bytes written. Raises UnsupportedValue."""
    with pristine.quiet():
        issue = _unsupported(value, "out")
        if issue:
            raise UnsupportedValue(issue)
        return _write(path, value)


def _write(path: Path, value: Any) -> int:
    blobs: list[bytes] = []
    offset = 0

    def put(data: bytes) -> int:
        nonlocal offset
        pad = (-offset) % ALIGN
        if pad:
            blobs.append(b"\0" * pad)
            offset += pad
        start = offset
        blobs.append(data)
        offset += len(data)
        return start

    def tensor(t: torch.Tensor) -> dict[str, Any]:
        data = _tensor_bytes(t)
        return {"dtype": str(pristine.dtype_of(t)).removeprefix("torch."),
                "shape": [int(d) for d in pristine.shape_of(t)], "offset": put(data), "nbytes": len(data)}

    def encode(v: Any) -> dict[str, Any]:
        if pristine.builtin_isinstance(v, torch.Tensor):
            if pristine.layout_of(v) is pristine.sparse_coo:
                c = pristine.detach(v)
                c = c if pristine.is_coalesced(c) else pristine.coalesce(c)
                return {"sparse": {"shape": [int(d) for d in pristine.shape_of(v)],
                                   "indices": tensor(pristine.indices(c)), "values": tensor(pristine.values(c))}}
            return {"tensor": tensor(v)}
        if pristine.builtin_isinstance(v, (list, tuple)):
            return {"seq": [encode(x) for x in pristine.items(v)], "tuple": pristine.builtin_isinstance(v, tuple)}
        if pristine.builtin_isinstance(v, dict):
            return {"dict": [[k, encode(x)] for k, x in pristine.dict_items(v)]}
        if pristine.builtin_type(v) is float and not math.isfinite(v):
            return {"float": repr(v)}  # JSON has no NaN or infinity
        return {"value": v}

    header = _json(encode(value)).encode()
    fd = pristine.os_open(str(path), pristine.O_WRONLY | pristine.O_CREAT | pristine.O_TRUNC | pristine.O_NOFOLLOW,
                          0o600)
    try:
        for chunk in (MAGIC + struct.pack("<Q", len(header)) + header, *blobs):
            view = pristine.builtin_memoryview(chunk)
            while pristine.builtin_len(view):
                view = view[pristine.os_write(fd, view):]
    finally:
        pristine.os_close(fd)
    return len(MAGIC) + 8 + len(header) + offset


# -- outputs: reading (the judge; the file may come from a hostile process) --------------------------
def open_untrusted(path: Path, limit: int, folder: hostile_files.Folder | None = None) -> bytes:
    """The bytes of a file a candidate wrote (harness.common.hostile_files: no link followed, not blocking, a
    regular file with one link, at most `limit` bytes). `folder`: the candidate-writable folder it lies in,
    held open by the judge, so no link on the way is followed either."""
    try:
        return folder.read_bytes(path, limit) if folder is not None else hostile_files.read_bytes(path, limit)
    except hostile_files.Missing:
        raise TransportError(f"{path.name} was not written") from None
    except hostile_files.TooLarge as err:
        raise OutputTooLarge(str(err), err.size, err.limit) from None
    except hostile_files.HostileFile as err:
        raise TransportError(str(err)) from None
    except OSError as err:
        raise TransportError(f"{path.name} cannot be read ({err.strerror})") from None


def _int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise TransportError(f"bad {what}: {value!r}")
    return value


def parse_tree(data: bytes) -> Any:
    """The value a well-formed file describes (plain CPU tensors); TransportError for anything else."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise TransportError("not an output file of this harness")
    (size,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    if size > HEADER_LIMIT or start + size > len(data):
        raise TransportError("header size out of range")
    try:
        tree = hostile_files.strict_json(bytes(data[start:start + size]), "the header")
    except hostile_files.HostileFile as err:
        raise TransportError(str(err)) from None
    body = memoryview(data)[start + size:]
    end = 0  # where the last tensor's bytes end: nothing may follow them

    def tensor(node: Any) -> torch.Tensor:
        nonlocal end
        if not isinstance(node, dict):
            raise TransportError("bad tensor entry")
        # Only a string can name a dtype; an unhashable one (a list) would raise TypeError, not TransportError.
        name = node.get("dtype")
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise TransportError(f"dtype {node.get('dtype')!r} is not allowed")
        shape = node.get("shape")
        if not isinstance(shape, list) or len(shape) > 16:
            raise TransportError("bad tensor shape")
        dims = [_int(d, "dimension") for d in shape]
        offset, nbytes = _int(node.get("offset"), "offset"), _int(node.get("nbytes"), "byte count")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if math.prod(dims) * itemsize != nbytes or offset + nbytes > len(body):
            raise TransportError("tensor bytes do not match its shape or lie outside the file")
        end = max(end, offset + nbytes)
        if nbytes == 0:
            return torch.empty(dims, dtype=dtype)
        raw = torch.frombuffer(bytearray(body[offset:offset + nbytes]), dtype=torch.uint8)
        return raw.view(dtype).reshape(dims)

    def decode(node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH or not isinstance(node, dict) or len(node) > 2:
            raise TransportError("malformed tree")
        if "tensor" in node:
            return tensor(node["tensor"])
        if "sparse" in node:
            sparse = node["sparse"]
            if not isinstance(sparse, dict) or not isinstance(sparse.get("shape"), list):
                raise TransportError("bad sparse entry")
            indices, values = tensor(sparse.get("indices")), tensor(sparse.get("values"))
            dims = [_int(d, "dimension") for d in sparse["shape"]]
            if indices.dtype != torch.int64 or indices.dim() != 2 or indices.shape[1] != values.shape[0]:
                raise TransportError("sparse indices and values do not match")
            if indices.numel() and (bool((indices < 0).any()) or indices.shape[0] > len(dims) or any(
                    int(indices[i].max()) >= dims[i] for i in range(indices.shape[0]))):
                raise TransportError("sparse indices out of range")
            try:  # what the checks above do not cover (e.g. a shape the indices and values cannot fill)
                return torch.sparse_coo_tensor(indices, values, dims, check_invariants=True).coalesce()
            except (RuntimeError, ValueError, TypeError) as err:
                raise TransportError(f"bad sparse tensor: {str(err).splitlines()[0] if str(err) else err!r}") from None
        if "seq" in node:
            if not isinstance(node["seq"], list):
                raise TransportError("bad sequence")
            items = [decode(x, depth + 1) for x in node["seq"]]
            return tuple(items) if node.get("tuple") is True else items
        if "dict" in node:
            pairs = node["dict"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise TransportError("bad dict")
            out = {}
            for key, item in pairs:
                if type(key) not in (str, int):
                    raise TransportError("bad dict key")
                out[key] = decode(item, depth + 1)
            return out
        if "float" in node:
            if node["float"] not in ("nan", "inf", "-inf"):
                raise TransportError("bad float")
            return float(node["float"])
        if "value" in node:
            v = node["value"]
            if v is not None and type(v) not in (bool, int, float, str):
                raise TransportError("bad scalar")
            return v
        raise TransportError("malformed tree")

    value = decode(tree, 0)
    if len(body) != end:
        raise TransportError(f"{len(body) - end} bytes follow the last tensor's: not a file this harness wrote")
    return value


def read_tree(path: Path, limit: int, folder: hostile_files.Folder | None = None) -> Any:
    """Open and parse an output file a (possibly hostile) rank wrote (`folder`: see open_untrusted)."""
    return parse_tree(open_untrusted(path, limit, folder))


def tree_nbytes(value: Any) -> int:
    """Tensor bytes in a value (what an output file of it would roughly hold)."""
    if isinstance(value, torch.Tensor):
        if value.layout == torch.sparse_coo:
            return tree_nbytes(value._indices()) + tree_nbytes(value._values())
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tree_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tree_nbytes(v) for v in value.values())
    return 0


# -- inputs: trusted side to rank -------------------------------------------------------------------
@dataclass(frozen=True)
class GroupRef:
    """A process group in an input: None for the default (world) group, else the global ranks."""

    ranks: tuple[int, ...] | None


def _replace(value: Any, fn: Any) -> Any:
    new = fn(value)
    if new is not value:
        return new
    if type(value) in (list, tuple):
        items = [_replace(v, fn) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if type(value) is dict:
        return {k: _replace(v, fn) for k, v in value.items()}
    return value


def _as_ref(value: Any) -> Any:
    import torch.distributed as dist

    if isinstance(value, dist.ProcessGroup):
        if value == dist.group.WORLD:
            return GroupRef(None)
        return GroupRef(tuple(dist.get_process_group_ranks(value)))
    return value


def save_inputs(path: Path, inputs: tuple[Any, ...]) -> list[GroupRef]:
    """torch.save one rank's inputs with process groups replaced by GroupRefs; returns those refs."""
    refs: list[GroupRef] = []

    def swap(value: Any) -> Any:
        ref = _as_ref(value)
        if isinstance(ref, GroupRef):
            refs.append(ref)
        return ref

    torch.save(_replace(tuple(inputs), swap), path)
    return refs


def load_inputs(path: Path, device: torch.device, groups: dict[tuple[int, ...] | None, Any]) -> tuple[Any, ...]:
    """Inputs written by save_inputs, on `device`, with each GroupRef replaced by the group in `groups`."""
    value = torch.load(path, map_location=device, weights_only=False)

    def swap(v: Any) -> Any:
        if isinstance(v, GroupRef):
            if v.ranks not in groups:
                raise TransportError(f"input names process group {v.ranks}, which this rank did not make")
            return groups[v.ranks]
        return v

    return tuple(_replace(value, swap))
