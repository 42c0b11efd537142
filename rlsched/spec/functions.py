"""The documented function set of the spec language (a subset of Terraform's).

Functions are total and side-effect free: no file, network, time or random
functions, so that a spec evaluates to the same value everywhere and validation
stays fast. ``try`` and ``can`` need their arguments unevaluated and live in the
evaluator. Every function raises :class:`FunctionError` with a plain message
for bad arguments; the evaluator adds the position.

Every function is bounded (:mod:`rlsched.spec.limits`): none does more than
roughly linear work in its arguments, those that could build a huge string check
the size first, and regular expressions run on RE2, whose matching time is linear
(and whose syntax is the one Terraform's ``replace`` and ``regex`` use).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from rlsched.spec.limits import MAX_STRING, check_format_width, current_budget
from rlsched.spec.types import ConversionError, convert
from rlsched.spec.values import SetValue, make_set, normalize_number, plain, set_key, type_name


class FunctionError(Exception):
    """Bad arguments to a function (wrong type, count, or value)."""


def _num(v: Any, what: str = "argument") -> int | float:
    try:
        out = convert(v, ("number",))
    except ConversionError as exc:
        raise FunctionError(f"{what}: {exc.message}") from None
    if out is None:
        raise FunctionError(f"{what}: a number is required, not null")
    assert isinstance(out, int | float)
    return out


def _int(v: Any, what: str = "argument") -> int:
    n = _num(v, what)
    if isinstance(n, float):
        raise FunctionError(f"{what}: a whole number is required, not {n}")
    return n


def _str(v: Any, what: str = "argument") -> str:
    if isinstance(v, list | dict) or v is None:
        raise FunctionError(f"{what}: a string is required, not a {type_name(v)}")
    return str(convert(v, ("string",)))


def _list(v: Any, what: str = "argument") -> list[Any]:
    if not isinstance(v, list):
        raise FunctionError(f"{what}: a list is required, not a {type_name(v)}")
    return v


def _map(v: Any, what: str = "argument") -> dict[str, Any]:
    if not isinstance(v, dict):
        raise FunctionError(f"{what}: a map or object is required, not a {type_name(v)}")
    return v


def _length(v: Any) -> int:
    if isinstance(v, str):
        return len(v)
    if isinstance(v, list | dict):
        return len(v)
    raise FunctionError(f"length needs a string, list, set or map, not a {type_name(v)}")


def _slice(lst: Any, start: Any, end: Any) -> list[Any]:
    items, s, e = _list(lst), _int(start, "start index"), _int(end, "end index")
    if not 0 <= s <= e <= len(items):
        raise FunctionError(f"slice indices {s}..{e} are out of range for a list of {len(items)} elements")
    return list(items[s:e])


def _merge(*maps: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        if m is not None:
            out.update(_map(m))
    return out


def _lookup(m: Any, key: Any, *default: Any) -> Any:
    mp, k = _map(m), _str(key, "key")
    if k in mp:
        return mp[k]
    if default:
        return default[0]
    raise FunctionError(f'the map has no key "{k}" and no default was given')


def _range(*args: Any) -> list[Any]:
    nums: list[int | float] = [_num(a) for a in args]
    start: int | float
    stop: int | float
    step: int | float
    if len(nums) == 1:
        start, stop, step = 0, nums[0], 1
    elif len(nums) == 2:
        start, stop, step = nums[0], nums[1], 1
    else:
        start, stop, step = nums
    if step == 0:
        raise FunctionError("step must not be zero")
    count = max(0, math.ceil((stop - start) / step))
    if count > 1024:
        raise FunctionError(f"range would produce {count} elements; at most 1024 are allowed")
    return [normalize_number(start + i * step) for i in range(count)]


_VERB = re.compile(r"%(%|[-+ #0]*\d*(?:\.\d+)?[vsdfqtbxXeEgGo])")


def _format(fmt: Any, *args: Any) -> str:
    spec, vals = _str(fmt, "format"), list(args)
    pos = 0

    def sub(m: re.Match[str]) -> str:
        nonlocal pos
        verb = m.group(1)
        if verb == "%":
            return "%"
        if pos >= len(vals):
            raise FunctionError(f"format string needs more than {len(vals)} argument(s)")
        v = vals[pos]
        pos += 1
        flags, kind = verb[:-1], verb[-1]
        check_format_width(flags)
        if kind in "vs":
            return ("%" + flags + "s") % (_str(v) if not isinstance(v, list | dict) else json.dumps(plain(v)))
        if kind == "q":
            return json.dumps(_str(v))
        if kind == "t":
            return "true" if convert(v, ("bool",)) else "false"
        if kind in "dbxXo":
            n = _int(v)
            return ("%" + flags + ("d" if kind == "d" else "o" if kind == "o" else kind.replace("b", "d"))) % n \
                if kind != "b" else format(n, "b")
        return ("%" + flags + kind) % float(_num(v))

    out = _VERB.sub(sub, spec)
    _spend_chars(len(out))
    return out


def _spend_chars(n: int) -> None:
    """Charge a built string to the evaluation budget (formatlist builds many)."""
    current_budget().charge(1 + n // 16, None)


def _check_length(n: int, what: str) -> None:
    if n > MAX_STRING:
        raise FunctionError(f"{what} would have {n:,} characters; at most {MAX_STRING:,} are allowed")


def _minmax(fn: Callable[..., Any]) -> Callable[..., Any]:
    def inner(*args: Any) -> Any:
        if not args:
            raise FunctionError("at least one number is required")
        return fn(_num(a) for a in args)

    return inner


def _join(sep: Any, *lists: Any) -> str:
    s = _str(sep, "separator")
    parts = [_str(x, "element") for lst in lists for x in _list(lst)]
    _check_length(sum(map(len, parts)) + len(s) * max(0, len(parts) - 1), "the joined string")
    return s.join(parts)


def _contains(coll: Any, value: Any) -> bool:
    from rlsched.spec.values import equal

    return any(equal(x, value) for x in _list(coll))


def _coalesce(*args: Any) -> Any:
    for a in args:
        if a is not None and a != "":
            return a
    raise FunctionError("no non-null, non-empty argument")


def _element(lst: Any, idx: Any) -> Any:
    items = _list(lst)
    if not items:
        raise FunctionError("cannot take an element of an empty list")
    return items[_int(idx, "index") % len(items)]


def _flatten(v: Any) -> list[Any]:
    out: list[Any] = []
    for x in _list(v):
        out.extend(_flatten(x) if isinstance(x, list) else [x])
    return out


def _zipmap(keys: Any, values: Any) -> dict[str, Any]:
    ks, vs = _list(keys, "keys"), _list(values, "values")
    if len(ks) != len(vs):
        raise FunctionError(f"{len(ks)} keys but {len(vs)} values")
    return {_str(k, "key"): v for k, v in zip(ks, vs, strict=True)}


_RE2_OPTIONS: Any = None
_GROUP_REF = re.compile(r"\$(?:(\d+)|\{(\d+)\}|(\$))")


def _regex(pattern: str) -> Any:
    """Compile ``pattern`` with RE2 (linear-time matching: no pattern can hang evaluation)."""
    global _RE2_OPTIONS
    import re2

    if _RE2_OPTIONS is None:
        _RE2_OPTIONS = re2.Options()
        _RE2_OPTIONS.log_errors = False  # the error comes back as our diagnostic, not on stderr
        _RE2_OPTIONS.max_mem = 8 << 20
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        msg = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise FunctionError(f"invalid regular expression: {msg} (the syntax is RE2's, as in Terraform)") from None


def _replacement(template: str, groups: int) -> list[str | int]:
    """``"x$1${2}$$"`` -> ``["x", 1, 2, "$"]``: literal text and capture-group numbers."""
    out: list[str | int] = []
    pos = 0
    for m in _GROUP_REF.finditer(template):
        out.append(template[pos:m.start()])
        if m.group(3):
            out.append("$")
        else:
            g = int(m.group(1) or m.group(2))
            if g > groups:
                raise FunctionError(f"the replacement refers to group {g}; the pattern has {groups}")
            out.append(g)
        pos = m.end()
    out.append(template[pos:])
    return [p for p in out if p != ""]


def _replace(s: Any, old: Any, new: Any) -> str:
    text, o, n = _str(s), _str(old), _str(new)
    if len(o) > 1 and o.startswith("/") and o.endswith("/"):
        pattern = _regex(o[1:-1])
        pieces = _replacement(n, pattern.groups)
        out: list[str] = []
        size, pos = 0, 0
        for m in pattern.finditer(text):
            start, end = m.span()
            size += start - pos + sum(len(p) if isinstance(p, str) else max(0, m.end(p) - m.start(p))
                                      for p in pieces)
            _check_length(size + len(text) - end, "the result of replace")
            out.append(text[pos:start])
            out.extend(p if isinstance(p, str) else (m.group(p) or "") for p in pieces)
            pos = end
        out.append(text[pos:])
        return "".join(out)
    if o:
        _check_length(len(text) + text.count(o) * (len(n) - len(o)), "the result of replace")
    else:
        _check_length(len(text) + (len(text) + 1) * len(n), "the result of replace")
    return text.replace(o, n)


def _match_value(m: Any, pattern: Any) -> Any:
    """What Terraform's regex returns for one match: the text, the groups, or the named groups."""
    if pattern.groups == 0:
        return m.group(0)
    names = dict(pattern.groupindex)
    if names:
        if len(names) != pattern.groups:
            raise FunctionError("the pattern mixes named and unnamed capture groups")
        return {name: m.group(i) for name, i in names.items()}
    return [m.group(i) for i in range(1, pattern.groups + 1)]


