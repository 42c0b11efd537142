"""The service's bearer token: created once per state dir, readable only by its owner.

The scheduler service writes ``<state_dir>/token`` (mode 0600, created with
``O_CREAT | O_EXCL`` so it is never briefly world-readable and two services
starting at once agree on one token) and reuses it across restarts, so clients
configured once keep working. Clients find the token in ``$RLSCHED_TOKEN`` or,
failing that, in the token file of the state dir they were pointed at.

Standard library only: ``rlsched submit`` imports this and must start fast.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from pathlib import Path

from rlsched.errors import RlschedError

#: Environment variable clients read the token from first.
TOKEN_ENV = "RLSCHED_TOKEN"
#: Name of the token file inside the state dir.
TOKEN_FILE = "token"
#: Bytes of randomness in a generated token (256 bits).
TOKEN_BYTES = 32


class TokenError(RlschedError):
    """No usable token (missing, unreadable, empty, or a file others can read)."""


def generate_token() -> str:
    """A fresh URL-safe random token."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_path(state_dir: Path) -> Path:
    return Path(state_dir) / TOKEN_FILE


def _read(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except PermissionError:
        raise TokenError(f"{path}: permission denied (the token belongs to the user running the service; "
                         f"set ${TOKEN_ENV} instead)") from None
    except OSError as exc:
        raise TokenError(f"{path}: cannot read the token ({exc.strerror or exc})") from None
    if not text:
        raise TokenError(f"{path} is empty; delete it and restart the service to make a new token")
    return text


def ensure_token(state_dir: Path) -> str:
    """The service's token: read ``<state_dir>/token``, or create it (mode 0600) if absent.

    Creation is atomic and exclusive: the file is created with ``O_EXCL`` and mode
    0600, written, fsynced, and only then is it the token; a concurrent creator
    loses the race and reads the winner's token. An existing file with group or
    other permissions is tightened to 0600 (and the token kept).
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = token_path(state_dir)
    if path.exists():
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        return _read(path)
    token = generate_token()
    tmp = state_dir / f".{TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created the token first: O_EXCL semantics for a rename
        except FileExistsError:
            return _read(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with contextlib.suppress(OSError):
        dfd = os.open(state_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return token


def resolve_token(state_dir: Path | None = None, *, env: dict[str, str] | None = None) -> str | None:
    """The token a client sends: ``$RLSCHED_TOKEN``, else ``<state_dir>/token``, else None."""
    environ = os.environ if env is None else env
    value = environ.get(TOKEN_ENV, "").strip()
    if value:
        return value
    if state_dir is not None:
        path = token_path(state_dir)
        if path.exists():
            return _read(path)
    return None


def token_matches(expected: str, presented: str | None) -> bool:
    """Constant-time comparison (the time taken does not reveal how many leading characters matched)."""
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), presented.encode("utf-8"))
