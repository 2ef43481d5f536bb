"""Why a checkpoint does not fit the job that would resume from it, in one sentence.

A checkpoint holds the configuration of the job that wrote it (``job_conf`` in its
metadata). When its state cannot be loaded — every Param, server range and updater role is
checked, which makes a dozen lines or more — the user needs what changed between that job
and this one, and what to do: resume with the setting the run was trained with, or start
afresh (``--overwrite``, or another ``--workspace``). The first difference that explains a
refusal is named, in this order: another job's workspace, another updater, other updater
settings, other servers, another net; else the first of the loader's own problems.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config.job import JobConf

#: What to do when the run cannot go on as this job: start it afresh somewhere.
AFRESH = ("start afresh with --overwrite (deleting that run's files) or in another "
          "--workspace")


def misfit(path: object, meta: Mapping[str, Any], job: JobConf,
           layout: Sequence[Sequence[Any]], dtype: str,
           problems: Sequence[str] = ()) -> str:
    """The sentence that says why the checkpoint at ``path`` (its metadata ``meta``) cannot
    be resumed by ``job``, whose Params are ``layout`` (``[name, size]`` each) of ``dtype``;
    ``problems``: the loader's own, the last resort."""
    saved: Mapping[str, Any] = meta.get("job_conf") or {}
    name = meta.get("job")
    if name is not None and name != job.name:
        return (f"{path} is a checkpoint of job '{name}', not of this job '{job.name}': give "
                f"this job a workspace of its own (--workspace DIR), or start it afresh here "
                f"with --overwrite, deleting that job's run")
    updater = job.updater.to_dict()
    before = saved.get("updater") or {}
    old, new = _updater_name(before), _updater_name(updater)
    if before and old != new:
        return (f"{path}: the run was trained by updater {old} and this job's is {new}, whose "
                f"state cannot go on from {old}'s: resume with updater.type {old}, as the run "
                f"was trained, or {AFRESH}; paramserver export and init {{ type: kFromFile }} "
                f"start a new run from its values")
    changed = _changes(before, updater, skip=("learning_rate",))
    if before and changed and problems and not _params_differ(meta, layout, dtype):
        return (f"{path}: the updater's settings changed since the run was trained "
                f"({_listed(changed)}) and its state does not fit them: resume with the "
                f"settings it was trained with, or {AFRESH}")
    servers = _changes(saved.get("cluster") or {}, job.cluster.to_dict(),
                       keep=lambda key: "server" in key)
    if saved.get("cluster") and servers:
        return (f"{path}: the run was trained with other servers ({_listed(servers)}), and "
                f"its state is laid out by server: resume with the servers it was trained "
                f"with, or {AFRESH}")
    if _params_differ(meta, layout, dtype):
        return (f"{path}: the checkpoint's Params do not match the job's (was the net "
                f"changed?): {_params_change(meta, layout, dtype)}; resume with the net it "
                f"was trained with, or {AFRESH}")
    if not problems:
        return f"{path}: the checkpoint does not fit this job"
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{path}: {problems[0]}{more}"


def _updater_name(conf: Mapping[str, Any]) -> str:
    return str(conf.get("user_type") or conf.get("type"))


def _flat(conf: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], skip: Sequence[str] = (),
             keep: Any = None) -> list[str]:
    """``key old → new`` for each setting that differs (``skip``: top-level keys left out;
    ``keep``: a filter of the keys)."""
    old = _flat({k: v for k, v in before.items() if k not in skip})
    new = _flat({k: v for k, v in after.items() if k not in skip})
    return [f"{key} {old.get(key)!r} → {new.get(key)!r}" for key in sorted({*old, *new})
            if old.get(key) != new.get(key) and (keep is None or keep(key))]


def _listed(changes: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(changes[:most])
    return shown + (f" and {len(changes) - most} more" if len(changes) > most else "")


def _params_differ(meta: Mapping[str, Any], layout: Sequence[Sequence[Any]],
                   dtype: str) -> bool:
    saved = [list(p) for p in meta.get("params") or []]
    return saved != [list(p) for p in layout] or meta.get("dtype") != dtype


def _params_change(meta: Mapping[str, Any], layout: Sequence[Sequence[Any]],
                   dtype: str) -> str:
    """The first difference between the checkpoint's Params and the job's."""
    if meta.get("dtype") != dtype:
        return f"its values are {meta.get('dtype')}, the job's {dtype}"
    saved = {str(name): size for name, size in meta.get("params") or []}
    here = {str(name): size for name, size in layout}
    for name, size in here.items():
        if name not in saved:
            return f"Param '{name}' is not in it"
        if saved[name] != size:
            return f"Param '{name}' has {saved[name]} values in it and {size} in the job"
    gone = [name for name in saved if name not in here]
    if gone:
        return f"its Param '{gone[0]}' is not in the job"
    return "its Params are in another order"


__all__ = ["misfit"]
