"""The machinery under mm/protocol.py: typed messages as frozen dataclasses, msgpack on the wire, and a
decoder that validates every field against its declared type (the rules are in protocol.py's docstring).

Only the messages themselves live in protocol.py, so that one module documents them all.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import marshal
import math
import os
import sys
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
    return dict(_REGISTRY)


# --------------------------------------------------------------------------------------------------------
# Building the message classes without compiling them


class _CompiledMethods:
    """The compiled code of the methods dataclasses writes for one module's classes, kept between runs.

    dataclasses writes each method of a class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, and for
    a frozen class ``__setattr__`` and ``__delattr__``) as source text and compiles it with exec(): 348
    compilations for protocol.py, three quarters of the time its import took, at every start of every storm
    program (about 20 ms of the 100 a `storm submit` took on a 2-core VM). The text depends only on the
    class, so its compiled code is kept as Python keeps a module's: in the module's ``__pycache__``, written
    at exit when something had to be compiled, unless bytecode is not written (PYTHONDONTWRITEBYTECODE).
    Each code is stored under the whole text it was compiled from, so that a class that changed is compiled
    again, and the file is tagged with the interpreter's exact version; a file that is missing, unreadable or
    of another version is ignored. Like a ``.pyc`` it is code, and the directory's permissions protect both.
    """

    def __init__(self, module_file: str | None) -> None:
        self.path = ""  # nowhere to keep them (a module without a file): compiled every time
        self.tag = f"{sys.version} optimize={sys.flags.optimize}"
        self.codes: dict[str, types.CodeType] = {}
        self.compiled = 0  # in this process: 0 when every method came from the file
        self.dirty = False
        if not module_file:
            return
        directory, name = os.path.split(os.path.abspath(module_file))
        if sys.pycache_prefix:  # where importlib puts bytecode under PYTHONPYCACHEPREFIX
            directory = os.path.join(sys.pycache_prefix, directory.lstrip(os.sep))
        else:
            directory = os.path.join(directory, "__pycache__")
        name = f"{os.path.splitext(name)[0]}.{sys.implementation.cache_tag}.dataclasses"
        self.path = os.path.join(directory, name)
        try:
            with open(self.path, "rb") as file:
                tag, codes = marshal.loads(file.read())  # noqa: S302 (as trusted as a .pyc: see above)
        except Exception:  # marshal raises several types for a bad file: all mean "no cache"
            return
        if tag == self.tag and type(codes) is dict:
            self.codes = codes

    def exec(self, source: str, global_names: dict[str, Any], local_names: dict[str, Any]) -> None:
        """exec() as dataclasses calls it, compiling ``source`` only if it was never compiled before."""
        code = self.codes.get(source)
        if code is None:
            code = compile(source, "<string>", "exec")  # what exec() compiles text as, name and all
            self.codes[source] = code
            self.compiled += 1
            if self.path and not self.dirty and not sys.dont_write_bytecode:
                self.dirty = True
                atexit.register(self.save)
        builtins.exec(code, global_names, local_names)  # noqa: S102 (dataclasses' own call, its text compiled)

    def save(self) -> None:
        temporary = f"{self.path}.{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(temporary, "wb") as file:
                marshal.dump((self.tag, self.codes), file)
            os.replace(temporary, self.path)  # readers see the old file or the new one, never half of one
        except OSError:  # a read-only installation: its programs compile the methods, as before
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        self.dirty = False


_COMPILED: dict[str, _CompiledMethods] = {}
T = TypeVar("T")


@typing.dataclass_transform(field_specifiers=(dataclasses.field,))
def dataclass(*, frozen: bool = False, kw_only: bool = False) -> Callable[[type[T]], type[T]]:
    """``dataclasses.dataclass``: the same class, its methods the same code, but compiled once and kept
    (see _CompiledMethods). protocol.py builds every message and record with it."""

    def build(cls: type[T]) -> type[T]:
        compiled = _COMPILED.get(cls.__module__)
        if compiled is None:
            module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
            compiled = _COMPILED[cls.__module__] = _CompiledMethods(module_file)
        # dataclasses looks exec() up among its own module's names before the builtins: for this one
        # call, it finds the cached one there.
        dataclasses.exec = compiled.exec  # type: ignore[attr-defined]
        try:
            return dataclasses.dataclass(frozen=frozen, kw_only=kw_only)(cls)
        finally:
            vars(dataclasses).pop("exec", None)

    return build


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
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


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
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
        (item,) = (a for a in typing.get_args(hint) if a is not Ellipsis)
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
        key_hint, value_hint = typing.get_args(hint)
        return {
            _convert(k, key_hint, f"{where} key"): _convert(v, value_hint, f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    raise TypeError(f"{where}: unsupported field type {hint!r}")  # a bug in this module, not bad input


def _build(cls: type, value: Any, where: str) -> Any:
    check(type(value) is dict, f"{where}: expected a map, got {type(value).__name__}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _convert(value[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field {f.name!r}")
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
