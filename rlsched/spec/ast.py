"""rlsched's own small syntax tree for HCL, built from python-hcl2's Lark tree.

python-hcl2's dictionary output loses positions and turns expressions back into
source text (``shared/docs/HCL.md`` section 4), so the evaluator works on these
nodes instead. Every node carries a :class:`SourceRange` so that every diagnostic
can point at the exact spot in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsched.spec.model import SourceRange


@dataclass(slots=True)
class Expr:
    """Base of every expression node; ``rng`` is where it is in the source."""

    rng: SourceRange


@dataclass(slots=True)
class Literal(Expr):
    """``1``, ``2.5``, ``true``, ``null``, or a string without templates."""

    value: Any


@dataclass(slots=True)
class TemplateIf:
    """``%{ if cond }...%{ else }...%{ endif }`` inside a string."""

    cond: Expr
    then: list[TemplatePart]
    otherwise: list[TemplatePart]


@dataclass(slots=True)
class TemplateFor:
    """``%{ for k, v in coll }...%{ endfor }`` inside a string."""

    key_var: str | None
    value_var: str
    collection: Expr
    body: list[TemplatePart]


TemplatePart = str | Expr | TemplateIf | TemplateFor


@dataclass(slots=True)
class Template(Expr):
    """A quoted string or heredoc with ``${...}`` or ``%{...}`` sequences."""

    parts: list[TemplatePart]


@dataclass(slots=True)
class GetAttr:
    """``.name`` step of a traversal."""

    name: str
    rng: SourceRange


@dataclass(slots=True)
class Index:
    """``[key]`` (or legacy ``.0``) step of a traversal."""

    key: Expr
    rng: SourceRange


Step = GetAttr | Index


@dataclass(slots=True)
class Traversal(Expr):
    """A name and its steps: ``var.nodes[0]``, ``local.x``, ``each.key``, ``v``."""

    root: str
    steps: list[Step]


@dataclass(slots=True)
class Relative(Expr):
    """Steps applied to a non-name expression: ``f(x)[0]``, ``(a).b``."""

    source: Expr
    steps: list[Step]


@dataclass(slots=True)
class Splat(Expr):
    """``x[*].a`` or ``x.*.a``: apply ``steps`` to every element of ``source``."""

    source: Expr
    steps: list[Step]


@dataclass(slots=True)
class Call(Expr):
    """``name(args...)``; ``expand`` when the last argument ends with ``...``."""

    name: str
    args: list[Expr]
    expand: bool = False


@dataclass(slots=True)
class TupleExpr(Expr):
    items: list[Expr]


@dataclass(slots=True)
class ObjectItem:
    """One ``key = value``; ``key_name`` is set for bare identifiers (literal keys)."""

    key: Expr
    value: Expr
    key_name: str | None = None


@dataclass(slots=True)
class ObjectExpr(Expr):
    items: list[ObjectItem]


@dataclass(slots=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(slots=True)
class Unary(Expr):
    op: str
    operand: Expr


@dataclass(slots=True)
class Conditional(Expr):
    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(slots=True)
class ForExpr(Expr):
    """``[for k, v in c : v if cond]`` or ``{for k, v in c : k => v... if cond}``."""

    key_var: str | None
    value_var: str
    collection: Expr
    value: Expr
    key: Expr | None = None
    cond: Expr | None = None
    group: bool = False


@dataclass(slots=True)
class Attribute:
    """``name = expr`` in a body."""

    name: str
    expr: Expr
    rng: SourceRange
    name_rng: SourceRange


@dataclass(slots=True)
class Block:
    """``type "label"... { body }``."""

    type: str
    labels: list[str]
    body: Body
    rng: SourceRange
    type_rng: SourceRange
    label_rngs: list[SourceRange] = field(default_factory=list)


@dataclass(slots=True)
class Body:
    """Attributes (in source order, first definition wins) and blocks of a body."""

    attributes: dict[str, Attribute] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
