"""rlsched's evaluator for HCL expressions (python-hcl2 evaluates nothing).

Evaluation is strict, total and side-effect free: every failure is an
:class:`EvalError` at the offending sub-expression, and a value that depends on
an already-reported failure raises :class:`Poisoned` so it is not reported again.
Names resolve through :class:`Namespace` objects (``var``, ``local``, ``each``,
``pool``...) so that ``local`` can be lazy (any order, cycles detected by the
loader) and unknown names get a did-you-mean.

Evaluation is bounded (:mod:`rlsched.spec.limits`): every step and every value
built is charged to the budget of the load in progress, and every value is
measured against the size limits, so no expression can hang or exhaust memory.

An unknown value (:data:`~rlsched.spec.values.UNKNOWN`, a variable ``validate`` has
no value for) propagates: whatever is computed from it is unknown, and only the
errors that do not depend on it are reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rlsched.spec import ast as A
from rlsched.spec.diagnostics import EvalError, did_you_mean
from rlsched.spec.functions import FUNCTIONS, SPECIAL, FunctionError, call, names
from rlsched.spec.limits import MAX_ITEMS, MAX_STRING, Budget, LimitError, current_budget
from rlsched.spec.model import SourceRange
from rlsched.spec.types import ConversionError, convert
from rlsched.spec.values import UNKNOWN, SetValue, equal, has_unknown, make_set, normalize_number, type_name

_UNSUPPORTED_ROOTS = {
    "self": "self is not available: refer to the block by its address (pool.NAME).",
    "path": "path.* is not available in rlsched specs.",
    "terraform": "terraform.* is not available in rlsched specs.",
    "data": "rlsched has no data sources.",
    "module": "rlsched has no modules.",
}


@dataclass
class Namespace:
    """A top-level name such as ``var``: ``lookup(attr, rng)`` resolves ``var.attr``."""

    kind: str
    lookup: Callable[[str, SourceRange], Any]
    names: Callable[[], Iterable[str]]


@dataclass
class Scope:
    """Names visible to an expression: namespaces plus for-expression variables."""

    namespaces: dict[str, Namespace] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)
    context: str = ""  # e.g. "a variable default", for "Variables not allowed" messages

    def child(self, **values: Any) -> Scope:
        return Scope(self.namespaces, {**self.variables, **values}, self.context)


def constant(expr: A.Expr, context: str = "this value") -> Any:
    """Evaluate an expression that may not refer to anything (defaults, .rlvars values)."""
    return evaluate(expr, Scope(context=context))


def evaluate(expr: A.Expr, scope: Scope) -> Any:
    """The value of ``expr`` in ``scope``.

    Raises:
        EvalError: the expression is wrong (one diagnostic).
        Poisoned: it depends on something already reported.
    """
    try:
        return _Eval(scope, current_budget()).eval(expr)
    except RecursionError:
        raise LimitError("Expression too complex", "The expression nests too deeply to evaluate.", expr.rng) from None


class _Eval:
    def __init__(self, scope: Scope, budget: Budget) -> None:
        self.scope = scope
        self.budget = budget

    def eval(self, e: A.Expr) -> Any:
        """The value of ``e``, charged to the budget and checked against the value limits."""
        budget = self.budget
        budget.left -= 1
        if budget.left < 0:
            budget.charge(0, e.rng)  # words the overdraft
        value = self._eval(e)
        if value is not None and value is not True and value is not False:
            budget.measure(value, e.rng)
        return value

    def _eval(self, e: A.Expr) -> Any:
        if isinstance(e, A.Literal):
            return e.value
        if isinstance(e, A.Template):
            return self.template(e.parts, e.rng)
        if isinstance(e, A.Traversal):
            return self.traversal(e)
        if isinstance(e, A.Relative):
            value = self.eval(e.source)
            return self.steps(value, e.steps)
        if isinstance(e, A.Splat):
            return self.splat(e)
        if isinstance(e, A.TupleExpr):
            return [self.eval(x) for x in e.items]
        if isinstance(e, A.ObjectExpr):
            return self.object(e)
        if isinstance(e, A.Call):
            return self.call(e)
        if isinstance(e, A.Binary):
            return self.binary(e)
        if isinstance(e, A.Unary):
            return self.unary(e)
        if isinstance(e, A.Conditional):
            cond_value = self.eval(e.cond)
            if cond_value is UNKNOWN:  # either branch may be taken: check both
                self.eval(e.then)
                self.eval(e.otherwise)
                return UNKNOWN
            cond = self.bool_of(cond_value, e.cond.rng, "The condition")
            return self.eval(e.then if cond else e.otherwise)
        if isinstance(e, A.ForExpr):
            return self.for_expr(e)
        raise EvalError("Unsupported expression", "", e.rng)  # pragma: no cover

    # -- names ------------------------------------------------------------------------
    def traversal(self, e: A.Traversal) -> Any:
        root = e.root
        if root in self.scope.variables:
            return self.steps(self.scope.variables[root], e.steps)
        if self.scope.context and root in ("var", "local", "each", "pool", "mig_layout", "quota", "policy",
                                           "count"):
            raise EvalError("Variables not allowed", f"References are not allowed in {self.scope.context}; "
                            "write a constant value.", e.rng)
        if root == "count":
            raise EvalError("count is not supported",
                            "rlsched has no count: a count keys objects by position, so removing a middle "
                            "element would renumber, and drain, every object after it. Use for_each with a "
                            "map or set keyed by stable names, and each.key / each.value.", e.rng)
        ns = self.scope.namespaces.get(root)
        if ns is None:
            if root in _UNSUPPORTED_ROOTS:
                raise EvalError("Unsupported reference", _UNSUPPORTED_ROOTS[root], e.rng)
            if root == "each":
                raise EvalError("Reference to \"each\" in a block without for_each",
                                "each.key and each.value exist only inside a pool or quota block that sets "
                                "for_each.", e.rng)
            known = [*self.scope.variables, *self.scope.namespaces]
            raise EvalError("Unknown variable", f'There is no variable named "{root}".'
                            + did_you_mean(root, known), e.rng)
        if not e.steps or not isinstance(e.steps[0], A.GetAttr):
            raise EvalError("Invalid reference", f'A reference to "{root}" must be followed by an attribute, '
                            f'as in {root}.NAME.', e.rng)
        first = e.steps[0]
        value = ns.lookup(first.name, SourceRange(e.rng.filename, e.rng.line, e.rng.column,
                                                  first.rng.end_line, first.rng.end_column))
        return self.steps(value, e.steps[1:])

    def steps(self, value: Any, steps: list[A.Step]) -> Any:
        for step in steps:
            value = self.step(value, step)
        return value

    def step(self, value: Any, step: A.Step) -> Any:
        if value is UNKNOWN:
            if isinstance(step, A.Index):
                self.eval(step.key)
            return UNKNOWN
        if isinstance(step, A.GetAttr):
            if isinstance(value, dict):
                if step.name not in value:
                    raise EvalError("Unsupported attribute",
                                    f'This object does not have an attribute named "{step.name}".'
                                    + did_you_mean(step.name, value), step.rng)
                return value[step.name]
            if value is None:
                raise EvalError("Attempt to get attribute from null value", "This value is null.", step.rng)
            raise EvalError("Unsupported attribute",
                            f'Can\'t access attribute "{step.name}" on a {type_name(value)} value.', step.rng)
        key = self.eval(step.key)
        if key is UNKNOWN:
            return UNKNOWN
        if isinstance(value, SetValue):
            raise EvalError("Invalid index", "Elements of a set cannot be accessed by index; use tolist() "
                            "first or for_each over the set.", step.rng)
        if isinstance(value, list):
            try:
                i = convert(key, ("number",))
            except ConversionError:
                raise EvalError("Invalid index", f"A list index must be a number, not a {type_name(key)}.",
                                step.rng) from None
            if not isinstance(i, int) or not 0 <= i < len(value):
                raise EvalError("Invalid index", f"The index {key} is out of range for a list of "
                                f"{len(value)} element(s).", step.rng)
            return value[i]
        if isinstance(value, dict):
            if isinstance(key, list | dict) or key is None:
                raise EvalError("Invalid index", f"A map key must be a string, not a {type_name(key)}.", step.rng)
            k = convert(key, ("string",))
            if k not in value:
                raise EvalError("Invalid index", f'The map has no element with the key "{k}".'
                                + did_you_mean(k, value), step.rng)
            return value[k]
        if value is None:
            raise EvalError("Attempt to index null value", "This value is null.", step.rng)
        raise EvalError("Invalid index", f"A {type_name(value)} value cannot be indexed.", step.rng)

    def splat(self, e: A.Splat) -> Any:
        source = self.eval(e.source)
        if source is None:
            return []
        if source is UNKNOWN:
            return UNKNOWN
        items = source if isinstance(source, list) else [source]
        self.budget.charge(len(items), e.rng)
        return [self.steps(x, e.steps) for x in items]

    # -- constructors -------------------------------------------------------------------
    def object(self, e: A.ObjectExpr) -> Any:
        out: dict[str, Any] = {}
        unknown = False
        for item in e.items:
            key = self.eval(item.key)
            if key is UNKNOWN:
                unknown = True
                self.eval(item.value)
                continue
            if isinstance(key, list | dict | bool) or key is None:
                raise EvalError("Invalid object key", f"An object key must be a string, not a {type_name(key)}.",
                                item.key.rng)
            k = convert(key, ("string",))
            if k in out:
                raise EvalError("Duplicate object key", f'The key "{k}" is set more than once.', item.key.rng)
            out[k] = self.eval(item.value)
        return UNKNOWN if unknown else out

    def template(self, parts: list[A.TemplatePart], rng: SourceRange) -> Any:
        out: list[str] = []
        length = 0
        unknown = False

        def add(piece: str) -> None:
            nonlocal length
            length += len(piece)
            if length > MAX_STRING:
                raise LimitError("String too long", f"The template builds a string of more than {MAX_STRING:,} "
                                 "characters.", rng)
            self.budget.charge(1 + len(piece) // 16, rng)
            out.append(piece)

        for p in parts:
            if isinstance(p, str):
                add(p)
            elif isinstance(p, A.TemplateIf):
                cond_value = self.eval(p.cond)
                if cond_value is UNKNOWN:
                    unknown = True
                    continue
                cond = self.bool_of(cond_value, p.cond.rng, "The %{if} condition")
                piece = self.template(p.then if cond else p.otherwise, rng)
                if piece is UNKNOWN:
                    unknown = True
                else:
                    add(piece)
            elif isinstance(p, A.TemplateFor):
                coll = self.eval(p.collection)
                if coll is UNKNOWN:
                    unknown = True
                    continue
                for k, v in self.iterate(coll, p.collection.rng):
                    names_ = {p.value_var: v} | ({p.key_var: k} if p.key_var else {})
                    piece = _Eval(self.scope.child(**names_), self.budget).template(p.body, rng)
                    if piece is UNKNOWN:
                        unknown = True
                    else:
                        add(piece)
            else:
                v = self.eval(p)
                if v is UNKNOWN:
                    unknown = True
                    continue
                if isinstance(v, list | dict):
                    raise EvalError("Invalid template interpolation value",
                                    f"Cannot include a {type_name(v)} in a string; use join() or jsonencode().",
                                    p.rng)
                if v is None:
                    raise EvalError("Invalid template interpolation value",
                                    "The expression is null; null cannot be included in a string.", p.rng)
                add(convert(v, ("string",)))
        return UNKNOWN if unknown else "".join(out)

    def iterate(self, coll: Any, rng: SourceRange) -> list[tuple[Any, Any]]:
        if isinstance(coll, SetValue):
            return [(v, v) for v in coll]
        if isinstance(coll, list):
            return list(enumerate(coll))
        if isinstance(coll, dict):
            return [(k, coll[k]) for k in sorted(coll)]
        raise EvalError("Iteration over non-iterable value",
                        f"A for expression needs a list, set or map, not a {type_name(coll)}.", rng)

    def for_expr(self, e: A.ForExpr) -> Any:
        coll = self.eval(e.collection)
        if coll is UNKNOWN:
            return UNKNOWN
        pairs = self.iterate(coll, e.collection.rng)
        tuple_out: list[Any] = []
        obj_out: dict[str, Any] = {}
        for k, v in pairs:
            bind = {e.value_var: v} | ({e.key_var: k} if e.key_var else {})
            inner = _Eval(self.scope.child(**bind), self.budget)
            if e.cond is not None:
                keep = inner.eval(e.cond)
                if keep is UNKNOWN:
                    return UNKNOWN
                if not inner.bool_of(keep, e.cond.rng, "The for condition"):
                    continue
            value = inner.eval(e.value)
            if e.key is None:
                tuple_out.append(value)
                if len(tuple_out) > MAX_ITEMS:
                    raise LimitError("Collection too large", f"The for expression makes more than {MAX_ITEMS:,} "
                                     "elements.", e.rng)
                continue
            key = inner.eval(e.key)
            if key is UNKNOWN:
                return UNKNOWN
            if isinstance(key, list | dict) or key is None:
                raise EvalError("Invalid object key", f"A key must be a string, not a {type_name(key)}.", e.key.rng)
            ks = convert(key, ("string",))
            if e.group:
                obj_out.setdefault(ks, []).append(value)
            elif ks in obj_out:
                raise EvalError("Duplicate object key",
                                f'Two elements produce the key "{ks}"; add "..." after the value expression to '
                                "group them into lists.", e.key.rng)
            else:
                obj_out[ks] = value
            if len(obj_out) > MAX_ITEMS:
                raise LimitError("Collection too large", f"The for expression makes more than {MAX_ITEMS:,} "
                                 "elements.", e.rng)
        if e.key is None and isinstance(coll, SetValue):
            return tuple_out
        return tuple_out if e.key is None else obj_out

    # -- calls ---------------------------------------------------------------------
    def call(self, e: A.Call) -> Any:
        if e.name in SPECIAL:
            if len(e.args) < 1 or (e.name == "can" and len(e.args) != 1):
                raise EvalError("Invalid function argument", f"{e.name} needs "
                                f"{'one argument' if e.name == 'can' else 'at least one argument'}.", e.rng)
            for arg in e.args:
                try:
                    value = self.eval(arg)
                except LimitError:
                    raise  # a bomb is not a failure to try the next alternative on
                except EvalError:
                    if e.name == "can":
                        return False
                    continue
                if e.name == "can":
                    return UNKNOWN if has_unknown(value) else True
                return value
            raise EvalError("Invalid function argument", "try: no argument could be evaluated.", e.rng)
        if e.name not in FUNCTIONS:
            raise EvalError("Call to unknown function", f'There is no function named "{e.name}".'
                            + did_you_mean(e.name, names()), e.rng)
        args = [self.eval(a) for a in e.args]
        if e.expand and args and args[-1] is UNKNOWN:
            return UNKNOWN
        if e.expand:
            if not args or not isinstance(args[-1], list):
                raise EvalError("Invalid expanding argument value",
                                "The argument before ... must be a list.", e.args[-1].rng if e.args else e.rng)
            args = [*args[:-1], *args[-1]]
        # a function may read all of its arguments: charge what it could read, before it runs
        self.budget.charge(sum(self.budget.measure(a, e.rng)[0] for a in args), e.rng)
        if any(has_unknown(a) for a in args):
            return UNKNOWN
        try:
            result = call(e.name, args)
        except FunctionError as exc:
            raise EvalError("Invalid function argument", f"{e.name}: {exc}", e.rng) from None
        except LimitError as exc:
            if exc.rng is None:
                exc.rng = e.rng
            raise
        if isinstance(result, str):
            self.budget.charge(1 + len(result) // 16, e.rng)
        return result

    # -- operators ---------------------------------------------------------------------
    def bool_of(self, v: Any, rng: SourceRange, what: str) -> bool:
        try:
            b = convert(v, ("bool",))
        except ConversionError:
            b = None
        if not isinstance(b, bool):
            raise EvalError("Invalid condition" if "condition" in what else "Invalid operand",
                            f"{what} must be a bool (true or false), not a {type_name(v)}.", rng)
        return b

    def number_of(self, v: Any, rng: SourceRange, op: str) -> int | float:
        if isinstance(v, bool) or v is None or isinstance(v, list | dict):
            raise EvalError("Invalid operand", f'Unsuitable value for the "{op}" operator: a number is required, '
                            f"not a {type_name(v)}.", rng)
        try:
            n = convert(v, ("number",))
        except ConversionError as exc:
            raise EvalError("Invalid operand", f'Unsuitable value for the "{op}" operator: {exc.message}.',
                            rng) from None
        assert isinstance(n, int | float)
        return n

    def unary(self, e: A.Unary) -> Any:
        v = self.eval(e.operand)
        if v is UNKNOWN:
            return UNKNOWN
        if e.op == "!":
            return not self.bool_of(v, e.operand.rng, 'The operand of "!"')
        return normalize_number(-self.number_of(v, e.operand.rng, "-"))

    def binary(self, e: A.Binary) -> Any:
        op = e.op
        if op in ("&&", "||"):
            left_value = self.eval(e.left)
            left = None if left_value is UNKNOWN else self.bool_of(left_value, e.left.rng,
                                                                    f'The left operand of "{op}"')
            if left is not None and ((op == "&&" and not left) or (op == "||" and left)):
                return left
            right_value = self.eval(e.right)
            if right_value is UNKNOWN:
                return UNKNOWN
            right = self.bool_of(right_value, e.right.rng, f'The right operand of "{op}"')
            if left is None:  # unknown op right: the right side may still decide it
                return right if (op == "&&" and not right) or (op == "||" and right) else UNKNOWN
            return right
        lv, rv = self.eval(e.left), self.eval(e.right)
        if has_unknown(lv) or has_unknown(rv):
            return UNKNOWN
        if op in ("==", "!=") and isinstance(lv, list | dict) and isinstance(rv, list | dict):
            self.budget.charge(min(self.budget.measure(lv, e.rng)[0], self.budget.measure(rv, e.rng)[0]), e.rng)
        if op == "==":
            return equal(lv, rv)
        if op == "!=":
            return not equal(lv, rv)
        a, b = self.number_of(lv, e.left.rng, op), self.number_of(rv, e.right.rng, op)
        if op == "<":
            return a < b
        if op == ">":
            return a > b
        if op == "<=":
            return a <= b
        if op == ">=":
            return a >= b
        if op == "+":
            return normalize_number(a + b)
        if op == "-":
            return normalize_number(a - b)
        if op == "*":
            return normalize_number(a * b)
        if op in ("/", "%"):
            if b == 0:
                raise EvalError("Division by zero", f'The right operand of "{op}" is zero.', e.right.rng)
            if op == "/":
                return normalize_number(a / b)
            return normalize_number(a - b * int(a / b))  # truncated, like Go's math.Mod sign rule
        raise EvalError("Unsupported operator", f'"{op}" is not an operator.', e.rng)  # pragma: no cover




__all__ = ["Namespace", "Scope", "constant", "evaluate", "make_set"]
