"""A model's values by Param name, from a training checkpoint, for other tools.

``paramserver export CKPT --to model.safetensors`` writes every Param's values under its
name (a sharer's are its owner's, in its own shape), and for a torch module's checkpoint
also under the module's ``state_dict`` names, so that
``module.load_state_dict(safetensors.torch.load_file("model.safetensors"))`` works.

A checkpoint says which Params it holds in its metadata's :data:`TABLE` entry
(:func:`param_table`): names, shapes, and the owner of each sharer. :func:`param_values` is
the one place that turns a checkpoint's arrays back into per-Param values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import (
    CheckpointError,
    is_checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    save_tensors,
)
from .params import ParamSet
from .paths import check_output, refuse_inputs, shown

#: The metadata entry of a checkpoint that describes its Params.
TABLE = "param_table"


def param_table(pset: ParamSet, module: Any = None) -> dict[str, Any]:
    """The description of a ParamSet that a checkpoint's metadata carries (JSON-able).

    Args:
        pset: the Params, in declaration order.
        module: a ``torch.nn.Module`` whose parameters are these Params (bound by name):
            its ``state_dict`` names that are not Param names (tied weights) are recorded
            as aliases.

    Returns:
        ``{"params": [[name, shape, owner or None], ...], "aliases": {name: param name}}``.
    """
    # The row-sparse tables' values come after every other owner's (SPEC §10): so do they.
    ordered = ([p for p in pset.params if not p.row_sparse]
               + [p for p in pset.params if p.row_sparse])
    table: dict[str, Any] = {
        "params": [[p.name, list(p.shape), p.owner.name if p.owner is not None else None]
                   for p in ordered],
        "aliases": {}}
    if module is not None:
        names = {id(t): n for n, t in module.named_parameters() if n in pset}
        for key, tensor in module.state_dict(keep_vars=True).items():
            name = names.get(id(tensor))
            if name is not None and key != name:
                table["aliases"][key] = name
    return table


def param_values(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                 table: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Every Param's values held in a checkpoint, by name (sharers included).

    Args:
        arrays, meta: a loaded checkpoint (:func:`~paramserver.checkpoint.load_checkpoint`):
            a cluster's state (``paramserver train``, ``TorchCluster``) or a
            ``paramserver.torch.Optimizer`` checkpoint.
        table: the :func:`param_table` to read it with, for checkpoints that carry none
            (those of earlier releases); default: the one in ``meta``.

    Returns:
        ``{name: array}`` in the table's order, then the aliases; for a checkpoint without
        a table, its owners (flat vectors where it records no shapes).

    Raises:
        CheckpointError: the checkpoint holds no values, or not those of the table.
    """
    from .cluster.statedict import owner_values

    table = table if table is not None else meta.get(TABLE)
    if table is not None and not isinstance(table, Mapping):
        raise CheckpointError("the checkpoint's Param table is damaged (not a JSON object)")
    rows = None if table is None else _rows(table)
    if "layout" in arrays:  # a cluster's state: the owners' flat values, server by server
        try:
            flat = owner_values(arrays)
        except ValueError as e:
            raise CheckpointError(f"the checkpoint's state is damaged: {e}") from None
        owners = _sized_owners(meta, flat) if rows is None else _split(flat, rows)
    elif any(k.startswith("param/") for k in arrays):  # paramserver.torch.Optimizer's
        owners = {k[len("param/"):]: np.asarray(v) for k, v in arrays.items()
                  if k.startswith("param/")}
    else:
        raise CheckpointError("the checkpoint holds no Param values (neither a cluster's "
                              "state nor an Optimizer's)")
    if rows is None or table is None:
        return owners
    return _shaped(owners, rows, _aliases(table))


def _rows(table: Any) -> list[tuple[str, tuple[int, ...], str | None]]:
    """The table's ``params`` rows, checked: read from a file, they may say anything."""
    try:
        rows = [(n, tuple(shape), o) for n, shape, o in table["params"]]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"the checkpoint's Param table is damaged ({e})") from None
    for name, shape, owner in rows:
        if not isinstance(name, str) or not (owner is None or isinstance(owner, str)) or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise CheckpointError(f"the checkpoint's Param table is damaged (the row "
                                  f"{shown(repr([name, list(shape), owner]))} is not a name, "
                                  "a shape of sizes >= 0 and an owner's name or null)")
    return rows


