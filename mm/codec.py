"""The machinery under mm/protocol.py: typed messages as frozen dataclasses, msgpack on the wire, and a
decoder that validates every field against its declared type (the rules are in protocol.py's docstring).

Only the messages themselves live in protocol.py, so that one module documents them all.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

import msgpack

# A client request (a submit with the user's environment) is a few KiB; 1 MiB leaves room and bounds memory.
MAX_CLIENT_MESSAGE = 1 << 20
# PMI barriers carry every rank's network address (about 2 KiB per rank with UCX): allow big jobs.
MAX_NODE_MESSAGE = 64 << 20


class ProtocolError(ValueError):
    """A message that cannot be accepted: malformed, oversized, unknown or impossible."""


def check(condition: bool, text: str) -> None:
    if not condition:
        raise ProtocolError(text)


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of every message; ``op`` is its stable name on the wire."""

    op: ClassVar[str] = ""


_REGISTRY: dict[str, type[Message]] = {}
M = TypeVar("M", bound=type[Message])


def message(op: str) -> Callable[[M], M]:
    """Register a message class under its wire name."""

    def register(cls: M) -> M:
        if op in _REGISTRY:
            raise TypeError(f"op {op!r} registered twice")
        cls.op = op
        _REGISTRY[op] = cls
        return cls

    return register


def registered_ops() -> dict[str, type[Message]]:
    return dict(_REGISTRY)


# Values msgpack takes as they are, and each record type's field names: a job list of 10,000 records
# asked dataclasses about every value of every field (half of the encoding's time).
_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))
_FIELDS: dict[type, tuple[str, ...]] = {}


def _to_wire(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: _to_wire(getattr(value, name)) for name in names}
    if isinstance(value, tuple | list):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def encode(msg: Message) -> bytes:
    body = _to_wire(msg)
    body["op"] = msg.op
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def prepare_decoding() -> None:
    """Resolve every message's field types now rather than at first use (the job shell launcher does this
    once before it forks, so no job shell pays for it)."""
    pending: list[Any] = list(_REGISTRY.values())
    while pending:
        hint = pending.pop()
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if hint not in _HINTS:
                pending.extend(_hints(hint).values())
        else:
            pending.extend(typing.get_args(hint))


_SHAPES: dict[Any, tuple[Any, tuple[Any, ...]]] = {}  # hint -> (typing.get_origin, typing.get_args)


def _convert(value: Any, hint: Any, where: str) -> Any:
    shape = _SHAPES.get(hint)
    if shape is None:  # typing's functions cost more than the rest of a field's check: asked once per hint
        shape = _SHAPES[hint] = (typing.get_origin(hint), typing.get_args(hint))
    origin, args = shape
    if origin in (Union, types.UnionType):
        options = args
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError("; ".join(errors))
    if hint is int:
        check(type(value) is int, f"{where}: expected an integer, got {type(value).__name__}")
        check(-(2**63) <= value < 2**63, f"{where}: integer out of range")
        return value
    if hint is float:
        check(type(value) in (int, float), f"{where}: expected a number, got {type(value).__name__}")
        check(math.isfinite(value), f"{where}: not a finite number")
        return float(value)
    if hint is bool:
        check(type(value) is bool, f"{where}: expected true or false, got {type(value).__name__}")
        return value
    if hint is str:
        check(type(value) is str, f"{where}: expected a string, got {type(value).__name__}")
        return value
    if hint is bytes:
        check(type(value) is bytes, f"{where}: expected bytes, got {type(value).__name__}")
        return value
    if origin is tuple:
        check(type(value) in (list, tuple), f"{where}: expected a list, got {type(value).__name__}")
        (item,) = (a for a in args if a is not Ellipsis)
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
        key_hint, value_hint = args
        return {
            _convert(k, key_hint, f"{where} key"): _convert(v, value_hint, f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    raise TypeError(f"{where}: unsupported field type {hint!r}")  # a bug in this module, not bad input


_DECODED: dict[type, tuple[tuple[str, Any, bool], ...]] = {}  # cls -> (field, its type, required)
_INT_MIN, _INT_END = -(2**63), 2**63


def _build(cls: type, value: Any, where: str) -> Any:
    check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
    decoded = _DECODED.get(cls)
    if decoded is None:
        hints = _hints(cls)
        decoded = _DECODED[cls] = tuple(
            (
                f.name,
                hints[f.name],
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        )
    kwargs = {}
    for name, hint, required in decoded:
        if name in value:
            item = value[name]
            kind = type(item)
            # The common valid cases first, without a call or the text of where the field is.
            if (
                (kind is str and hint is str)
                or (kind is int and hint is int and _INT_MIN <= item < _INT_END)
                or (kind is float and hint is float and math.isfinite(item))
                or (kind is bool and hint is bool)
            ):
                kwargs[name] = item
            else:
                kwargs[name] = _convert(item, hint, f"{where}.{name}")
        elif required:
            raise ProtocolError(f"{where}: missing field {name!r}")
    try:
        return cls(**kwargs)
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc}") from None


def decode(data: bytes, max_bytes: int = MAX_CLIENT_MESSAGE) -> Message:
    """Decode and validate one message; raise ProtocolError for anything that is not a valid message."""
    check(len(data) <= max_bytes, f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types for bad input; all mean the same here
        raise ProtocolError(f"not a msgpack message: {exc.__class__.__name__}") from None
    check(type(body) is dict, "a message must be a msgpack map")
    op = body.get("op")
    check(type(op) is str, "a message needs a string 'op'")
    cls = _REGISTRY.get(op)
    check(cls is not None, f"unknown op {op!r}")
    assert cls is not None
    built: Message = _build(cls, body, op)
    return built


def peek_req(data: bytes, max_bytes: int = MAX_CLIENT_MESSAGE) -> int:
    """The ``req`` of a message that failed to decode, if it can be found, so the error reaches its waiter."""
    if len(data) > max_bytes:
        return 0
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        return 0
    req = body.get("req") if type(body) is dict else None
    return req if type(req) is int and 0 <= req < 2**63 else 0
