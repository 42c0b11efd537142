"""Runtime values of the spec language and their plain-word type names.

HCL values map onto Python: null -> None, bool, number -> int | float
(integral results stay int so that counts are ints), string -> str, list/tuple
-> list, map/object -> dict, set -> :class:`SetValue`. A reference to a block
(``pool.train``) evaluates to a :class:`BlockRef`, a ``str`` holding the block's
name that also remembers its kind, so ``mig_layout = pool.train`` can be refused.
"""

from __future__ import annotations

import math
from typing import Any


class BlockRef(str):
    """The name of a block (``"train"``), remembering it came from ``pool.train``."""

    kind: str

    def __new__(cls, kind: str, name: str) -> BlockRef:
        obj = super().__new__(cls, name)
        obj.kind = kind
        return obj

    @property
    def address(self) -> str:
        return f"{self.kind}.{self!s}"


class SetValue(list[Any]):
    """A set: unique elements, kept in a stable order (strings sorted, as Terraform does)."""


class Unknown:
    """A value ``validate`` cannot know: a variable given no value (Terraform's unknown value).

    Validation checks the configuration, not its inputs (as ``terraform validate``
    does), so a required variable without a value evaluates to :data:`UNKNOWN`;
    anything computed from it is unknown too, and the checks that would need it
    are skipped. ``plan``, ``apply`` and the service never see one: for them a
    missing variable is an error.
    """

    _instance: Unknown | None = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "(unknown)"


UNKNOWN = Unknown()


def has_unknown(v: Any) -> bool:
    """Whether ``v`` is or holds an unknown value."""
    if v is UNKNOWN:
        return True
    if isinstance(v, dict):
        return any(has_unknown(x) for x in v.values())
    if isinstance(v, list):
        return any(has_unknown(x) for x in v)
    return False


def set_key(v: Any) -> Any:
    """A hashable key with :func:`equal`'s meaning: equal values, and only they, share a key.

    Sets are built and compared through these keys, so ``toset`` and the set
    functions take linear time instead of comparing every pair of elements.
    """
    if isinstance(v, dict):
        return ("map", tuple(sorted((k, set_key(x)) for k, x in v.items())))
    if isinstance(v, SetValue):
        return ("set", frozenset(set_key(x) for x in v))
    if isinstance(v, list):
        return ("list", tuple(set_key(x) for x in v))
    if isinstance(v, str):
        return ("string", str(v))
    return (type_name(v), v)


def make_set(items: list[Any]) -> SetValue:
    """Unique elements in first-seen order (all strings: sorted, as Terraform does)."""
    unique: dict[Any, Any] = {}
    for v in items:
        unique.setdefault(set_key(v), v)
    out = list(unique.values())
    if all(isinstance(v, str) for v in out):
        out.sort()
    return SetValue(out)


def type_name(v: Any) -> str:
    """HCL's word for the type of ``v`` (for error messages)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, SetValue):
        return "set"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "map"
    if v is UNKNOWN:
        return "unknown value"
    return type(v).__name__


def normalize_number(x: float | int) -> int | float:
    """Keep integral results as ints (``4 / 2`` is ``2``, a count, not ``2.0``)."""
    if isinstance(x, float) and math.isfinite(x) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    return x


def equal(a: Any, b: Any) -> bool:
    """HCL equality: values of different types are never equal (``1 != "1"``, ``true != 1``)."""
    if type_name(a) != type_name(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        if isinstance(a, SetValue):
            return len(a) == len(b) and all(any(equal(x, y) for y in b) for x in a)
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def plain(v: Any) -> Any:
    """Strip BlockRef/SetValue into plain str/list (for outputs and JSON); unknown becomes null."""
    if v is UNKNOWN:
        return None
    if isinstance(v, BlockRef):
        return str(v)
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def render(v: Any) -> str:
    """A value in HCL-ish syntax for messages: ``"a"``, ``[1, 2]``, ``{ a = 1 }``."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{render(k)} = {render(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(render(x) for x in v) + "]"
    return repr(v)