def _regex_fn(pattern: Any, s: Any) -> Any:
    compiled, text = _regex(_str(pattern, "pattern")), _str(s)
    m = compiled.search(text)
    if m is None:
        raise FunctionError("the pattern did not match any part of the string")
    return _match_value(m, compiled)


def _regexall(pattern: Any, s: Any) -> list[Any]:
    compiled, text = _regex(_str(pattern, "pattern")), _str(s)
    return [_match_value(m, compiled) for m in compiled.finditer(text)]


def _substr(s: Any, offset: Any, length: Any) -> str:
    text, off, ln = _str(s), _int(offset, "offset"), _int(length, "length")
    if off < 0:
        off = max(0, len(text) + off)
    return text[off:] if ln < 0 else text[off:off + ln]


def _tonumber(v: Any) -> Any:
    try:
        return convert(v, ("number",))
    except ConversionError as exc:
        raise FunctionError(exc.message) from None


def _tobool(v: Any) -> Any:
    try:
        return convert(v, ("bool",))
    except ConversionError as exc:
        raise FunctionError(exc.message) from None


def _tostring(v: Any) -> Any:
    if isinstance(v, list | dict):
        raise FunctionError(f"cannot convert a {type_name(v)} to a string")
    return convert(v, ("string",))


def _sort(v: Any) -> list[Any]:
    return sorted(_str(x, "element") for x in _list(v))


