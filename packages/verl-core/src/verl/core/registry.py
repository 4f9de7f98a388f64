"""One generic registry for everything verl looks up by key: platforms, training engines, rollout
engines, advantage estimators, policy losses, reward functions, ...

A registry has named key fields. ``register(**key)`` is a decorator; a field given a list registers the
object under every combination (``backend=["fsdp", "fsdp2"]``). Fields listed as *generic* may be left
out at registration (they become ``None``, "any") and lookup falls back to that generic entry when the
exact one is missing: this is how a vendor-specific engine wins over the device's generic one.

Each entry remembers which distribution registered it (set by the plugin loader while it imports a
plugin), so ``python -m verl.core`` can say where every engine came from.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_current_origin: contextvars.ContextVar[str | None] = contextvars.ContextVar("verl_registry_origin", default=None)


@contextlib.contextmanager
def registering_as(origin: str) -> Iterator[None]:
    """Attribute registrations made inside this block to ``origin`` (a distribution name)."""
    token = _current_origin.set(origin)
    try:
        yield
    finally:
        _current_origin.reset(token)


#: Entry-point module -> the distribution that declares it (filled by the plugin loader).
_module_origins: dict[str, str] = {}


def declare_module_origin(module: str, origin: str) -> None:
    """Attribute whatever ``module`` and its submodules register to ``origin``, however they get
    imported: a plugin importing another's module (the ROCm platform subclassing the CUDA one, a vendor
    engine subclassing FSDPEngine) must not take credit for what that module registers."""
    _module_origins[module] = origin


def _declared_origin(module: str) -> str | None:
    owners = [m for m in _module_origins if module == m or module.startswith(m + ".")]
    return _module_origins[max(owners, key=len)] if owners else None


def _origin_of(obj: Any) -> str:
    module = getattr(obj, "__module__", "") or ""
    declared = _declared_origin(module)
    if declared:
        return declared
    origin = _current_origin.get()
    if origin:
        return origin
    # Built-ins of this repository follow the `verl.<pkg>` -> `verl-<pkg>` naming; anything else is
    # reported by module, which is still enough to find it.
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "verl":
        return f"verl-{parts[1]}"
    return module or "<unknown>"


class RegistryError(KeyError):
    """Lookup of a key nothing registered; the message lists what is registered."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry(Generic[T]):
    key: tuple[Any, ...]
    obj: T
    origin: str


class Registry(Generic[T]):
    """A keyed registry of objects (usually classes or functions)."""

    def __init__(self, kind: str, keys: Sequence[str] = ("name",), generic: Sequence[str] = ()):
        unknown = set(generic) - set(keys)
        if unknown:
            raise ValueError(f"generic fields {sorted(unknown)} are not key fields of {list(keys)}")
        self.kind = kind
        self.keys = tuple(keys)
        self.generic = tuple(generic)
        self._entries: dict[tuple[Any, ...], Entry[T]] = {}

    # -- registration ---------------------------------------------------------------------------
    def register(self, *args: Any, override: bool = False, **key: Any) -> Callable[[T], T]:
        """Decorator registering its target under ``key``. With a single key field it may be given
        positionally: ``@ADV_ESTIMATORS.register("grpo")``."""
        if args:
            if len(args) != 1 or len(self.keys) != 1 or key:
                raise TypeError(f"{self.kind} registry: give the key as keywords {list(self.keys)}")
            key = {self.keys[0]: args[0]}
        missing = [f for f in self.keys if f not in key and f not in self.generic]
        extra = [f for f in key if f not in self.keys]
        if missing or extra:
            raise TypeError(
                f"{self.kind} registry takes keys {list(self.keys)} (optional: {list(self.generic)}); "
                f"missing {missing}, unexpected {extra}"
            )
        choices = [self._as_list(key.get(f)) for f in self.keys]

        def decorator(obj: T) -> T:
            origin = _origin_of(obj)
            for combo in itertools.product(*choices):
                existing = self._entries.get(combo)
                if existing is not None and existing.obj is not obj and not override:
                    raise ValueError(
                        f"{self.kind} {self._fmt(combo)} is already registered by {existing.origin} "
                        f"({_qualname(existing.obj)}); pass override=True to replace it"
                    )
                self._entries[combo] = Entry(combo, obj, origin)
            return obj

        return decorator

    @staticmethod
    def _as_list(value: Any) -> list[Any]:
        if isinstance(value, (list, tuple, set, frozenset)):
            if not value:
                raise ValueError("an empty list of key values registers nothing")
            return list(value)
        return [value]

    def unregister(self, **key: Any) -> None:
        self._entries.pop(self._key(key), None)

    # -- lookup ---------------------------------------------------------------------------------
    def _key(self, key: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(key.get(f) for f in self.keys)

    def get(self, *args: Any, **key: Any) -> T:
        """The object for ``key``: the exact entry, else the entry with the generic fields unset,
        else a :class:`RegistryError` listing what is registered (nearest matches first)."""
        if args:
            if len(args) != 1 or len(self.keys) != 1:
                raise TypeError(f"{self.kind} registry: give the key as keywords {list(self.keys)}")
            key = {self.keys[0]: args[0]}
        exact = self._key(key)
        if exact in self._entries:
            return self._entries[exact].obj
        if self.generic:
            fallback = tuple(None if f in self.generic else v for f, v in zip(self.keys, exact))
            if fallback in self._entries:
                return self._entries[fallback].obj
        raise RegistryError(self._missing_message(exact))

    def _missing_message(self, key: tuple[Any, ...]) -> str:
        registered = [self._fmt(k) for k in self._entries]
        if not registered:
            return f"no {self.kind} is registered (looked for {self._fmt(key)}); is the package that provides it installed?"
        wanted = self._fmt(key)
        near = difflib.get_close_matches(wanted, registered, n=3, cutoff=0.3)
        msg = f"no {self.kind} registered for {wanted}."
        if near:
            msg += f" Nearest: {', '.join(near)}."
        msg += f" Registered: {', '.join(sorted(registered))}."
        return msg

    def _fmt(self, key: tuple[Any, ...]) -> str:
        if len(self.keys) == 1:
            return repr(key[0])
        return "(" + ", ".join(f"{f}={v!r}" for f, v in zip(self.keys, key) if v is not None) + ")"

    def __contains__(self, name: Any) -> bool:
        if len(self.keys) == 1:
            return (name,) in self._entries
        return tuple(name) in self._entries

    def names(self) -> list[Any]:
        """Registered keys: plain values for a single-field registry, tuples otherwise."""
        if len(self.keys) == 1:
            return [k[0] for k in self._entries]
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        return list(self._entries.values())

    def describe(self, key: tuple[Any, ...]) -> str:
        return self._fmt(key)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
