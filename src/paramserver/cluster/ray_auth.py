"""Ray's token authentication, as paramserver uses it (docs/ray.md, "The token").

Ray 2.5x guards a cluster with one static token, read by every node and driver from, in
this order, the environment (``RAY_AUTH_TOKEN``), the file ``RAY_AUTH_TOKEN_PATH`` names,
or ``~/.ray/auth_token``. ``ray start --head`` turns authentication on only when a token is
there already (or ``RAY_AUTH_MODE=token`` says so, and then refuses to start without one),
and Ray writes the file it makes with the user's umask (readable by every local user under
the usual 022). So:

- :func:`make_token` (``paramserver ray-token``) makes the token before any ``ray start``,
  in a file only its owner may read (0600, in a folder only its owner may enter), and
  makes an existing token file private;
- :func:`ensure_local_token` does the same before paramserver starts a Ray of its own, so
  the token that Ray would otherwise write world-readable is paramserver's, 0600;
- :func:`join_error` turns Ray's refusal to connect into a one-line message that says
  what is true: no token here, or a token the cluster does not accept, or no cluster.

This module imports nothing of Ray.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from ..config import ParamError

log = logging.getLogger(__name__)

MODE_VAR, TOKEN_VAR, PATH_VAR = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def token_path() -> Path:
    """The file Ray reads the token from here: ``RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token``."""
    named = os.environ.get(PATH_VAR)
    return Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"


def token_mode() -> str | None:
    """``RAY_AUTH_MODE`` as set here (lower case), or None."""
    mode = os.environ.get(MODE_VAR)
    return mode.strip().lower() if mode is not None else None


def _private(path: Path) -> bool:
    """Makes the token file ``path`` readable by its owner only; whether it changed."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077 == 0:
        return False
    os.chmod(path, mode & 0o700)
    return True


def make_token() -> tuple[Path | None, str]:
    """A token for Ray, in the file Ray reads (:func:`token_path`), made if missing:
    random (256 bits), written whole before it has its name (no reader sees half a token),
    mode 0600 in a folder of mode 0700 when the folder is made here. An existing file is
    kept, made private when others could read it.

    Returns the file (None when ``RAY_AUTH_TOKEN`` gives the token) and what was done, in
    words. Raises ParamError when the file cannot be made or read.
    """
    if os.environ.get(TOKEN_VAR):
        return None, f"the token is {TOKEN_VAR} of this environment: no file is needed"
    path = token_path()
    try:
        if path.is_file():
            if not path.read_text().strip():
                raise ParamError(f"{path}: the token file is empty; remove it and run "
                                 "paramserver ray-token again")
            if _private(path):
                return path, f"{path}: the token was readable by others; it is now 0600"
            return path, f"{path}: the token is there already (0600)"
        if path.exists() or path.is_symlink():
            raise ParamError(f"{path}: not a file; Ray reads its token there (move it away, or "
                             f"set {PATH_VAR} to another file)")
        made = not path.parent.exists()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(temp, path)  # never over a token made meanwhile
            except FileExistsError:
                return path, f"{path}: the token is there already"
        finally:
            temp.unlink(missing_ok=True)
    except OSError as e:
        raise ParamError(f"{path}: cannot make Ray's token file: {e.strerror or e}") from None
    folder = f" (and its folder {path.parent}, 0700)" if made else ""
    return path, f"{path}: a new token, readable by you only (0600){folder}"


def ensure_local_token() -> None:
    """Before paramserver starts a Ray of its own: the token Ray would make (with the
    umask) made here, private; nothing when authentication is off or the token comes from
    the environment. Only a warning when the file cannot be made private (not ours)."""
    if token_mode() not in (None, "token") or os.environ.get(TOKEN_VAR):
        return
    try:
        make_token()
    except ParamError as e:
        log.warning("%s", e)


def join_error(address: str, error: BaseException) -> ParamError:
    """Ray refused to connect this process to the cluster at ``address``: why, in one line,
    true to what is known here (this process's mode and token) and what Ray answered."""
    first = _first_line(error)
    text = f"{type(error).__name__} {error!r} {error.__cause__!r}".lower()
    mode = token_mode()
    if "no authentication token was found" in text:
        why = (f"{MODE_VAR}=token here, and no token: {token_path()} is missing (copy the "
               f"cluster's token there, or set {TOKEN_VAR} or {PATH_VAR})")
    elif any(t in text for t in ("unauthenticated", "authentication", "invalidauthtoken")):
        if mode == "token":
            why = (f"the cluster refused this process's token ({_source()}): it is not the "
                   "token the cluster was started with")
        else:
            why = (f"the cluster asks for a token and this process sends none: set "
                   f"{MODE_VAR}=token, with the cluster's token in {token_path()} (or "
                   f"{TOKEN_VAR})")
    else:
        why = first
    return ParamError(f"cannot join the Ray cluster at {address}: {why}")


def _source() -> str:
    if os.environ.get(TOKEN_VAR):
        return f"from {TOKEN_VAR}"
    return f"from {token_path()}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].rstrip(".") if text else type(e).__name__


__all__ = ["ensure_local_token", "join_error", "make_token", "token_mode", "token_path"]