def _sum(v: Any) -> int | float:
    items = _list(v)
    if not items:
        raise FunctionError("cannot sum an empty list")
    return normalize_number(sum(_num(x, "element") for x in items))


def _index(v: Any, value: Any) -> int:
    from rlsched.spec.values import equal

    for i, x in enumerate(_list(v)):
        if equal(x, value):
            return i
    raise FunctionError("the value is not in the list")


def _parseint(s: Any, base: Any) -> int:
    try:
        return int(_str(s), _int(base, "base"))
    except ValueError as exc:
        raise FunctionError(str(exc)) from None


def _setop(kind: str) -> Callable[..., SetValue]:
    def inner(*sets: Any) -> SetValue:
        if not sets:
            raise FunctionError("at least one set is required")
        lists = [_list(s) for s in sets]
        first = lists[0]
        if kind == "union":
            return make_set([x for lst in lists for x in lst])
        others = [{set_key(y) for y in lst} for lst in lists[1:]]
        if kind == "intersection":
            return make_set([x for x in first if all(set_key(x) in o for o in others)])
        return make_set([x for x in first if not any(set_key(x) in o for o in others)])

    return inner


#: name -> (function, minimum args, maximum args or None for variadic)
FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None]] = {
    "abs": (lambda x: normalize_number(abs(_num(x))), 1, 1),
    "ceil": (lambda x: math.ceil(_num(x)), 1, 1),
    "floor": (lambda x: math.floor(_num(x)), 1, 1),
    "min": (_minmax(min), 1, None),
    "max": (_minmax(max), 1, None),
    "pow": (lambda a, b: normalize_number(float(_num(a)) ** float(_num(b))), 2, 2),
    "signum": (lambda x: (_num(x) > 0) - (_num(x) < 0), 1, 1),
    "parseint": (_parseint, 2, 2),
    "sum": (_sum, 1, 1),
    "length": (_length, 1, 1),
    "slice": (_slice, 3, 3),
    "concat": (lambda *ls: [x for lst in ls for x in _list(lst)], 0, None),
    "merge": (_merge, 0, None),
    "toset": (lambda v: make_set(_list(v)), 1, 1),
    "tolist": (lambda v: list(_list(v)), 1, 1),
    "tomap": (lambda v: dict(_map(v)), 1, 1),
    "tostring": (_tostring, 1, 1),
    "tonumber": (_tonumber, 1, 1),
    "tobool": (_tobool, 1, 1),
    "keys": (lambda m: sorted(_map(m)), 1, 1),
    "values": (lambda m: [_map(m)[k] for k in sorted(_map(m))], 1, 1),
    "lookup": (_lookup, 2, 3),
    "range": (_range, 1, 3),
    "format": (_format, 1, None),
    "formatlist": (lambda f, *ls: [_format(f, *row) for row in zip(*[_list(x) for x in ls], strict=False)],
                   1, None),
    "upper": (lambda s: _str(s).upper(), 1, 1),
    "lower": (lambda s: _str(s).lower(), 1, 1),
    "title": (lambda s: _str(s).title(), 1, 1),
    "trimspace": (lambda s: _str(s).strip(), 1, 1),
    "trimprefix": (lambda s, p: _str(s).removeprefix(_str(p)), 2, 2),
    "trimsuffix": (lambda s, p: _str(s).removesuffix(_str(p)), 2, 2),
    "startswith": (lambda s, p: _str(s).startswith(_str(p)), 2, 2),
    "endswith": (lambda s, p: _str(s).endswith(_str(p)), 2, 2),
    "replace": (_replace, 3, 3),
    "regex": (_regex_fn, 2, 2),
    "regexall": (_regexall, 2, 2),
    "substr": (_substr, 3, 3),
    "join": (_join, 1, None),
    "split": (lambda sep, s: _str(s).split(_str(sep, "separator")) if _str(sep) else list(_str(s)), 2, 2),
    "contains": (_contains, 2, 2),
    "coalesce": (_coalesce, 1, None),
    "coalescelist": (lambda *ls: next((x for x in ls if _list(x)), []), 1, None),
    "compact": (lambda v: [x for x in _list(v) if x is not None and x != ""], 1, 1),
    "distinct": (lambda v: list(make_set(list(_list(v)))) if not all(isinstance(x, str) for x in _list(v))
                 else list(dict.fromkeys(_list(v))), 1, 1),
    "element": (_element, 2, 2),
    "index": (_index, 2, 2),
    "flatten": (_flatten, 1, 1),
    "reverse": (lambda v: list(reversed(_list(v))), 1, 1),
    "sort": (_sort, 1, 1),
    "zipmap": (_zipmap, 2, 2),
    "setunion": (_setop("union"), 1, None),
    "setintersection": (_setop("intersection"), 1, None),
    "setsubtract": (_setop("subtract"), 2, 2),
    "jsonencode": (lambda v: json.dumps(plain(v), separators=(",", ":")), 1, 1),
}

#: Evaluated lazily by the evaluator (their arguments may fail on purpose).
SPECIAL = ("try", "can")


def call(name: str, args: list[Any]) -> Any:
    """Call the function ``name``; raises KeyError for unknown names, FunctionError for bad arguments."""
    fn, lo, hi = FUNCTIONS[name]
    if len(args) < lo or (hi is not None and len(args) > hi):
        want = f"{lo}" if lo == hi else f"{lo} or more" if hi is None else f"{lo} to {hi}"
        raise FunctionError(f"{name} takes {want} argument(s), not {len(args)}")
    try:
        return fn(*args)
    except FunctionError:
        raise
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, RecursionError) as exc:
        raise FunctionError(str(exc) or type(exc).__name__) from None


def names() -> list[str]:
    """Every function name, for did-you-mean and the docs."""
    return sorted([*FUNCTIONS, *SPECIAL])
