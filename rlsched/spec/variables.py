"""Input variables: declarations, the four value sources, type conversion, validation.

Precedence, later wins (as Terraform): ``default`` < environment
``RLSCHED_VAR_<name>`` < ``*.auto.rlvars`` beside the spec (lexical order) <
``--var-file`` / ``--var k=v`` in command-line order. Environment and ``--var``
values are strings; for variables whose type is not a primitive they are parsed
as HCL expressions (``["a","b"]``), as Terraform does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsched.spec import ast as A
from rlsched.spec.diagnostics import EvalError, Poisoned, did_you_mean, error, warning
from rlsched.spec.evaluator import Namespace, Scope, constant, evaluate
from rlsched.spec.model import Diagnostic, SourceRange
from rlsched.spec.syntax import parse_text
from rlsched.spec.types import ANY, ConversionError, Type, convert, parse_type, type_str
from rlsched.spec.values import UNKNOWN

ENV_PREFIX = "RLSCHED_VAR_"
VarSource = tuple[str, str]  # ("file", path) or ("var", "name=value"), in command-line order


@dataclass
class VarDecl:
    """One ``variable`` block after reading its attributes."""

    name: str
    block: A.Block
    type: Type = ANY
    typed: bool = False
    has_default: bool = False
    default: Any = None
    nullable: bool = True
    sensitive: bool = False
    description: str = ""
    validations: list[tuple[A.Expr, A.Expr | None]] = field(default_factory=list)


@dataclass
class _Value:
    value: Any
    origin: str
    rng: SourceRange | None
    raw: bool = False  # an unparsed string from the environment or --var


_VAR_ATTRS = ("type", "default", "description", "sensitive", "nullable")


def read_declarations(blocks: list[A.Block], diags: list[Diagnostic]) -> dict[str, VarDecl]:
    """``variable`` blocks -> declarations (type, default, validations), reporting misuse."""
    decls: dict[str, VarDecl] = {}
    for b in blocks:
        name = b.labels[0]
        if name in decls:
            diags.append(error("Duplicate variable declaration",
                               f'A variable named "{name}" was already declared at {decls[name].block.rng}.',
                               b.label_rngs[0]))
            continue
        d = VarDecl(name, b)
        decls[name] = d
        for attr in b.body.attributes.values():
            if attr.name not in _VAR_ATTRS:
                diags.append(error("Unsupported argument", f'An argument named "{attr.name}" is not expected '
                                   "in a variable block." + did_you_mean(attr.name, _VAR_ATTRS), attr.name_rng))
                continue
            try:
                if attr.name == "type":
                    d.type, d.typed = parse_type(attr.expr), True
                elif attr.name == "default":
                    d.has_default, d.default = True, constant(attr.expr, "a variable default")
                else:
                    v = constant(attr.expr, f"the {attr.name} of a variable")
                    want = ("string",) if attr.name == "description" else ("bool",)
                    v = convert(v, want)
                    if attr.name == "description":
                        d.description = v or ""
                    elif attr.name == "nullable":
                        d.nullable = bool(v)
                    else:
                        d.sensitive = bool(v)
            except EvalError as exc:
                diags.append(exc.diagnostic())
            except ConversionError as exc:
                diags.append(error("Invalid value", f"{attr.name}: {exc.message}.", attr.expr.rng))
        for nb in b.body.blocks:
            if nb.type != "validation":
                diags.append(error("Unsupported block type", f'Blocks of type "{nb.type}" are not expected in a '
                                   "variable block." + did_you_mean(nb.type, ["validation"]), nb.type_rng))
                continue
            attrs = nb.body.attributes
            for extra in set(attrs) - {"condition", "error_message"}:
                diags.append(error("Unsupported argument", f'"{extra}" is not expected in a validation block.',
                                   attrs[extra].name_rng))
            if "condition" not in attrs:
                diags.append(error("Missing required argument", 'A validation block needs "condition".', nb.rng))
                continue
            msg = attrs.get("error_message")
            d.validations.append((attrs["condition"].expr, msg.expr if msg else None))
    return decls


def _parse_values_file(path: Path, diags: list[Diagnostic]) -> dict[str, tuple[Any, SourceRange]]:
    """A ``.rlvars`` file: ``name = value`` lines with constant values."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        diags.append(error("Failed to read variables file", f"{path}: {exc}"))
        return {}
    body, file_diags = parse_text(text, str(path))
    diags.extend(file_diags)
    if body is None:
        return {}
    for b in body.blocks:
        diags.append(error("Unexpected block", "A variables file holds only name = value assignments.", b.type_rng))
    out: dict[str, tuple[Any, SourceRange]] = {}
    for attr in body.attributes.values():
        try:
            out[attr.name] = (constant(attr.expr, "a variables file"), attr.expr.rng)
        except EvalError as exc:
            diags.append(exc.diagnostic())
    return out


def _parse_raw(raw: str, decl: VarDecl, origin: str) -> Any:
    """An environment or ``--var`` string, parsed as HCL when the type is not primitive."""
    if not decl.typed or decl.type[0] in ("string", "number", "bool"):
        return raw
    body, diags = parse_text(f"v = {raw}\n", origin)
    if body is None or diags or "v" not in body.attributes:
        raise EvalError("Invalid value for variable", f'The value of {origin} for variable "{decl.name}" is not a '
                        f"valid expression for type {type_str(decl.type)}: {raw!r}.")
    return constant(body.attributes["v"].expr, origin)