def _aliases(table: Any) -> dict[str, str]:
    aliases = table.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise CheckpointError("the checkpoint's Param table is damaged (its aliases are not "
                              "a map of names to Param names)")
    return aliases


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _split(flat: np.ndarray, rows: list[tuple[str, tuple[int, ...], str | None]]
           ) -> dict[str, np.ndarray]:
    """The owners' values, cut from the flat values in table order."""
    need = sum(_size(shape) for _, shape, owner in rows if owner is None)
    if need != flat.size:
        raise CheckpointError(f"the checkpoint holds {flat.size} values; its Params "
                              f"need {need}")
    out, pos = {}, 0
    for name, shape, owner in rows:
        if owner is None:
            out[name] = flat[pos:pos + _size(shape)]
            pos += _size(shape)
    return out


def _shaped(owners: Mapping[str, np.ndarray],
            rows: list[tuple[str, tuple[int, ...], str | None]],
            aliases: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every Param of the table in its shape (a sharer: its owner's values), then aliases."""
    out: dict[str, np.ndarray] = {}
    for name, shape, owner in rows:
        source = owners.get(owner or name)
        if source is None or source.size != _size(shape):
            raise CheckpointError(f"the checkpoint holds no values of shape {shape} for "
                                  f"Param '{name}'" + (f" (owner '{owner}')" if owner else ""))
        out[name] = source.reshape(shape)
    for alias, name in aliases.items():
        if name not in out:
            raise CheckpointError(f"the checkpoint's Param table is damaged (alias "
                                  f"'{alias}' of unknown '{name}')")
        out.setdefault(str(alias), out[name])
    return out


def _sized_owners(meta: Mapping[str, Any], flat: np.ndarray) -> dict[str, np.ndarray]:
    """The owners of a checkpoint of an earlier release: ``params`` holds names and sizes."""
    try:
        sizes = [(str(n), int(s)) for n, s in meta["params"]]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError("the checkpoint names no Params (give the job, to read it "
                              "with the job's Params)") from None
    if any(s < 0 for _, s in sizes):
        raise CheckpointError("the checkpoint's list of Params is damaged (a negative size)")
    if sum(s for _, s in sizes) != flat.size:
        raise CheckpointError(f"the checkpoint holds {flat.size} values; its Params "
                              f"need {sum(s for _, s in sizes)}")
    bounds = np.cumsum([0] + [s for _, s in sizes])
    return {n: flat[bounds[i]:bounds[i + 1]] for i, (n, _) in enumerate(sizes)}


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint file, or the newest one in a folder (a workspace or its
    ``checkpoints``)."""
    path = Path(path)
    if not os.path.isdir(path):  # (a name too long to look up is read, and refused, as a file)
        return path
    for folder in (path, path / "checkpoints"):
        found = list_checkpoints(folder)
        if found:
            return found[-1][1]
    raise CheckpointError(f"{path}: no checkpoint in this folder (nor in its checkpoints/)")


def export_model(checkpoint: str | os.PathLike[str], to: str | os.PathLike[str],
                 table: Mapping[str, Any] | None = None) -> tuple[Path, list[str]]:
    """Write the Param values of a checkpoint as a safetensors model file.

    Args:
        checkpoint: a checkpoint file, or a folder holding checkpoints (the newest is read).
        to: the file to write (atomically).
        table: as for :func:`param_values`.

    Returns:
        The path written and the names of the tensors in it.
    """
    check_output(to, "--to")  # before the checkpoint is read
    source = find_checkpoint(checkpoint)
    refuse_inputs([("--to", to)], [("the checkpoint", source)])
    if is_checkpoint_name(Path(to).name):
        raise CheckpointError(f"--to {shown(to)}: a model file is not given a checkpoint's "
                              "name (a later --resume would take it for a checkpoint)")
    arrays, meta = load_checkpoint(source)
    try:
        values = param_values(arrays, meta, table)
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    # Each tensor its own memory (a sharer or an alias is written as a copy of its values).
    tensors = {name: np.array(v, order="C") for name, v in values.items()}
    header = {"format": "pt", "paramserver_checkpoint": source.name}
    for key in ("job", "step"):
        if key in meta:
            header[f"paramserver_{key}"] = str(meta[key])
    return save_tensors(to, tensors, header, what="--to"), list(tensors)


__all__ = ["TABLE", "export_model", "find_checkpoint", "param_table", "param_values"]
