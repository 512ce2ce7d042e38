"""``dataclass``: dataclasses.dataclass whose generated methods are compiled once and kept between runs.

mm/protocol/'s modules build every message and record with it, so that a short ``storm`` command does not
spend a fifth of its life compiling the same few hundred methods again (issue 18; see _CompiledMethods for
how and why).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar


class _CompiledMethods:
    """The compiled code of the methods dataclasses writes for one module's classes, kept between runs.

    dataclasses writes each method of a class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, and for
    a frozen class ``__setattr__`` and ``__delattr__``) as source text and compiles it with exec(): 348
    compilations for the protocol, three quarters of the time its import took, at every start of every storm
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
    (see _CompiledMethods). mm/protocol/'s modules build every message and record with it, each module's
    methods kept in a file of its own next to its bytecode."""

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