def resolve_values(decls: dict[str, VarDecl], spec_dirs: Sequence[Path], sources: Sequence[VarSource],
                   env: Mapping[str, str], diags: list[Diagnostic],
                   unknown_if_missing: bool = False) -> tuple[dict[str, Any], set[str]]:
    """Final value of every variable, and the names whose value failed (poisoned).

    With ``unknown_if_missing`` (``validate``), a required variable nobody set is
    :data:`~rlsched.spec.values.UNKNOWN` instead of an error, and its validation
    rules are not run.
    """
    chosen: dict[str, _Value] = {}
    for name in decls:
        key = ENV_PREFIX + name
        if key in env:
            chosen[name] = _Value(env[key], f"the environment variable {key}", None, raw=True)
    seen: set[Path] = set()
    for d in spec_dirs:
        for path in sorted(d.glob("*.auto.rlvars")):
            if path in seen:
                continue
            seen.add(path)
            _apply_file(path, decls, chosen, diags)
    for kind, value in sources:
        if kind == "file":
            _apply_file(Path(value), decls, chosen, diags)
            continue
        name, sep, raw = value.partition("=")
        name = name.strip()
        if not sep or not name:
            diags.append(error("Invalid --var", f'Expected --var NAME=VALUE, not "{value}".'))
            continue
        if name not in decls:
            diags.append(error("Value for undeclared variable",
                               f'--var sets "{name}", but no variable "{name}" is declared.'
                               + did_you_mean(name, decls)))
            continue
        chosen[name] = _Value(raw, f"--var {name}=...", None, raw=True)
    values: dict[str, Any] = {}
    failed: set[str] = set()
    for name, decl in decls.items():
        src = chosen.get(name)
        if src is None:
            if not decl.has_default and unknown_if_missing:
                values[name] = UNKNOWN
                continue
            if not decl.has_default:
                diags.append(error(f'No value for required variable "{name}"',
                                   f'Set it with --var \'{name}=...\', in a .rlvars file (a *.auto.rlvars file '
                                   f'beside the spec or --var-file) as {name} = ..., or with the environment '
                                   f"variable {ENV_PREFIX}{name}.", decl.block.label_rngs[0]))
                failed.add(name)
                continue
            src = _Value(decl.default, "its default", _attr_rng(decl.block, "default"))
        try:
            value = _parse_raw(src.value, decl, src.origin) if src.raw else src.value
            if value is None and not decl.nullable:
                raise ConversionError("null is not allowed (nullable = false)")
            values[name] = convert(value, decl.type)
        except ConversionError as exc:
            diags.append(error("Invalid value for variable",
                               f'The value of variable "{name}" from {src.origin} is not a {type_str(decl.type)}: '
                               f"{exc.message}.", src.rng or decl.block.label_rngs[0]))
            failed.add(name)
        except EvalError as exc:
            diags.append(error(exc.summary, exc.detail, exc.rng or src.rng or decl.block.label_rngs[0]))
            failed.add(name)
    var_ns = variable_namespace(decls, values, failed)
    for name, decl in decls.items():
        if name in failed or values.get(name) is UNKNOWN:
            continue
        scope = Scope({"var": var_ns})
        for cond, msg in decl.validations:
            try:
                ok = evaluate(cond, scope)
                if ok is UNKNOWN:  # depends on another variable validate has no value for
                    continue
                if not isinstance(ok, bool):
                    raise EvalError("Invalid validation condition",
                                    "The condition must be true or false.", cond.rng)
                if not ok:
                    message = evaluate(msg, scope) if msg is not None else "The value failed validation."
                    src = chosen.get(name)
                    where = src.origin if src else "its default"
                    rng = (src.rng if src else _attr_rng(decl.block, "default")) or cond.rng
                    diags.append(error("Invalid value for variable",
                                       f"{message}\n\nThis was checked by the validation rule at {cond.rng} "
                                       f'(variable "{name}", value from {where}).', rng))
                    failed.add(name)
                    break
            except EvalError as exc:
                diags.append(exc.diagnostic())
            except Poisoned:
                pass
    return values, failed


def _attr_rng(block: A.Block, name: str) -> SourceRange | None:
    attr = block.body.attributes.get(name)
    return attr.expr.rng if attr else None


def _apply_file(path: Path, decls: dict[str, VarDecl], chosen: dict[str, _Value], diags: list[Diagnostic]) -> None:
    for name, (value, rng) in _parse_values_file(path, diags).items():
        if name not in decls:
            diags.append(warning("Value for undeclared variable",
                                 f'{path.name} sets "{name}", but no variable "{name}" is declared.'
                                 + did_you_mean(name, decls), rng))
            continue
        chosen[name] = _Value(value, str(path), rng)


def variable_namespace(decls: dict[str, VarDecl], values: dict[str, Any], failed: set[str]) -> Namespace:
    """``var.NAME``: a declared variable's value; an undeclared name gets a did-you-mean."""

    def lookup(name: str, rng: SourceRange) -> Any:
        if name in values:
            return values[name]
        if name in failed:
            raise Poisoned(name)
        raise EvalError("Reference to undeclared input variable",
                        f'An input variable with the name "{name}" has not been declared.'
                        + did_you_mean(name, decls), rng)

    return Namespace("var", lookup, lambda: list(decls))
