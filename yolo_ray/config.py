"""Experiment config: loading a YAML experiment (or the embedded default) and `key=value` overrides, checked on every
load. The schema is config_schema.py (its everyday names are importable from here too), the checks
config_checks.py.

A config has five sections (model, data, train, scaling, run) plus `tracking` and `tune`. Every key is typed; a bad
value raises ConfigError naming the file, the key and the fix, before Ray or a GPU is touched.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from yolo_ray import ultralytics_keys
from yolo_ray.config_checks import MANAGED_KEYS, check_static, ultralytics_train_keys
from yolo_ray.config_schema import EMBEDDED, ConfigError, ExperimentConfig, TuneSection

# the schema's names callers use, importable from here beside load(); checks come from config_checks
__all__ = [
    "EMBEDDED",
    "ConfigError",
    "ExperimentConfig",
    "TuneSection",
    "apply",
    "from_dict",
    "load",
    "parse_overrides",
]


# --------------------------------------------------------------------------------------------------- parsing


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, value) if value fits type tp; ints are accepted where floats are wanted."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp)), value
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, str):  # PyYAML reads `1e-3` (no dot) as a string
            try:
                return True, float(value)
            except ValueError:
                return False, value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if tp is dict:
        return isinstance(value, dict), value
    return isinstance(value, tp), value


def _wants_str(tp: Any) -> bool:
    return tp is str or (typing.get_origin(tp) in (Union, types.UnionType) and str in typing.get_args(tp))


def _build(cls: type, raw: Any, source: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(
            source,
            prefix or "<top level>",
            f"expected a mapping, got {raw!r}.",
            f"write `{prefix or 'the file'}` as `key: value` lines.",
        )
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"did you mean `{prefix + '.' if prefix else ''}{close[0]}`?"
                if close
                else (f"valid keys here: {', '.join(names)}.")
            )
            raise ConfigError(source, dotted, "unknown key.", f"remove it or rename it; {hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, source, dotted)
            continue
        ok, coerced = _coerce(value, tp)
        if not ok:
            fix = f"set `{dotted}` to {_describe(tp)}."
            if _wants_str(tp) and isinstance(value, (bool, int, float)):  # YAML read `yes`, `on`, `1e3` as such
                fix = (
                    f'quote the value to keep it text, e.g. {dotted}=\'"yes"\' on the command line or "yes" in '
                    "YAML (YAML reads yes, no, on and off as booleans, digits as numbers)."
                )
            raise ConfigError(source, dotted, f"{value!r} is not a valid value; expected {_describe(tp)}.", fix)
        kwargs[key] = coerced
    return cls(**kwargs)


def _deep_set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise KeyError(dotted)
    node[parts[-1]] = value


def _scalar(text: str) -> Any:
    """A YAML scalar, with `1e-3` read as a number (PyYAML's YAML 1.1 reads it as a string)."""
    value = yaml.safe_load(text) if text else None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def parse_overrides(items: list[str], source: str = "command line", into: dict | None = None) -> dict:
    """`train.epochs=5 scaling.num_workers=4` set into a nested dict (values parsed as YAML). Each override
    replaces the value at its dotted path, so `tune.space={...}` replaces the whole space."""
    tree: dict = {} if into is None else into
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(source, item, "is not a `key=value` override.", "write overrides as `train.epochs=5`.")
        try:
            _deep_set(tree, key.strip(), _scalar(text))
        except KeyError:
            raise ConfigError(
                source,
                key,
                "sets a key below a value that is not a section.",
                "check the dotted path, e.g. `train.extra.mosaic=0.5`.",
            ) from None
    return tree


def from_dict(raw: dict, source: str) -> ExperimentConfig:
    """An ExperimentConfig from an already-parsed mapping (checked like a file)."""
    cfg = _build(ExperimentConfig, raw, source, "")
    cfg.source = source
    check_static(cfg)
    return cfg


def apply(cfg: ExperimentConfig, dotted: dict[str, Any]) -> ExperimentConfig:
    """A copy of cfg with `{"train.lr0": 0.01, ...}` applied (checked again)."""
    raw = cfg.to_dict()
    for key, value in dotted.items():
        _deep_set(raw, key, value)
    return from_dict(raw, cfg.source)


def load(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load a YAML experiment (or the embedded default when path is None) and apply overrides."""
    raw: dict = {}
    source = EMBEDDED
    if path is not None:
        source = str(path)
        p = Path(path)
        if p.is_dir():
            raise ConfigError(
                source, "<file>", "is a directory.", "pass an experiment YAML such as experiments/smoke.yaml."
            )
        if not p.is_file():
            raise ConfigError(
                source,
                "<file>",
                "the experiment file does not exist.",
                "pass a YAML file such as experiments/smoke.yaml (or none for the embedded default).",
            )
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(source, "<file>", f"is not valid YAML ({e}).", "fix the YAML syntax.") from None
    if overrides:
        where = f"{source} (command-line override)"
        overrides = ultralytics_keys.translate(overrides, where, ultralytics_train_keys() - MANAGED_KEYS)
        raw = parse_overrides(overrides, source=where, into=raw)
    return from_dict(raw, source)
