"""Type constraints of ``variable`` blocks and conversion of values to them.

``type = list(string)`` is written as an expression but means a type, so it is
read from the syntax tree here rather than evaluated. Conversion follows
Terraform's safe conversions: ``"5"`` becomes the number 5, ``true`` becomes the
string ``"true"``, a list becomes a set, an object a map; anything else is a type
error naming the path of the offending element (``element 2: a number is required``).
"""

from __future__ import annotations

from typing import Any

from rlsched.spec import ast as A
from rlsched.spec.diagnostics import EvalError
from rlsched.spec.values import SetValue, make_set, normalize_number, type_name

#: ("string",) ("number",) ("bool",) ("any",) ("list", T) ("set", T) ("map", T)
#: ("tuple", [T...]) ("object", {name: (T, optional, default)})
Type = tuple[Any, ...]
ANY: Type = ("any",)

_PRIMITIVES = ("string", "number", "bool", "any")
_COLLECTIONS = ("list", "set", "map")


def parse_type(expr: A.Expr) -> Type:
    """Read a type constraint (``map(object({ size = number }))``) from its syntax."""
    if isinstance(expr, A.Traversal) and not expr.steps and expr.root in _PRIMITIVES:
        return (expr.root,)
    if isinstance(expr, A.Literal) and expr.value in _PRIMITIVES:
        return (str(expr.value),)  # legacy quoted types: type = "string"
    if isinstance(expr, A.Call):
        if expr.name in _COLLECTIONS:
            if len(expr.args) != 1:
                raise EvalError("Invalid type specification", f"{expr.name}(...) takes exactly one element type.",
                                expr.rng)
            return (expr.name, parse_type(expr.args[0]))
        if expr.name == "tuple" and len(expr.args) == 1 and isinstance(expr.args[0], A.TupleExpr):
            return ("tuple", [parse_type(e) for e in expr.args[0].items])
        if expr.name == "object" and len(expr.args) == 1 and isinstance(expr.args[0], A.ObjectExpr):
            attrs: dict[str, tuple[Type, bool, Any]] = {}
            for item in expr.args[0].items:
                if item.key_name is None:
                    raise EvalError("Invalid type specification", "Object attribute names must be plain names.",
                                    item.key.rng)
                v = item.value
                if isinstance(v, A.Call) and v.name == "optional":
                    if not 1 <= len(v.args) <= 2:
                        raise EvalError("Invalid type specification",
                                        "optional(type) or optional(type, default).", v.rng)
                    default = None
                    if len(v.args) == 2:
                        from rlsched.spec.evaluator import constant

                        default = constant(v.args[1])
                    attrs[item.key_name] = (parse_type(v.args[0]), True, default)
                else:
                    attrs[item.key_name] = (parse_type(v), False, None)
            return ("object", attrs)
    raise EvalError("Invalid type specification",
                    "Expected string, number, bool, any, list(T), set(T), map(T), tuple([...]) or object({...}).",
                    expr.rng)


def type_str(t: Type) -> str:
    """``list(string)`` back from a type, for messages."""
    if t[0] in _PRIMITIVES:
        return str(t[0])
    if t[0] in _COLLECTIONS:
        return f"{t[0]}({type_str(t[1])})"
    if t[0] == "tuple":
        return "tuple([" + ", ".join(type_str(x) for x in t[1]) + "])"
    return "object({" + ", ".join(f"{k} = {type_str(v[0])}" for k, v in t[1].items()) + "})"


class ConversionError(Exception):
    """``value`` does not fit the type; ``message`` says where and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _at(path: str, msg: str) -> ConversionError:
    return ConversionError(f"{path}: {msg}" if path else msg)


def convert(value: Any, t: Type, path: str = "") -> Any:
    """``value`` converted to type ``t``, or :class:`ConversionError`."""
    kind = t[0]
    if value is None or kind == "any":
        return value
    if kind == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return repr(normalize_number(value))
        if isinstance(value, str):
            return value
        raise _at(path, f"a string is required, not a {type_name(value)}")
    if kind == "number":
        if isinstance(value, bool):
            raise _at(path, "a number is required, not a bool")
        if isinstance(value, int | float):
            return value
        if isinstance(value, str):
            try:
                num = float(value.strip())
            except ValueError:
                raise _at(path, f'a number is required, and "{value}" is not one') from None
            return normalize_number(num)
        raise _at(path, f"a number is required, not a {type_name(value)}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if value in ("true", "false"):
            return value == "true"
        raise _at(path, f"a bool is required, not a {type_name(value)}")
    if kind in ("list", "set"):
        if not isinstance(value, list):
            raise _at(path, f"a {kind} is required, not a {type_name(value)}")
        items = [convert(v, t[1], f"{path}[{i}]") for i, v in enumerate(value)]
        return make_set(items) if kind == "set" else items
    if kind == "tuple":
        if not isinstance(value, list) or isinstance(value, SetValue):
            raise _at(path, f"a tuple is required, not a {type_name(value)}")
        if len(value) != len(t[1]):
            raise _at(path, f"a tuple of {len(t[1])} elements is required, not {len(value)}")
        return [convert(v, et, f"{path}[{i}]") for i, (v, et) in enumerate(zip(value, t[1], strict=True))]
    if kind == "map":
        if not isinstance(value, dict):
            raise _at(path, f"a map is required, not a {type_name(value)}")
        return {k: convert(v, t[1], f'{path}["{k}"]') for k, v in value.items()}
    if kind == "object":
        if not isinstance(value, dict):
            raise _at(path, f"an object is required, not a {type_name(value)}")
        out: dict[str, Any] = {}
        for name, (at, optional, default) in t[1].items():
            if name not in value:
                if not optional:
                    raise _at(path, f'attribute "{name}" is required')
                out[name] = convert(default, at, f"{path}.{name}") if default is not None else None
            else:
                out[name] = convert(value[name], at, f"{path}.{name}")
        extra = sorted(set(value) - set(t[1]))
        if extra:
            raise _at(path, f'unexpected attribute "{extra[0]}"')
        return out
    raise _at(path, f"unknown type {kind}")  # pragma: no cover
