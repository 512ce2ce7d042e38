"""The machinery under mm/protocol/: typed messages as frozen dataclasses, msgpack on the wire, and a
decoder that validates every field against its declared type (the rules are in the docstring of
storm.mm.protocol, mm/protocol/__init__.py).

Only the messages themselves live in mm/protocol/ (a module per link), so that one package, whose docstring
documents them all, holds them all.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
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


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    """Every op and its class, those of modules not imported yet included (see add_loader)."""
    _load_all()
    return dict(_REGISTRY)


# Functions that import the modules whose messages are not registered yet (storm.mm.protocol imports some of
# its modules only when needed): called, once, before a lookup of an op not registered fails.
_LOADERS: list[Callable[[], object]] = []


def add_loader(load: Callable[[], object]) -> None:
    _LOADERS.append(load)


def _load_all() -> None:
    # A loader only imports, which is idempotent, and an import under way in another thread is waited for:
    # so whoever finds loaders runs them all (their ops are registered when it returns), and they are
    # forgotten only once run.
    if _LOADERS:
        for load in list(_LOADERS):
            load()
        _LOADERS.clear()


def _registered(op: str) -> type[Message] | None:
    cls = _REGISTRY.get(op)
    if cls is None and _LOADERS:
        _load_all()
        cls = _REGISTRY.get(op)
    return cls


_FIELDS: dict[type, tuple[str, ...] | None] = {}  # per type: a dataclass's field names, None for others


def _fields(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a map, for msgpack's packer, which calls this for every value it cannot pack
    itself (its ``default``): the packer walks the message in C and Python runs once per record, not once per
    field. A frozen dataclass without extra attributes keeps exactly its fields in ``__dict__``, in order:
    that dict is handed over as it is (a listing of 60 jobs encodes in a fifth of the time of building a
    map field by field)."""
    kind = type(value)
    names = _FIELDS.get(kind, ())
    if names == ():  # first seen (every message and record class, once)
        names = _FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(value)) if dataclasses.is_dataclass(value) else None
        )
    if names is None:
        raise TypeError(f"cannot send a {kind.__name__} in a message")
    own = getattr(value, "__dict__", None)
    if own is not None and len(own) == len(names):  # no cached or extra attribute beside the fields
        return own  # type: ignore[no-any-return]
    return {name: getattr(value, name) for name in names}


def encode(msg: Message) -> bytes:
    body = dict(_fields(msg))  # a copy: "op" is added to it
    body["op"] = msg.op
    packed: bytes = msgpack.packb(body, use_bin_type=True, default=_fields)
    return packed


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def prepare_decoding() -> None:
    """Resolve every message's field types, and make its decoding plan, now rather than at first use (the
    job shell launcher does this once before it forks, so no job shell pays for it)."""
    _load_all()
    pending: list[Any] = list(_REGISTRY.values())
    while pending:
        hint = pending.pop()
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if hint not in _HINTS:
                pending.extend(_hints(hint).values())
                _plan(hint)
        else:
            pending.extend(typing.get_args(hint))


_INT64 = -(2**63)  # the lowest int64: every integer on the wire is one
_INT = {int}  # the types of a list of integers only (a bool is not one)
Converter = Callable[[Any, str], Any]  # (value as decoded by msgpack, where it is) -> the field's value
_CONVERTERS: dict[Any, Converter] = {}
# Per message or record class: each field's name, converter, whether it may be absent, and the type a value
# of it already has when it needs no conversion (str, bool, bytes: msgpack gives exactly those; None: ask).
_PLANS: dict[type, tuple[tuple[str, Converter, bool, type | None], ...]] = {}


def _convert(value: Any, hint: Any, where: str) -> Any:
    return _converter(hint)(value, where)


def _converter(hint: Any) -> Converter:
    """The check and conversion of a value of type ``hint``, made once per type: decoding walks every field
    of every message, and looking at the type each time cost more than the check itself."""
    found = _CONVERTERS.get(hint)
    if found is None:
        found = _CONVERTERS[hint] = _make_converter(hint)
    return found


def _make_converter(hint: Any) -> Converter:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        optional = type(None) in options
        converters = [_converter(option) for option in options if option is not type(None)]

        def union(value: Any, where: str) -> Any:
            if value is None and optional:
                return None
            errors = []
            for convert in converters:
                try:
                    return convert(value, where)
                except ProtocolError as exc:
                    errors.append(str(exc))
            raise ProtocolError("; ".join(errors))

        return union
    if hint is int:

        def integer(value: Any, where: str) -> Any:
            if type(value) is int and -(2**63) <= value < 2**63:
                return value
            check(type(value) is int, f"{where}: expected an integer, got {type(value).__name__}")
            raise ProtocolError(f"{where}: integer out of range")

        return integer
    if hint is float:

        def number(value: Any, where: str) -> Any:
            if type(value) is float and math.isfinite(value):
                return value
            check(type(value) in (int, float), f"{where}: expected a number, got {type(value).__name__}")
            check(math.isfinite(value), f"{where}: not a finite number")
            return float(value)

        return number
    if hint in (bool, str, bytes):
        expected = {bool: "true or false", str: "a string", bytes: "bytes"}[hint]

        def exact(value: Any, where: str) -> Any:
            if type(value) is not hint:
                raise ProtocolError(f"{where}: expected {expected}, got {type(value).__name__}")
            return value

        return exact
    if origin is tuple:
        (item_hint,) = (a for a in typing.get_args(hint) if a is not Ellipsis)
        item = _converter(item_hint)

        plain = item_hint if item_hint in (str, bool, bytes) else None
        integers = item_hint is int

        def sequence(value: Any, where: str) -> Any:
            check(type(value) in (list, tuple), f"{where}: expected a list, got {type(value).__name__}")
            if plain is not None and all(type(v) is plain for v in value):
                return tuple(value)
            # Integers (job ids, a node's bucket counts) checked in a few C-level scans rather than one by
            # one; only a list with something else, or out of int64's range, is looked at item by item.
            if (
                integers
                and value
                and set(map(type, value)) == _INT
                and min(value) >= _INT64
                and max(value) < -_INT64
            ):
                return tuple(value)
            return tuple([item(v, f"{where}[{i}]") for i, v in enumerate(value)])

        return sequence
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint)
        key, item = _converter(key_hint), _converter(value_hint)
        strings = key_hint is str and value_hint is str  # an environment: taken as msgpack made it, if it is

        def mapping(value: Any, where: str) -> Any:
            check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
            if strings and all(type(k) is str for k in value) and all(type(v) is str for v in value.values()):
                return value
            return {key(k, f"{where} key"): item(v, f"{where}[{k!r}]") for k, v in value.items()}

        return mapping
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda value, where: _build(hint, value, where)
    raise TypeError(f"unsupported field type {hint!r}")  # a bug in this module, not bad input


def _plan(cls: type) -> tuple[tuple[str, Converter, bool, type | None], ...]:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = _hints(cls)
        plan = _PLANS[cls] = tuple(
            (
                f.name,
                _converter(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                hints[f.name] if hints[f.name] in (str, bool, bytes) else None,
            )
            for f in dataclasses.fields(cls)
        )
    return plan


def _build(cls: type, value: Any, where: str) -> Any:
    check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
    kwargs = {}
    for name, convert, required, exact in _plan(cls):
        if name in value:
            item = value[name]
            # Most fields are strings and flags that are what they should be: taken as they are.
            kwargs[name] = item if type(item) is exact else convert(item, f"{where}.{name}")
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
    cls = _registered(op)
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
