"""docs/reference/configuration.md: every config section and key, from the pydantic models."""

from __future__ import annotations

import datetime as dt
import enum
import importlib
import types
import typing
from typing import Any

from reference_pages.markdown import (
    CONFIG_MODULE,
    CONFIG_ROOT_MODEL,
    banner,
    cell,
    code,
    module_file,
    page,
    paragraph,
    slug,
    table,
)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if origin in (tuple, list):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_type_name(args[0])}"
        if origin is list and args:
            return f"list of {_type_name(args[0])}"
        return "list"
    if origin in (dict,):
        return "mapping"
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        optional = any(arg is type(None) for arg in args)
        return " or ".join(names) + (" or null" if optional else "")
    if annotation is dt.date:
        return "date (YYYY-MM-DD)"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in annotation)
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _binary_size(value: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return ""


def _yaml_value(value: Any) -> str:
    """A default as it would be written in the YAML file."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml_value(item)}" for key, item in value.items()) + "}"
    return repr(value)


def _default(name: str, field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    shown = code(_yaml_value(value))
    if isinstance(value, int) and not isinstance(value, bool) and name.endswith("bytes") and _binary_size(value):
        shown += f" ({_binary_size(value)})"
    return shown


_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def _constraints(field: Any) -> str:
    found = []
    for item in field.metadata:
        for attribute, symbol in _BOUNDS:
            bound = getattr(item, attribute, None)
            if bound is not None:
                found.append(f"{symbol} {bound}")
        for attribute, words in (("min_length", "length ≥"), ("max_length", "length ≤")):
            bound = getattr(item, attribute, None)
            if bound is not None:
                found.append(f"{words} {bound}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            found.append(f"matches {code(pattern)}")
    return ", ".join(found)


def _is_model(annotation: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _config_section(key: str, model: type, description: str, out: list[str]) -> None:
    nested: list[tuple[str, type, str]] = []
    rows = []
    for name, field in model.model_fields.items():
        if _is_model(field.annotation):
            nested.append((f"{key}.{name}", field.annotation, field.description or paragraph(field.annotation.__doc__)))
            continue
        rows.append(
            [
                code(f"{key}.{name}"),
                cell(_type_name(field.annotation)),
                _default(name, field),
                cell(_constraints(field)),
                cell(field.description or ""),
            ]
        )
    out += [f"## {key}", ""]
    if description:
        out += [description, ""]
    if rows:
        out += table(["key", "type", "default", "constraints", "description"], rows) + [""]
    for nested_key, nested_model, nested_description in nested:
        _config_section(nested_key, nested_model, nested_description, out)


def render_configuration() -> str:
    """docs/reference/configuration.md from the pydantic models of the config."""
    root = getattr(importlib.import_module(CONFIG_MODULE), CONFIG_ROOT_MODEL)
    out = [
        banner(module_file(CONFIG_MODULE)),
        "",
        "# Configuration reference",
        "",
        "Every key of the YAML configuration (`$AIENG_CONFIG`, default `configs/pipeline.yaml`), section by "
        "section, as the code checks it. An unknown key, a wrong type or a value outside its constraints stops "
        "with an error naming the key and the file. What the sections are for and how they are read: "
        "[Configuration](../configuration.md).",
        "",
    ]
    sections = []
    top_rows = []
    for name, field in root.model_fields.items():
        if _is_model(field.annotation):
            sections.append((name, field.annotation, field.description or paragraph(field.annotation.__doc__)))
        else:
            top_rows.append(
                [
                    code(name),
                    cell(_type_name(field.annotation)),
                    _default(name, field),
                    cell(_constraints(field)),
                    cell(field.description or ""),
                ]
            )
    out += ["Sections: " + ", ".join(f"[`{name}:`](#{slug(name)})" for name, _, _ in sections) + ".", ""]
    if top_rows:
        out += ["## Top level", ""] + table(["key", "type", "default", "constraints", "description"], top_rows)
        out += [""]
    for name, model, description in sections:
        _config_section(name, model, description, out)
    return page(out)
