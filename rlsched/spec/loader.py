"""Load a pool spec: parse every file, resolve variables and locals, decode the schema.

The loader never stops at the first problem: each block, attribute and
cross-check adds diagnostics to one list, and :class:`SpecError` carries all of
them. Schema v1 is strict; unknown blocks and arguments are errors with a
did-you-mean, because a typo silently ignored is a pool silently misconfigured.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlsched.cluster.catalog import CATALOG, GpuModel
from rlsched.cluster.feasibility import pack_layout
from rlsched.spec import ast as A
from rlsched.spec.diagnostics import EvalError, Poisoned, did_you_mean, error
from rlsched.spec.evaluator import Namespace, Scope, evaluate
from rlsched.spec.gpu_names import resolve_gpu_name, suggest
from rlsched.spec.limits import MAX_SOURCE_BYTES, budget_scope
from rlsched.spec.model import (
    Diagnostic,
    DisruptionDecl,
    HealthDecl,
    LifecycleDecl,
    MigLayoutDecl,
    PolicyDecl,
    PoolDecl,
    QuotaDecl,
    SourceRange,
    Spec,
    SpecError,
    SpotMarketDecl,
    TwinDecl,
)
from rlsched.spec.syntax import parse_text
from rlsched.spec.values import UNKNOWN, BlockRef, SetValue, has_unknown, plain, render, type_name
from rlsched.spec.variables import VarSource, read_declarations, resolve_values, variable_namespace

#: top-level block type -> number of labels
TOP_BLOCKS = {"variable": 1, "locals": 0, "pool": 1, "mig_layout": 1, "quota": 1, "policy": 1, "output": 1}
_REF_KINDS = ("pool", "mig_layout", "quota", "policy")
_NOT_SUPPORTED = {
    "resource": "rlsched declares pools, not resources",
    "provider": "rlsched has no providers",
    "module": "rlsched has no modules",
    "terraform": "rlsched needs no terraform block",
    "data": "rlsched has no data sources",
    "dynamic": "rlsched has no dynamic blocks; use for_each on pool or quota",
}
_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+[a-z]+)?$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_FULL = re.compile(r"^(\d+(?:\.\d+)?(ms|s|m|h))+$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
HEURISTIC_ALIASES = {"weighted_priority": "weighted-priority"}
#: gpu_model of a pool whose model ``validate`` cannot know (it comes from a variable without a value)
UNKNOWN_MODEL = "(unknown)"


def load_spec(paths: list[Path] | Path, *, var_files: Sequence[str | Path] = (), var_args: Sequence[str] = (),
              env: Mapping[str, str] | None = None, var_sources: Sequence[VarSource] | None = None,
              unknown_variables: bool = False) -> Spec:
    """Load, evaluate and check a pool spec.

    Args:
        paths: spec files, or directories whose ``*.hcl`` files are read (lexical order).
        var_files: ``--var-file`` paths (applied before ``var_args`` unless ``var_sources`` is given).
        var_args: ``--var NAME=VALUE`` strings.
        env: environment for ``RLSCHED_VAR_<name>`` (default: ``os.environ``).
        var_sources: ``("file", path)`` / ``("var", "k=v")`` in command-line order; overrides the two above.
        unknown_variables: ``validate``'s mode, as Terraform's: a required variable given no value is
            unknown rather than an error, and what depends on it is checked only as far as it can be
            (``Spec.unknown`` lists the settings left unknown). Plan, apply and the service never use it.

    Returns:
        The evaluated :class:`Spec` (warnings in ``Spec.warnings``).

    Raises:
        SpecError: with every diagnostic when there is at least one error.
    """
    if var_sources is None:
        var_sources = [("file", str(f)) for f in var_files] + [("var", v) for v in var_args]
    loader = _Loader(os.environ if env is None else env, unknown_variables)
    with budget_scope():  # one evaluation budget for the whole load (rlsched.spec.limits)
        return loader.load([paths] if isinstance(paths, Path | str) else list(paths), var_sources)


def duration_seconds(text: str) -> float | None:
    """``"15m"``, ``"1h30m"``, ``"50ms"`` -> seconds; None if not a duration."""
    text = text.strip()
    if not _DURATION_FULL.match(text):
        return None
    return sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))


def heuristics() -> dict[str, str]:
    """Heuristic scheduler names (``rlsched.policies``), imported lazily: no torch."""
    from rlsched.policies.registry import available

    return available()


class _FieldError(Exception):
    def __init__(self, summary: str, detail: str) -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail


class _Block:
    """One evaluated block instance: attribute values with their ranges, and nested blocks.

    ``what`` names the block in messages (``pool "gpu"``: the same for every for_each
    instance, so one mistake reads the same everywhere); ``address`` names the
    instance (``pool.gpu["big"]``) for :attr:`Spec.unknown`.
    """

    def __init__(self, loader: _Loader, block: A.Block, scope: Scope, what: str, address: str = "") -> None:
        self.loader, self.block, self.scope, self.what = loader, block, scope, what
        self.address = address or what
        self.ok = True

    def attrs(self, allowed: Iterable[str], required: Iterable[str] = ()) -> dict[str, tuple[Any, A.Attribute]]:
        allowed = list(allowed)
        out: dict[str, tuple[Any, A.Attribute]] = {}
        for attr in self.block.body.attributes.values():
            if attr.name == "for_each":
                continue
            if attr.name == "count":
                self.fail(error("count is not supported",
                                "rlsched has no count: a count keys objects by position, so removing a middle "
                                "element would renumber, and drain, every object after it. Use for_each with a "
                                "map or set keyed by stable names (each.key, each.value).", attr.name_rng))
                continue
            if attr.name not in allowed:
                self.fail(error("Unsupported argument", f'An argument named "{attr.name}" is not expected in '
                                f"{self.what}." + did_you_mean(attr.name, allowed), attr.name_rng))
                continue
            try:
                out[attr.name] = (evaluate(attr.expr, self.scope), attr)
            except EvalError as exc:
                self.fail(exc.diagnostic())
            except Poisoned:
                self.ok = False
        for name in required:
            if name not in self.block.body.attributes:
                self.fail(error("Missing required argument", f'The argument "{name}" is required in {self.what}.',
                                self.block.rng))
        return out

    def blocks(self, allowed: Iterable[str]) -> dict[str, A.Block]:
        allowed = list(allowed)
        out: dict[str, A.Block] = {}
        for b in self.block.body.blocks:
            if b.type not in allowed:
                extra = f" ({_NOT_SUPPORTED[b.type]})." if b.type in _NOT_SUPPORTED else "."
                self.fail(error("Unsupported block type", f'Blocks of type "{b.type}" are not expected in '
                                f"{self.what}{extra}" + did_you_mean(b.type, allowed), b.type_rng))
            elif b.type in out:
                self.fail(error("Duplicate block", f'Only one "{b.type}" block is allowed in {self.what}; the '
                                f"first is at {out[b.type].rng}.", b.type_rng))
            elif b.labels:
                self.fail(error("Extraneous label", f'A "{b.type}" block takes no labels.', b.label_rngs[0]))
            else:
                out[b.type] = b
        return out

    def sub(self, block: A.Block) -> _Block:
        return _Block(self.loader, block, self.scope, f'a "{block.type}" block', f"{self.address}.{block.type}")

    def fail(self, diag: Diagnostic) -> None:
        self.ok = False
        self.loader.diags.append(diag)

    def field(self, vals: dict[str, tuple[Any, A.Attribute]], name: str, conv: Callable[[Any], Any],
              default: Any = None) -> Any:
        """Convert ``vals[name]`` with ``conv``; a bad value is reported and ``default`` returned."""
        if name not in vals:
            return default
        value, attr = vals[name]
        if has_unknown(value):  # validate without a variable's value: nothing to check here
            self.loader.unknown.add(f"{self.address}.{name}")
            return default
        try:
            return conv(value)
        except _FieldError as exc:
            self.fail(error(exc.summary, f'{name}: {exc.detail}', attr.expr.rng))
            return default


# --- value converters ----------------------------------------------------------------

def _bad_type(want: str, v: Any) -> _FieldError:
    return _FieldError("Incorrect attribute value type", f"{want} is required, not a {type_name(v)} ({render(v)}).")


def _string(v: Any) -> str:
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bool) or v is None or isinstance(v, list | dict):
        raise _bad_type("a string", v)
    return str(v)


def _integer(lo: int | None = None) -> Callable[[Any], int]:
    def conv(v: Any) -> int:
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise _bad_type("a whole number", v) from None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _bad_type("a whole number", v)
        if isinstance(v, float) and not v.is_integer():
            raise _FieldError("Invalid value", f"a whole number is required, not {v}.")
        if lo is not None and v < lo:
            raise _FieldError("Invalid value", f"must be at least {lo}, not {int(v)}.")
        return int(v)

    return conv


def _number(lo: float | None = None, hi: float | None = None) -> Callable[[Any], float]:
    def conv(v: Any) -> float:
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise _bad_type("a number", v) from None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise _bad_type("a number", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise _FieldError("Invalid value", f"must be {rng}, not {v}.")
        return float(v)

    return conv


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v in ("true", "false"):
        return bool(v == "true")
    raise _bad_type("a bool", v)


def _enum(*choices: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        s = _string(v)
        if s not in choices:
            raise _FieldError("Invalid value", f'"{s}" is not one of ' + ", ".join(f'"{c}"' for c in choices)
                              + "." + did_you_mean(s, choices))
        return s

    return conv


def _duration(v: Any) -> float:
    s = _string(v)
    secs = duration_seconds(s)
    if secs is None:
        raise _FieldError("Invalid duration", f'"{s}" is not a duration; write e.g. "90s", "15m", "1h30m" or "50ms".')
    return secs


def _string_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise _bad_type("a list of strings", v)
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, str) or not x:
            raise _FieldError("Incorrect attribute value type", f"element {i}: a non-empty string is required, "
                              f"not {render(x)}.")
        out.append(str(x))
    return tuple(out)


def _int_map(v: Any) -> dict[str, int]:
    if not isinstance(v, dict):
        raise _bad_type("a map of whole numbers", v)
    conv = _integer(0)
    out: dict[str, int] = {}
    for k, x in v.items():
        try:
            out[k] = conv(x)
        except _FieldError as exc:
            raise _FieldError(exc.summary, f'["{k}"]: {exc.detail}') from None
    return out


def _num_map(v: Any) -> dict[str, float]:
    if not isinstance(v, dict):
        raise _bad_type("a map of numbers", v)
    conv = _number()
    out: dict[str, float] = {}
    for k, x in v.items():
        try:
            out[k] = conv(x)
        except _FieldError as exc:
            raise _FieldError(exc.summary, f'["{k}"]: {exc.detail}') from None
    return out


def _ref(kind: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if isinstance(v, BlockRef) and v.kind != kind:
            raise _FieldError("Invalid reference", f"a reference to a {kind} ({kind}.NAME) is required, "
                              f"not {v.address}.")
        return _string(v)

    return conv


# --- the loader ----------------------------------------------------------------------

class _Loader:
    def __init__(self, env: Mapping[str, str], unknown_variables: bool = False) -> None:
        self.env = env
        self.unknown_variables = unknown_variables
        self.unknown: set[str] = set()  # addresses of settings whose value is unknown
        self.diags: list[Diagnostic] = []
        self.top: dict[str, list[A.Block]] = {k: [] for k in TOP_BLOCKS}
        self.files: list[str] = []
        self.local_exprs: dict[str, A.Attribute] = {}
        self.local_values: dict[str, Any] = {}
        self.local_failed: set[str] = set()
        self.local_stack: list[str] = []
        self.block_names: dict[str, dict[str, A.Block]] = {k: {} for k in _REF_KINDS}
        self.instances: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.instances_busy: set[tuple[str, str]] = set()
        self.namespaces: dict[str, Namespace] = {}
        self.quota_attrs: dict[str, dict[str, tuple[Any, A.Attribute]]] = {}
        self.source_bytes = 0
        self.pool_labels: dict[str, str] = {}  # pool instance name -> its block's label
        self.quota_labels: dict[str, str] = {}  # quota instance name -> its block's label
        self.unknown_instances: set[tuple[str, str]] = set()  # (kind, name) whose for_each is unknown

    # -- files ------------------------------------------------------------------------
    def load(self, paths: list[Path | str], var_sources: Sequence[VarSource]) -> Spec:
        files: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir():
                found = sorted(p.glob("*.hcl"))
                if not found:
                    self.diags.append(error("No configuration files", f"{p} holds no *.hcl files."))
                files.extend(found)
            else:
                files.append(p)
        for f in files:
            self.read_file(f)
        decls = read_declarations(self.top["variable"], self.diags)
        dirs = list(dict.fromkeys(f.parent for f in files))
        values, failed = resolve_values(decls, dirs, var_sources, self.env, self.diags, self.unknown_variables)
        self.unknown.update(f"var.{k}" for k, v in values.items() if v is UNKNOWN)
        self.namespaces = {"var": variable_namespace(decls, values, failed), "local": Namespace(
            "local", self.local, lambda: list(self.local_exprs))}
        for kind in _REF_KINDS:
            self.namespaces[kind] = self.ref_namespace(kind)
        for name in list(self.local_exprs):
            with contextlib.suppress(EvalError, Poisoned):  # reported where they arose
                self.local(name, self.local_exprs[name].name_rng)
        spec = self.decode(values)
        # a mistake in a block with for_each fails in every instance alike: report it once
        self.diags = list(dict.fromkeys(self.diags))
        self.diags.sort(key=lambda d: (d.range is not None, d.range.filename if d.range else "",
                                       d.range.line if d.range else 0, d.range.column if d.range else 0))
        errors = [d for d in self.diags if d.severity == "error"]
        if errors or spec is None:
            raise SpecError(self.diags)
        return spec

    def read_file(self, path: Path) -> None:
        name = str(path)
        self.files.append(name)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.diags.append(error("Failed to read file", f"{name} does not exist."))
            return
        except (OSError, UnicodeDecodeError) as exc:
            self.diags.append(error("Failed to read file", f"{name}: {exc}"))
            return
        if len(text) <= MAX_SOURCE_BYTES:  # (a larger file is refused by parse_text, located)
            self.source_bytes += len(text)
        if self.source_bytes > 2 * MAX_SOURCE_BYTES:
            self.diags.append(error("Configuration too large", f"The spec files hold more than "
                                    f"{2 * MAX_SOURCE_BYTES:,} characters in all; this one is not read.",
                                    SourceRange(name, 1, 1)))
            return
        body, diags = parse_text(text, name)
        self.diags.extend(diags)
        if body is None:
            return
        for attr in body.attributes.values():
            self.diags.append(error("Unsupported argument", f'"{attr.name}" cannot be set at the top level; put '
                                    "values in a locals block or a variable.", attr.name_rng))
        for b in body.blocks:
            if b.type not in TOP_BLOCKS:
                extra = f" ({_NOT_SUPPORTED[b.type]})." if b.type in _NOT_SUPPORTED else "."
                self.diags.append(error("Unsupported block type", f'Blocks of type "{b.type}" are not expected '
                                        f"here{extra}" + did_you_mean(b.type, TOP_BLOCKS), b.type_rng))
                continue
            want = TOP_BLOCKS[b.type]
            if len(b.labels) != want:
                if len(b.labels) < want:
                    self.diags.append(error(f"Missing name for {b.type}", f'A {b.type} block needs a name: '
                                            f'{b.type} "NAME" {{ ... }}.', b.type_rng))
                else:
                    self.diags.append(error("Extraneous label", f"A {b.type} block takes {want} label(s).",
                                            b.label_rngs[want]))
                continue
            if b.type in _REF_KINDS:
                seen = self.block_names[b.type]
                if b.labels[0] in seen:
                    self.diags.append(error(f"Duplicate {b.type}", f'{b.type} "{b.labels[0]}" was already declared '
                                            f"at {seen[b.labels[0]].rng}.", b.label_rngs[0]))
                    continue
                seen[b.labels[0]] = b
            if b.type == "output" and any(o.labels[0] == b.labels[0] for o in self.top["output"]):
                self.diags.append(error("Duplicate output", f'output "{b.labels[0]}" is declared twice.',
                                        b.label_rngs[0]))
                continue
            if b.type == "locals":
                for nb in b.body.blocks:
                    self.diags.append(error("Unsupported block type", "A locals block holds only name = value.",
                                            nb.type_rng))
                for attr in b.body.attributes.values():
                    if attr.name in self.local_exprs:
                        self.diags.append(error("Duplicate local value", f'local.{attr.name} was already defined '
                                                f"at {self.local_exprs[attr.name].name_rng}.", attr.name_rng))
                    else:
                        self.local_exprs[attr.name] = attr
            self.top[b.type].append(b)

    # -- names ------------------------------------------------------------------------
    def scope(self, each: Namespace | None = None) -> Scope:
        ns = dict(self.namespaces)
        if each is not None:
            ns["each"] = each
        return Scope(ns)

    def local(self, name: str, rng: SourceRange) -> Any:
        if name in self.local_values:
            return self.local_values[name]
        if name in self.local_failed:
            raise Poisoned(name)
        if name not in self.local_exprs:
            raise EvalError("Reference to undeclared local value",
                            f'A local value with the name "{name}" has not been declared.'
                            + did_you_mean(name, self.local_exprs), rng)
        if name in self.local_stack:
            cycle = [*self.local_stack[self.local_stack.index(name):], name]
            raise EvalError("Cycle in local values", "These local values refer to each other: "
                            + " -> ".join(f"local.{c}" for c in cycle) + ".", rng)
        self.local_stack.append(name)
        try:
            value = evaluate(self.local_exprs[name].expr, self.scope())
        except EvalError as exc:
            self.local_failed.add(name)
            self.diags.append(exc.diagnostic())
            raise Poisoned(name) from None
        except Poisoned:
            self.local_failed.add(name)
            raise
        finally:
            self.local_stack.pop()
        self.local_values[name] = value
        return value

    def ref_namespace(self, kind: str) -> Namespace:
        def lookup(name: str, rng: SourceRange) -> Any:
            blocks = self.block_names[kind]
            if name not in blocks:
                raise EvalError(f"Reference to undeclared {kind}", f'There is no {kind} named "{name}".'
                                + did_you_mean(name, blocks), rng)
            if "for_each" not in blocks[name].body.attributes:
                return BlockRef(kind, name)
            keys = self.for_each(kind, blocks[name])
            if keys is None:
                raise Poisoned(name)
            if (kind, name) in self.unknown_instances:
                return UNKNOWN
            return {k: BlockRef(kind, f'{name}["{k}"]') for k in keys}

        return Namespace(kind, lookup, lambda: list(self.block_names[kind]))

    def for_each(self, kind: str, block: A.Block) -> dict[str, Any] | None:
        """``each.key -> each.value`` of a block with for_each (cached; None if it failed)."""
        key = (kind, block.labels[0])
        if key in self.instances:
            return self.instances[key]
        attr = block.body.attributes["for_each"]
        if key in self.instances_busy:
            raise EvalError("Cycle in for_each", f"The for_each of {kind}.{block.labels[0]} depends on itself.",
                            attr.expr.rng)
        self.instances_busy.add(key)
        result: dict[str, Any] | None = None
        try:
            value = evaluate(attr.expr, self.scope())
            if value is UNKNOWN:  # validate: the instances are unknown; check the body once
                self.unknown_instances.add(key)
                self.unknown.add(f"{kind}.{block.labels[0]}.for_each")
                result = {"*": UNKNOWN}
            elif isinstance(value, SetValue):
                if not all(isinstance(v, str) for v in value):
                    raise EvalError("Invalid for_each argument", "A set used in for_each must hold strings.",
                                    attr.expr.rng)
                result = {str(v): str(v) for v in value}
            elif isinstance(value, dict):
                result = dict(value)
            elif isinstance(value, list):
                raise EvalError("Invalid for_each argument",
                                "for_each needs a map or a set of strings, not a list: a list keys objects by "
                                "position; wrap it in toset(...) to key them by name.", attr.expr.rng)
            else:
                raise EvalError("Invalid for_each argument",
                                f"for_each needs a map or a set of strings, not a {type_name(value)}.",
                                attr.expr.rng)
        except EvalError as exc:
            self.diags.append(exc.diagnostic())
        except Poisoned:
            pass
        finally:
            self.instances_busy.discard(key)
        self.instances[key] = result
        return result

    def expand(self, kind: str, block: A.Block) -> list[tuple[str, Scope]]:
        """Instances of a block: ``[(name, scope)]`` (one unless for_each)."""
        name = block.labels[0]
        if "for_each" not in block.body.attributes:
            return [(name, self.scope())]
        if kind not in ("pool", "quota"):
            self.diags.append(error("for_each is not supported here",
                                    f"for_each is allowed on pool and quota blocks, not on {kind}.",
                                    block.body.attributes["for_each"].name_rng))
            return []
        items = self.for_each(kind, block)
        unknown = (kind, name) in self.unknown_instances
        out = []
        for k, v in (items or {}).items():
            def lookup(attr: str, rng: SourceRange, k: str = k, v: Any = v) -> Any:
                if attr == "key":
                    return UNKNOWN if unknown else k
                if attr == "value":
                    return v
                raise EvalError("Invalid each attribute", f'each has "key" and "value", not "{attr}".'
                                + did_you_mean(attr, ["key", "value"]), rng)

            out.append((f'{name}["{k}"]', self.scope(Namespace("each", lookup, lambda: ["key", "value"]))))
        return out

    # -- schema -----------------------------------------------------------------------
    def decode(self, variables: dict[str, Any]) -> Spec | None:
        layouts: dict[str, MigLayoutDecl] = {}
        failed_layouts: dict[str, MigLayoutDecl] = {}  # with errors, yet still checked against their pools
        for b in self.top["mig_layout"]:
            for name, scope in self.expand("mig_layout", b):
                blk = _Block(self, b, scope, f'mig_layout "{b.labels[0]}"', f"mig_layout.{name}")
                decl = self.mig_layout(blk, name)
                if decl is not None:
                    (layouts if blk.ok else failed_layouts)[name] = decl
        pools: dict[str, PoolDecl] = {}
        failed_pools: dict[str, PoolDecl] = {}  # with errors, yet still cross-checked: all errors at once
        pool_attrs: dict[str, dict[str, tuple[Any, A.Attribute]]] = {}
        for b in self.top["pool"]:
            for name, scope in self.expand("pool", b):
                blk = _Block(self, b, scope, f'pool "{b.labels[0]}"', f"pool.{name}")
                self.pool_labels[name] = b.labels[0]
                res = self.pool(blk, name)
                if res is not None:
                    pool_decl, pool_attrs[name] = res
                    (pools if blk.ok else failed_pools)[name] = pool_decl
        quotas: dict[str, QuotaDecl] = {}
        for b in self.top["quota"]:
            for name, scope in self.expand("quota", b):
                self.quota_labels[name] = b.labels[0]
                q = self.quota(_Block(self, b, scope, f'quota "{b.labels[0]}"', f"quota.{name}"), name)
                if q is not None:
                    quotas[name] = q
        policies: dict[str, PolicyDecl] = {}
        for b in self.top["policy"]:
            for name, scope in self.expand("policy", b):
                p = self.policy(_Block(self, b, scope, f'policy "{b.labels[0]}"', f"policy.{name}"), name)
                if p is not None:
                    policies[name] = p
        outputs: dict[str, Any] = {}
        for b in self.top["output"]:
            blk = _Block(self, b, self.scope(), f'output "{b.labels[0]}"')
            vals = blk.attrs(("value", "description", "sensitive"), ("value",))
            blk.blocks(())
            if "value" in vals:
                outputs[b.labels[0]] = plain(vals["value"][0])
        self.cross_check(pools, pool_attrs, {**failed_layouts, **layouts}, quotas, failed_pools)
        return Spec(pools=pools, layouts=layouts, quotas=quotas, policies=policies, outputs=outputs,
                    variables={k: plain(v) for k, v in variables.items()}, files=tuple(self.files),
                    warnings=tuple(d for d in self.diags if d.severity == "warning"),
                    unknown=tuple(sorted(self.unknown)))

    def mig_layout(self, blk: _Block, name: str) -> MigLayoutDecl | None:
        """The layout, or None when ``devices`` itself is wrong; a layout whose block has other
        errors is still returned (``blk.ok`` is False) so that its fit is checked all the same."""
        vals = blk.attrs(("devices",), ("devices",))
        blk.blocks(())
        errors_before = len(self.diags)
        devices: dict[str, int] = blk.field(vals, "devices", _int_map, {})
        if "devices" in vals:
            rng = vals["devices"][1].expr.rng
            for prof in devices:
                if not _PROFILE.match(prof):
                    blk.fail(error("Invalid MIG profile", f'"{prof}" is not a MIG profile name; mig-parted names '
                                   'look like "1g.10gb", "3g.40gb" or "1g.10gb+me".', rng))
        if "devices" not in vals or len(self.diags) > errors_before:
            return None
        return MigLayoutDecl(name, {k: v for k, v in devices.items() if v > 0}, blk.block.rng)

    def pool(self, blk: _Block, name: str) -> tuple[PoolDecl, dict[str, tuple[Any, A.Attribute]]] | None:
        vals = blk.attrs(("gpu_model", "capacity", "nodes", "node_count", "min_nodes", "max_nodes",
                          "gpus_per_node", "gpus", "mig", "mig_layout", "timeslice_replicas", "cost_per_gpu_hour",
                          "region", "gang", "display_name"), ("gpu_model",))
        nested = blk.blocks(("spot_market", "disruption", "lifecycle"))
        model = ""
        if "gpu_model" in vals and has_unknown(vals["gpu_model"][0]):
            model = UNKNOWN_MODEL
            self.unknown.add(f"{blk.address}.gpu_model")
        elif "gpu_model" in vals:
            raw = blk.field(vals, "gpu_model", _string, "")
            resolved = resolve_gpu_name(raw) if raw else None
            if raw and resolved is None:
                close = suggest(raw)
                hint = f' Did you mean "{close[0]}"?' if close else f" Known models: {', '.join(CATALOG)}."
                blk.fail(error("Unknown GPU model", f'"{raw}" is not a GPU model rlsched knows.' + hint,
                               vals["gpu_model"][1].expr.rng))
            model = resolved or ""
        capacity = blk.field(vals, "capacity", _enum("on_prem", "on_demand", "spot"), "on_prem")
        nodes: tuple[str, ...] = blk.field(vals, "nodes", _string_list, ())
        node_count = blk.field(vals, "node_count", _integer(1))
        min_nodes = blk.field(vals, "min_nodes", _integer(0))
        max_nodes = blk.field(vals, "max_nodes", _integer(1))
        gpus_per_node = blk.field(vals, "gpus_per_node", _integer(1))
        gpus = blk.field(vals, "gpus", _gpus, "all")
        mig = blk.field(vals, "mig", _enum("disabled"))
        layout = blk.field(vals, "mig_layout", _ref("mig_layout"))
        replicas = blk.field(vals, "timeslice_replicas", _integer(1))
        cost = blk.field(vals, "cost_per_gpu_hour", _number(0))
        region = blk.field(vals, "region", _string, "")
        gang = blk.field(vals, "gang", _enum("whole-nodes", "packed"), "whole-nodes")
        display = blk.field(vals, "display_name", _string, "")
        rng = blk.block.rng
        if "nodes" in vals and "node_count" in vals:
            blk.fail(error("Conflicting arguments", "Set either nodes (hostnames, for plan/apply) or node_count "
                           "(for simulation), not both.", vals["node_count"][1].name_rng))
        elif not {"nodes", "node_count"} & set(blk.block.body.attributes):  # (not vals: one may have failed)
            blk.fail(error("Missing required argument", f"{blk.what} needs nodes = [hostnames...] or "
                           "node_count = N.", rng))
        if len(set(nodes)) != len(nodes):
            dup = next(n for n in nodes if nodes.count(n) > 1)
            blk.fail(error("Duplicate node", f'"{dup}" is listed twice in nodes.', vals["nodes"][1].expr.rng))
        for arg in ("min_nodes", "max_nodes"):
            if arg in vals and capacity == "on_prem":
                blk.fail(error("Invalid argument for an on-prem pool", f"{arg} applies to elastic pools "
                               '(capacity = "on_demand" or "spot"); an on-prem pool has a fixed set of nodes.',
                               vals[arg][1].name_rng))
        count = node_count if node_count is not None else (len(nodes) or None)
        if min_nodes is not None and max_nodes is not None and min_nodes > max_nodes:
            blk.fail(error("Invalid value", f"min_nodes ({min_nodes}) is larger than max_nodes ({max_nodes}).",
                           vals["min_nodes"][1].expr.rng))
        if count is not None and max_nodes is not None and "node_count" in vals and count > max_nodes:
            blk.fail(error("Invalid value", f"node_count ({count}) is larger than max_nodes ({max_nodes}).",
                           vals["node_count"][1].expr.rng))
        if mig is not None and layout is not None:
            blk.fail(error("Conflicting arguments", 'Set mig = "disabled" or mig_layout = mig_layout.NAME, '
                           "not both.", vals["mig"][1].name_rng))
        if layout is not None and replicas is not None:
            blk.fail(error("Conflicting arguments", "A GPU is either split by MIG or time-sliced, not both.",
                           vals["timeslice_replicas"][1].name_rng))
        if layout is not None and layout not in self.block_names["mig_layout"]:
            blk.fail(error("Reference to undeclared mig_layout", f'There is no mig_layout named "{layout}".'
                           + did_you_mean(layout, self.block_names["mig_layout"]), vals["mig_layout"][1].expr.rng))
        spot = None
        if "spot_market" in nested:
            if capacity != "spot":
                blk.fail(error("Unexpected spot_market block", 'spot_market applies only to capacity = "spot".',
                               nested["spot_market"].type_rng))
            sb = blk.sub(nested["spot_market"])
            sv = sb.attrs(("max_price_per_gpu_hour", "on_preemption", "fallback_pool", "min_on_demand"))
            sb.blocks(())
            spot = SpotMarketDecl(
                max_price_per_gpu_hour=sb.field(sv, "max_price_per_gpu_hour", _number(0)),
                on_preemption=sb.field(sv, "on_preemption", _enum("requeue", "checkpoint_and_requeue", "fail"),
                                       "checkpoint_and_requeue"),
                fallback_pool=sb.field(sv, "fallback_pool", _ref("pool")),
                min_on_demand=sb.field(sv, "min_on_demand", _integer(0), 0))
            if spot.fallback_pool is not None:
                vals["__fallback_pool"] = (spot.fallback_pool, sv["fallback_pool"][1])
            _not_supported(sb, "max_price_per_gpu_hour", True,
                           "neither the simulator nor the live service caps the price it pays for spot capacity "
                           "(the simulator pays the market price)")
            _not_supported(sb, "fallback_pool", True,
                           "nothing moves work to a named pool when spot capacity is reclaimed (the spot-fallback "
                           "scheduler falls back to any on-demand pool on its own)")
            _not_supported(sb, "on_preemption", spot.on_preemption != "checkpoint_and_requeue",
                           "a job whose spot node is reclaimed is always checkpointed and requeued "
                           '("checkpoint_and_requeue", the default); "requeue" and "fail" are not implemented')
            _not_supported(sb, "min_on_demand", spot.min_on_demand > 0,
                           "nothing keeps a number of on-demand nodes beside a spot pool; set min_nodes on the "
                           "on-demand pool instead")
            blk.ok = blk.ok and sb.ok
        disruption = DisruptionDecl()
        if "disruption" in nested:
            db = blk.sub(nested["disruption"])
            dv = db.attrs(("drain_timeout", "max_unavailable"))
            db.blocks(())
            disruption = DisruptionDecl(db.field(dv, "drain_timeout", _duration, 900.0),
                                        db.field(dv, "max_unavailable", _integer(1), 1))
            blk.ok = blk.ok and db.ok
        lifecycle = LifecycleDecl()
        if "lifecycle" in nested:
            lb = blk.sub(nested["lifecycle"])
            lv = lb.attrs(("prevent_destroy", "create_before_destroy"))
            lb.blocks(())
            lifecycle = LifecycleDecl(lb.field(lv, "prevent_destroy", _boolean, False),
                                      lb.field(lv, "create_before_destroy", _boolean, False))
            _not_supported(lb, "create_before_destroy", lifecycle.create_before_destroy,
                           "apply always drains a node before it reconfigures or releases it; bringing replacement "
                           "capacity up first is not implemented")
            blk.ok = blk.ok and lb.ok
        if not model:
            return None
        # returned even when blk.ok is False: its nodes and MIG layout are still cross-checked
        decl = PoolDecl(name=name, gpu_model=model, capacity=capacity, nodes=nodes, node_count=node_count,
                        min_nodes=min_nodes, max_nodes=max_nodes, gpus_per_node=gpus_per_node, gpus=gpus,
                        mig_layout=layout, timeslice_replicas=replicas, cost_per_gpu_hour=cost, region=region,
                        gang=gang, spot_market=spot, disruption=disruption, lifecycle=lifecycle, display_name=display,
                        range=rng)
        return decl, vals

    def quota(self, blk: _Block, name: str) -> QuotaDecl | None:
        vals = blk.attrs(("pool", "principal", "max_gpus", "max_slices", "max_gpu_hours_per_day"),
                         ("pool", "principal"))
        blk.blocks(())
        pool = blk.field(vals, "pool", _ref("pool"))
        principal = blk.field(vals, "principal", _string, "")
        max_gpus = blk.field(vals, "max_gpus", _integer(0))
        slices = blk.field(vals, "max_slices", _int_map, {})
        hours = blk.field(vals, "max_gpu_hours_per_day", _number(0))
        if "max_gpus" in vals and "max_slices" in vals:
            blk.fail(error("Conflicting arguments", "Set max_gpus (whole GPUs) or max_slices (MIG instances), "
                           "not both: they are different units.", vals["max_slices"][1].name_rng))
        elif not {"max_gpus", "max_slices", "max_gpu_hours_per_day"} & set(vals) and blk.ok:
            blk.fail(error("Missing limit", f"{blk.what} sets no limit: add max_gpus, max_slices or "
                           "max_gpu_hours_per_day.", blk.block.rng))
        if pool is not None and pool not in self.block_names["pool"] and not isinstance(vals["pool"][0], BlockRef):
            blk.fail(error("Reference to undeclared pool", f'There is no pool named "{pool}".'
                           + did_you_mean(pool, self.block_names["pool"]), vals["pool"][1].expr.rng))
        if not blk.ok or pool is None:
            return None
        decl = QuotaDecl(name, pool, principal, max_gpus, slices, hours, blk.block.rng)
        self.quota_attrs[name] = vals
        return decl

    def policy(self, blk: _Block, name: str) -> PolicyDecl | None:
        vals = blk.attrs(("scheduler", "model", "checkpoint", "fallback", "weights", "adapt"), ("scheduler",))
        nested = blk.blocks(("health", "twin"))
        known = heuristics()
        scheduler = blk.field(vals, "scheduler", _string, "")
        if scheduler:
            scheduler = HEURISTIC_ALIASES.get(scheduler, scheduler.replace("_", "-"))
            if scheduler != "rl" and scheduler not in known:
                blk.fail(error("Invalid scheduler", f'"{scheduler}" is not a scheduler: use "rl" or a heuristic ('
                               + ", ".join(known) + ")." + did_you_mean(scheduler, ["rl", *known]),
                               vals["scheduler"][1].expr.rng))
        if "model" in vals and "checkpoint" in vals:
            blk.fail(error("Conflicting arguments", "model and checkpoint name the same thing; set one.",
                           vals["checkpoint"][1].name_rng))
        model = blk.field(vals, "model", _string) or blk.field(vals, "checkpoint", _string)
        fallback = blk.field(vals, "fallback", _string, "weighted-priority")
        fallback = HEURISTIC_ALIASES.get(fallback, fallback.replace("_", "-"))
        if fallback not in known and "fallback" in vals:
            blk.fail(error("Invalid fallback", f'{blk.what} falls back to "{fallback}"; the fallback must be '
                           f"a heuristic ({', '.join(known)})." + did_you_mean(fallback, known),
                           vals["fallback"][1].expr.rng))
        weights = blk.field(vals, "weights", _num_map, {})
        health = HealthDecl()
        if "health" in nested:
            hb = blk.sub(nested["health"])
            hv = hb.attrs(("max_decision_latency", "min_success_rate"))
            hb.blocks(())
            health = HealthDecl(hb.field(hv, "max_decision_latency", _duration, 0.05),
                                hb.field(hv, "min_success_rate", _number(0, 1), 0.95))
            _not_supported(hb, "min_success_rate", True,
                           "the service's fallback guard switches to the fallback on failed, illegal or slow "
                           "decisions (max_decision_latency), not on a success rate")
            blk.ok = blk.ok and hb.ok
        if scheduler == "rl" and not model:
            blk.fail(error("Missing required argument", 'scheduler = "rl" needs model = "<path or URI of the '
                           'trained policy>".', blk.block.rng))
        adapt = blk.field(vals, "adapt", _enum("off", "recommend", "switch"), "off")
        twin = _twin(blk, nested["twin"]) if "twin" in nested else None
        if adapt != "off" and twin is None:
            twin = TwinDecl()
        if not blk.ok:
            return None
        return PolicyDecl(name, scheduler, model, fallback, weights, health, blk.block.rng, adapt, twin)

    # -- cross-checks ------------------------------------------------------------------
    def cross_check(self, pools: dict[str, PoolDecl], attrs: dict[str, dict[str, tuple[Any, A.Attribute]]],
                    layouts: dict[str, MigLayoutDecl], quotas: dict[str, QuotaDecl],
                    failed_pools: Mapping[str, PoolDecl]) -> None:
        """Checks across blocks: nodes in one pool, fallbacks, MIG layouts on their GPU model, quotas.

        Pools that have errors of their own are checked too (``failed_pools``), so a MIG
        layout that does not fit is reported together with a typo elsewhere in its pool,
        not only once the typo is fixed. Their settings that failed are at their defaults,
        which no check here reads as a problem.
        """
        owner: dict[str, tuple[str, SourceRange]] = {}
        layout_users: dict[tuple[str, str], list[tuple[str, SourceRange]]] = {}
        for name, p in {**pools, **failed_pools}.items():
            for node in p.nodes:
                rng = attrs[name]["nodes"][1].expr.rng
                if node in owner:
                    first, first_rng = owner[node]
                    self.diags.append(error("Node in two pools", f"{node} is in pool.{first} ({first_rng}) and "
                                            f"pool.{name} ({rng}); a node belongs to one pool at most.", rng))
                else:
                    owner[node] = (name, rng)
            if "__fallback_pool" in attrs[name]:
                target, attr = attrs[name]["__fallback_pool"]
                if target == name:
                    self.diags.append(error("Invalid fallback_pool", "A pool cannot fall back to itself.",
                                            attr.expr.rng))
                elif target not in self.block_names["pool"] and target not in pools:
                    self.diags.append(error("Reference to undeclared pool", f'There is no pool named "{target}".'
                                            + did_you_mean(target, pools), attr.expr.rng))
            if p.mig_layout is None or p.gpu_model not in CATALOG:  # (unknown to validate)
                continue
            model = CATALOG[p.gpu_model]
            ref_rng = attrs[name]["mig_layout"][1].expr.rng
            label = self.pool_labels.get(name, name)  # every for_each instance of a block reads alike
            if not model.mig_capable:
                self.diags.append(error("GPU model does not support MIG", f"pool.{label} uses {p.gpu_model} GPUs, "
                                        'which cannot be split by MIG; use mig = "disabled".', ref_rng))
                continue
            layout = layouts.get(p.mig_layout)
            if layout is not None:
                problem = layout_problem(model, layout.devices)
                if problem:
                    users = layout_users.setdefault((layout.name, problem), [])
                    if (label, ref_rng) not in users:
                        users.append((label, ref_rng))
        # one error per layout that does not fit, however many pools use it
        for (lname, problem), users in layout_users.items():
            where = self.block_names["mig_layout"][lname].body.attributes["devices"].expr.rng
            shown = [f"pool.{u} at {r}" for u, r in users[:3]]
            more = f" and {len(users) - 3} more" if len(users) > 3 else ""
            self.diags.append(error("Invalid MIG layout", f"{problem} (mig_layout.{lname} is used by "
                                    f"{', '.join(shown)}{more}).", where))
        for qname, q in quotas.items():
            pool = pools.get(q.pool)
            if pool is None or not q.max_slices or pool.gpu_model not in CATALOG:
                continue
            qrng = self.quota_attrs[qname]["max_slices"][1].expr.rng
            if pool.mig_layout is None:
                label = self.quota_labels.get(qname, qname)
                self.diags.append(error("Invalid quota", f'quota "{label}" limits MIG slices, but pool.{q.pool} '
                                        "has no mig_layout; use max_gpus for whole GPUs.", qrng))
                continue
            model = CATALOG[pool.gpu_model]
            for prof in q.max_slices:
                if prof not in {p.name for p in model.mig_profiles}:
                    self.diags.append(error("Invalid quota", f'"{prof}" is not a MIG profile of {model.name} '
                                            f"(pool.{q.pool})." + did_you_mean(prof, [p.name for p in
                                                                                     model.mig_profiles]), qrng))


def _twin(blk: _Block, block: A.Block) -> TwinDecl:
    """``twin { every, days, margin, candidates }`` of a policy block (:class:`TwinDecl`)."""
    tb = blk.sub(block)
    tv = tb.attrs(("every", "days", "margin", "candidates"))
    tb.blocks(())
    d = TwinDecl()
    every = tb.field(tv, "every", _duration, d.every_s)
    if "every" in tv and every < 60:
        tb.fail(error("Invalid value", f"every: the twin replays at most once a minute, not every {every:g} s.",
                      tv["every"][1].expr.rng))
    twin = TwinDecl(every, tb.field(tv, "days", _number(0.01, 366), d.days),
                    tb.field(tv, "margin", _number(0, 1), d.margin),
                    tb.field(tv, "candidates", _string_list, ()))
    blk.ok = blk.ok and tb.ok
    return twin


def _not_supported(blk: _Block, name: str, used: bool, why: str) -> None:
    """Reject a setting the schema knows but nothing implements yet: accepting it would be a
    promise the simulator and the service do not keep. ``used`` says whether the value set asks
    for the unimplemented behaviour (an explicit default that matches what happens is fine)."""
    attr = blk.block.body.attributes.get(name)
    if attr is None or not used:
        return
    blk.fail(error("Setting not supported yet",
                   f"{name} in {blk.what} is not supported yet: {why}. Remove it; README (\"Pool specs\") lists "
                   "what is implemented.", attr.name_rng))


def _gpus(v: Any) -> Any:
    if v == "all":
        return "all"
    if isinstance(v, list) and not isinstance(v, str):
        conv = _integer(0)
        idx = tuple(conv(x) for x in v)
        if len(set(idx)) != len(idx):
            raise _FieldError("Invalid value", "GPU indices must be unique.")
        return idx
    raise _FieldError("Incorrect attribute value type", f'"all" or a list of GPU indices is required, not '
                      f"{render(v)}.")


def _article(name: str) -> str:
    return "an" if name[:1].upper() in "AEFHILMNORSX8" else "a"


def layout_problem(model: GpuModel, devices: dict[str, int]) -> str | None:
    """Why ``devices`` does not fit one GPU of ``model`` (None if it fits), in plain words."""
    legal = {p.name: p for p in model.mig_profiles}
    art = _article(model.name)
    for prof in devices:
        if prof not in legal:
            return (f'"{prof}" is not a MIG profile of {art} {model.name}; its profiles are '
                    + ", ".join(f'"{p}"' for p in legal) + "." + did_you_mean(prof, legal))
    for prof, n in devices.items():
        if n > legal[prof].max_count:
            return f'{n} × "{prof}" does not fit {art} {model.name} (max {legal[prof].max_count})'  # noqa: RUF001
    names = [p for p, n in devices.items() for _ in range(n)]
    if pack_layout(model, names) is not None:
        return None
    compute = sum(legal[p].compute_slices for p in names)
    memory = sum(legal[p].memory_slices for p in names)
    shown = " + ".join(f'{n} × "{p}"' for p, n in devices.items())  # noqa: RUF001
    if compute > 7:
        return f"{shown} does not fit {art} {model.name}: it needs {compute} compute slices, the GPU has 7"
    if memory > 8:
        return f"{shown} does not fit {art} {model.name}: it needs {memory} memory slices, the GPU has 8"
    return f"{shown} does not fit {art} {model.name}: the instances cannot be placed without overlapping"
