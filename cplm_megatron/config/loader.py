"""YAML + dotted command-line overrides -> nested config dataclasses, strictly typed; `recipe_path` finds
a `--config` recipe by its shipped name, `resolve_model_section` expands a named model preset (configs/models/).
Loading runs one way: `load_tree` (recipe, overrides) and the presets give a raw tree, `build_dataclass` builds and
validates it; the config classes above call into this module, never the reverse.

Every config section is a plain dataclass. `build_dataclass` turns a nested dict into one, rejecting
unknown keys (with the closest valid name), coercing strings from the command line to the field's type,
and naming the full dotted key in every error.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from importlib import import_module
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Type, TypeVar, Union

import yaml

from cplm_megatron.errors import ConfigError

T = TypeVar("T")
RECIPE_DIR = Path(import_module("cplm_megatron.recipes").__file__).parent  # configs/ of a checkout
PRESET_DIR = RECIPE_DIR / "models"  # the named model presets (`model.preset`)


def recipe_path(name_or_path: str) -> str:
    """A `--config` argument: a YAML file, or the name of a shipped recipe (`tiny` -> configs/tiny.yaml)."""
    path = Path(name_or_path)
    shipped = RECIPE_DIR / f"{name_or_path}.yaml"
    if not path.exists() and path.suffix != ".yaml" and shipped.is_file():
        return str(shipped)
    return name_or_path


def shipped_recipes() -> List[str]:
    """The names of the recipes that ship with the package (configs/*.yaml)."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def _recipe_hint(path: Path) -> str:
    """For a `--config` that does not exist: the closest shipped recipe and the list of them."""
    names = shipped_recipes()
    close = difflib.get_close_matches(path.stem, names, n=1, cutoff=0.5)
    guess = f"; did you mean --config {close[0]}?" if close else ""
    return f"{guess} (shipped recipes, by name: {', '.join(names)})"


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        seen: Dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise ConfigError(f"{mark.name}:{mark.line + 1}:{mark.column + 1}: key {key!r} is given twice "
                                  f"(first at line {seen[key].line + 1}); keep one of them")
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Union[str, Path]) -> Dict[str, Any]:
    """Read a YAML mapping (empty file -> {}); a syntax error or a duplicated key is a ConfigError
    naming the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}{_recipe_hint(path)}")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.load(f, Loader=_StrictLoader) or {}  # noqa: S506 - a SafeLoader subclass
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.object[e.start]:#04x} at offset {e.start}); "
                              f"save the recipe as UTF-8 YAML") from None
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            problem = " ".join(str(x) for x in (e.context, e.problem) if x)
            hint = " (YAML indents with spaces, not tabs)" if "\\t" in problem else ""
            raise ConfigError(f"{where}: invalid YAML: {problem}{hint}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[List[str], Any]:
    """'train.lr=3e-4' -> (['train', 'lr'], '3e-4' parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r}: empty key component")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(tree: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """Set dotted keys in a nested dict (in place, returned for chaining)."""
    for item in overrides:
        parts, value = parse_override(item)
        node = tree
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = nxt
        node[parts[-1]] = value
    return tree


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> Dict[str, Any]:
    """Recursive dict merge; values in `top` win."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_tree(path: str | None, overrides: Iterable[str] = (),
              alternatives: Mapping[tuple, tuple] | None = None) -> Dict[str, Any]:
    """A recipe's raw tree: the YAML (a file or a shipped recipe's name; None: empty), then the dotted overrides. An
    override of a key in `alternatives` ((section, key) -> (section, key)) clears the recipe's alternative to it
    unless that is overridden too (`--set train.iters=1000` on a recipe that trains by tokens)."""
    tree = read_yaml(recipe_path(path)) if path else {}
    overrides = list(overrides)
    overridden = {tuple(parts): value for parts, value in map(parse_override, overrides)}
    apply_overrides(tree, overrides)
    for key, other in (alternatives or {}).items():
        if overridden.get(key) is not None and other not in overridden:
            section = tree.get(other[0])
            if isinstance(section, dict):
                section[other[1]] = None
    return tree


def available_presets() -> List[str]:
    """Names of the YAML presets under configs/models/."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_dict(name: str) -> Dict[str, Any]:
    """The raw mapping of a named preset (its file name without .yaml)."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown model.preset {name!r}; available: {', '.join(available_presets())}")
    data = read_yaml(path)
    data["preset"] = name
    return data


def resolve_model_section(section: Dict[str, Any]) -> Dict[str, Any]:
    """Expand `model.preset` into its fields; explicit keys in the section override the preset."""
    name = section.get("preset")
    if not name:
        return dict(section)
    return deep_merge(preset_dict(str(name)), section)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, getattr(types, "UnionType", Union)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)) and len(args) == 1:
            return True, args[0]
    return False, tp


def _coerce(value: Any, tp: Any, key: str) -> Any:
    optional, inner = _is_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional or tp is Any:
            return None
        raise ConfigError(f"{key}: null is not allowed (expected {getattr(tp, '__name__', tp)})")
    tp = inner
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str) and "path" in {f.name for f in dataclasses.fields(tp)}:
            value = {"path": value}  # shorthand: a bare string is the entry's path
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping for section {tp.__name__}, got {value!r}")
        return build_dataclass(tp, value, prefix=key)
    origin = typing.get_origin(tp)
    if origin in (list, List, tuple):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if as_float in (float("inf"), float("-inf")) or as_float != as_float or as_float != int(as_float):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(as_float)
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def build_dataclass(cls: Type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Construct dataclass `cls` from a (nested) mapping; unknown keys are errors naming the key."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {(prefix + '.' if prefix else '') + close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config key {dotted!r}{hint} (valid keys in "
                f"{prefix or 'the top level'}: {', '.join(sorted(fields))})"
            )
        kwargs[key] = _coerce(value, hints[key], dotted)
    try:
        obj = cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain dict (for YAML/JSON dumps and checkpoints)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
