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
import math
import os
import secrets
import string
import zlib
from pathlib import Path

from rlsched.errors import RlschedError
from rlsched.posix import fsync_dir
from rlsched.service.statedir import secure_dir

#: Environment variable clients read the token from first.
TOKEN_ENV = "RLSCHED_TOKEN"
#: Name of the token file inside the state dir.
TOKEN_FILE = "token"
#: Bytes of randomness in a generated token (256 bits); a pre-seeded token must carry as much.
TOKEN_BYTES = 32
MIN_TOKEN_BITS = 8 * TOKEN_BYTES

_HEX = frozenset("0123456789abcdef")
_ALNUM = frozenset(string.ascii_letters + string.digits)
_B64URL = _ALNUM | frozenset("-_=")
_B64 = _ALNUM | frozenset("+/=")


class TokenError(RlschedError):
    """No usable token (missing, unreadable, empty, or a file others can read)."""


def generate_token() -> str:
    """A fresh URL-safe random token."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_bits(token: str) -> float:
    """A generous estimate of a token's entropy in bits: the smaller of length x log2(alphabet) and what
    deflate leaves of it, so repeated patterns (``abab...``, ``password`` x 8) count for little.

    The alphabet is the smallest usual one holding every character (hex 16, alphanumeric 62, base64 64,
    printable ASCII 95). Every ``secrets.token_urlsafe(32)`` / ``token_hex(32)`` scores at least 256.
    """
    if not token:
        return 0.0
    chars = set(token)
    if chars <= _HEX or chars <= {c.upper() for c in _HEX}:
        size = 16
    elif chars <= _ALNUM:
        size = 62
    elif chars <= _B64URL or chars <= _B64:
        size = 64
    else:
        size = 95
    raw = token.encode("utf-8")
    compressed = 8 * (len(zlib.compress(raw, 9)) - 6)  # less zlib's 2-byte header and 4-byte checksum
    return min(len(token) * math.log2(size), float(compressed))


def check_token_strength(token: str, where: str) -> None:
    """Raise :class:`TokenError` for a token under :data:`MIN_TOKEN_BITS` bits of entropy (``where``: its origin)."""
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise TokenError(f"{where}: the token is too weak (about {bits:.0f} bits of entropy, at least "
                         f"{MIN_TOKEN_BITS} needed); delete it to have the service create one, or write one made by "
                         "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")


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
    other permissions is tightened to 0600 (and the token kept); an existing
    (pre-seeded) token under :data:`MIN_TOKEN_BITS` bits of entropy is refused.

    Raises:
        TokenError: the token file is unreadable, empty or too weak.
    """
    state_dir = secure_dir(Path(state_dir))
    path = token_path(state_dir)
    if path.exists():
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        token = _read(path)
        check_token_strength(token, str(path))
        return token
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
    fsync_dir(state_dir)  # the link is the token's creation: make it survive a crash
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
