"""The workspace of a run: checked before anything is built or trained.

A run writes ``metrics.csv``, ``metrics.png`` and ``checkpoints/`` into its workspace. A
workspace that cannot take them (a file where a folder belongs, a folder where a file
belongs, no write permission) is found here, with the path named, before training starts,
not at the first checkpoint an hour in. Nothing in the workspace is created or changed by
the check (for a workspace still to be made, a folder is made and removed at once in the
folder that will hold it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..config import ParamError

#: What a run writes in its workspace: name and whether it is a folder.
ENTRIES = (("checkpoints", True), ("checkpoints/servers", True), ("checkpoint", True),
           ("tensorboard", True), ("metrics.csv", False), ("metrics.png", False))


def check_workspace(workspace: str | os.PathLike[str]) -> Path:
    """Refuse a workspace a run could not write, naming the path; returns it as a Path.

    Raises:
        ParamError: with every problem found (all of them, in one message).
    """
    ws = Path(workspace)
    problems: list[str] = []
    existing = ws
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder that would hold what must be created
    if existing != ws and not existing.is_dir():
        problems.append(f"workspace {ws}: cannot be made, {existing} is a file")
    elif existing == ws and not ws.is_dir():
        problems.append(f"workspace {ws} is a file, not a folder")
    elif not _writable(existing) or (existing != ws and not _can_make_folders(existing)):
        problems.append(f"workspace {ws}: " + (f"{existing} is not writable" if existing != ws
                                               else "the folder is not writable"))
    else:
        for name, folder in ENTRIES:
            path = ws / name
            if not path.exists() and not path.is_symlink():
                continue
            if folder and not path.is_dir():
                problems.append(f"workspace {ws}: {path} should be a folder, but is a file")
            elif not folder and path.is_dir():
                problems.append(f"workspace {ws}: {path} should be a file, but is a folder")
            elif not _writable(path if folder else path.parent) or (
                    not folder and not os.access(path, os.W_OK)):
                problems.append(f"workspace {ws}: {path} is not writable")
    if problems:
        raise ParamError(problems)
    return ws


def _writable(folder: Path) -> bool:
    """Whether files can be made in ``folder`` (a read-only mount counts, even for root)."""
    return os.access(folder, os.W_OK | os.X_OK)


def _can_make_folders(parent: Path) -> bool:
    """Whether a folder can be made in ``parent``, tried (and removed at once): permission
    bits do not tell for root, nor on file systems such as /proc."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".paramserver-", dir=parent))
    except OSError:
        return False
    return True


__all__ = ["ENTRIES", "check_workspace"]
