"""Typed configuration at the library boundary.

Kedro nodes receive plain parameter dicts; ``parse(Cls, mapping, "key.path")`` turns them into frozen
dataclasses and fails with a ``ConfigError`` that names the full key, the bad value and what is
allowed. Every config class derives from ``Validated``: its ``validate(prefix)`` (range checks via
``check``/``check_choice``) runs on construction, so ``TrainConfig(batch_size_per_rank=0)`` fails
as ``parse`` does; built by ``parse``, the message names the full key (``train.checkpoint.keep_last``).
A class may list keys it renamed (``RENAMED = {"old": "new"}``): the old key then fails with a
message naming the new one. ``new`` is relative to the same block and may go deeper
(``{"world_size": "launch.world_size"}``); one starting with "/" is a full key from the root of
the parameters (``{"batch_size": "/train.batch_size_per_rank"}``), for a key that left its block.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range. The message names the key."""


# the key of the config being built by ``parse`` (so validation names the full key)
_PREFIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("recscale_config_prefix",
                                                                    default=None)


class Validated:
    """Base of every typed config dataclass: ``validate`` runs on construction (and on
    ``dataclasses.replace``), with the full key when ``parse`` builds it, else the class's default
    prefix (``validate``'s default argument)."""

    RENAMED: typing.ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        prefix = _PREFIX.get()
        if prefix is None:
            self.validate()
        else:
            self.validate(prefix)

    def validate(self, prefix: str = "") -> None:
        """Range and cross-field checks; raise ConfigError naming ``prefix.field``."""


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: expected {allowed}")


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    check(value in choices, key, value, "one of " + ", ".join(repr(c) for c in choices))


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        closest = False
        if isinstance(value, Mapping):  # a mapping: only the forms it can be, closest first
            forms = [a for a in args if dataclasses.is_dataclass(a)]
            if forms:
                def unknown(a) -> int:
                    return len(set(value) - {f.name for f in dataclasses.fields(a)})

                args, closest = tuple(sorted(forms, key=unknown)), True
        elif isinstance(value, (list, tuple)):  # a list is none of the mapping forms
            args = tuple(a for a in args if not dataclasses.is_dataclass(a)) or args
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 or closest
                          else f"{key}={value!r}: " + "; ".join(errors))
    if origin is Literal:
        check_choice(key, value, get_args(tp))
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return parse(tp, value, key)
    if origin in (tuple, list, Sequence):
        check(
            isinstance(value, (list, tuple)), key, value, "a list"
        )
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            check(len(value) == len(args), key, value, f"a list of {len(args)} items")
            return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        return tuple(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        check(isinstance(value, Mapping), key, value, "a mapping")
        _, vt = get_args(tp) or (Any, Any)
        return {k: _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        check(isinstance(value, bool), key, value, "true or false")
        return value
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), key, value, "an integer")
        return value
    if tp is float:
        check(
            isinstance(value, (int, float)) and not isinstance(value, bool), key, value, "a number"
        )
        return float(value)
    if tp is str:
        check(isinstance(value, str), key, value, "a string")
        return value
    return value


def nearest(key: str, known) -> str:
    """`` (did you mean 'x'?)`` for the known key closest to a misspelt ``key``, or ``""``."""
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_blocks(params: Mapping[str, Any], known: Sequence[str], where: str = "parameters") -> None:
    """Every top-level block of ``params`` is one of ``known``: a misspelt block (``trian:`` in a
    config env, ``--params=trian.epochs=2``) would otherwise be read by no one and ignored."""
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown parameter block {unknown[0]!r}{nearest(unknown[0], known)} in the {where}; "
            f"the blocks are: {', '.join(known)}"
        )


def parse(cls: type[T], mapping: Mapping[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``mapping``; unknown keys and bad values raise ConfigError."""
    mapping = {} if mapping is None else mapping
    where = prefix or cls.__name__
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}={mapping!r} is not allowed: expected a mapping of settings")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(mapping) - set(fields))
    renamed = getattr(cls, "RENAMED", {})
    moved = [k for k in unknown if k in renamed]
    if moved:
        old = f"{prefix + '.' if prefix else ''}{moved[0]}"
        target = renamed[moved[0]]
        new = target[1:] if target.startswith("/") else f"{prefix + '.' if prefix else ''}{target}"
        raise ConfigError(f"{old} is not allowed: it is now {new}")
    if unknown:
        raise ConfigError(
            f"unknown key {prefix + '.' if prefix else ''}{unknown[0]}{nearest(unknown[0], fields)}"
            f"; allowed keys under {where}: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in mapping.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(hints[name], value, key)
    token = _PREFIX.set(prefix or None)
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{where}: {exc}") from exc
    finally:
        _PREFIX.reset(token)
    if not isinstance(obj, Validated) and hasattr(obj, "validate"):
        obj.validate(prefix)
    return obj


def to_dict(obj: Any) -> Any:
    """Plain, JSON-friendly dict of a (nested) config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def flatten(d: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out
