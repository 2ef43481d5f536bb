"""Files that ship with paramserver beside its code: the example jobs and the documents.

In a checkout they are the repository's ``examples/`` and ``docs/``; in an installed wheel,
setup.py has copied them into the package (``paramserver/examples``, ``paramserver/docs``),
since a wheel carries only what is inside a package. Messages that send the user to a
document name it by :func:`doc_file`: a path that exists where paramserver is.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def shipped_folder(name: str, marker: str) -> Path | None:
    """The folder ``name`` (``examples``, ``docs``) that holds ``marker``: the package's
    own (an install), else the checkout's; None when neither has it."""
    for folder in (PACKAGE / name, PACKAGE.parents[1] / name):
        if (folder / marker).is_file():
            return folder
    return None


def doc_file(name: str) -> str:
    """The path of the document ``name`` (``singa.md``, ``cli.md#errors``) where this
    paramserver has it, to name in a message; ``docs/<name>`` when it has none."""
    file, _, anchor = name.partition("#")
    folder = shipped_folder("docs", file)
    path = str(folder / file) if folder is not None else f"docs/{file}"
    return path + (f"#{anchor}" if anchor else "")


__all__ = ["doc_file", "shipped_folder"]
