"""Reading user YAML files (scenarios, experiments) with one error style.

Both kinds of file report a missing file, a YAML syntax error at ``file:line:col``,
a non-mapping document, and unknown keys with a "did you mean" - in the error
class of the caller.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from rlsched.errors import RlschedError


def load_mapping(path: Path, kind: str, error: type[RlschedError]) -> dict[str, Any]:
    """The YAML mapping in ``path``; every problem is ``error`` naming the file (and line:col)."""
    if not path.exists():
        raise error(f"{path}: {kind} file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        article = "an" if kind[0] in "aeiou" else "a"
        raise error(f"{path}: {article} {kind} is a mapping of keys")
    return data


def check_keys(where: str, got: dict[str, Any], known: set[str], error: type[RlschedError]) -> None:
    """Raise ``error`` for the first key of ``got`` not in ``known``, with a did-you-mean."""
    for k in got:
        if k not in known:
            close = difflib.get_close_matches(str(k), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
            raise error(f"{where}: unknown key {k!r}{hint}")
