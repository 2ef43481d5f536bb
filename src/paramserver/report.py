"""Readable text about a job and about the registered components, for the command line."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from .config import ParamError, Parameter
from .config.components import (
    ComponentConf,
    ComponentRegistry,
    layers,
    lr_methods,
    param_generators,
    updaters,
)
from .config.job import (
    ClusterConf,
    JobConf,
    LayerConf,
    LRGenConf,
    ParamGenConf,
    UpdaterConf,
)
from .config.types import format_number

#: What ``paramserver doc`` covers: a title, the registry, and the common configuration.
SECTIONS: tuple[tuple[str, ComponentRegistry, type[ComponentConf]], ...] = (
    ("Initialisation methods (param { init { ... } })", param_generators, ParamGenConf),
    ("Updaters (updater { ... })", updaters, UpdaterConf),
    ("Learning-rate methods (updater { learning_rate { ... } })", lr_methods, LRGenConf),
    ("Layers (neuralnet { layer { ... } })", layers, LayerConf),
)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe_conf(conf: ComponentConf) -> str:
    """``kStep(base_lr=0.1, change_freq=10, gamma=0.5)``: the choice and what differs from
    the defaults."""
    parts = []
    skip = {"type", "user_type", "learning_rate"}
    for name, f in type(conf).fields().items():
        value = getattr(conf, name)
        if name in skip or isinstance(value, Parameter) or (
                not f.required and value == f.make_default()):
            continue
        parts.append(f"{name}={_show(value)}")
    own = conf.own
    if own is not None:
        parts += [f"{k}={_show(v)}" for k, v in own.__dict__.items()]
    return f"{conf.component}({', '.join(parts)})"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, Parameter):
        return describe_conf(value) if isinstance(value, ComponentConf) else repr(value)
    return str(value)


def job_report(job: JobConf) -> str:
    """What ``paramserver check`` prints: Params, updater, cluster and server loads."""
    from .cluster import server_loads
    from .params import plan_params
    from .train.net import Net

    net = Net(job.neuralnet, seed=job.seed)
    specs = net.param_specs()
    plan = plan_params(specs)  # sizes and sharing only: no memory for the Params
    by_name = {s.name: s for s in specs}
    rows = []
    for s in specs:
        owner = by_name[plan.owner_of[s.name]]  # a sharer takes its owner's configuration
        rows.append([s.name, s.place.split("'")[1] if "'" in s.place else "",
                     "x".join(map(str, s.shape)) or "()", describe_conf(owner.conf.init),
                     format_number(float(owner.conf.lr_scale)),
                     format_number(float(owner.conf.wd_scale)),
                     owner.name if owner is not s else ""])
    c = job.cluster
    out = [
        f"job '{job.name}': {job.train_steps} training steps, seed {job.seed}, "
        f"workspace {job.workspace_dir}",
        "",
        f"Params: {len(specs)} ({len(plan.owners)} owners, {plan.num_values:,} values)",
        table(["name", "layer", "shape", "init", "lr_scale", "wd_scale", "shares"], rows),
        "",
        f"Updater: {describe_conf(job.updater)}",
        f"Learning rate: {describe_conf(job.updater.learning_rate)}",
        "",
        f"Cluster: {c.nworker_groups} worker group(s) x {c.nworkers_per_group} worker(s), "
        f"{c.nserver_groups} server group(s) x {c.nservers_per_group} server(s); "
        + ("synchronous (BSP)" if c.nworker_groups == 1 else "asynchronous between groups "
           "(Downpour)") + (f", staleness {c.staleness}" if c.staleness is not None else "")
        + f"; backend {c.backend}",
    ]
    loads = server_loads(plan.sizes, c)
    total = max(plan.num_values, 1)
    out.append(table(["server", "slices", "values", "share"], [
        [x.server, _ranges(x.slice_ids), f"{x.num_values:,}",
         f"{100 * x.num_values / total:.1f}%"] for x in loads]))
    return "\n".join(out)


def _ranges(ids: Sequence[int]) -> str:
    if not ids:
        return "-"
    return f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"


def component_doc(name: str | None = None) -> str:
    """The documentation of every registered component, or of the one called ``name``."""
    if name is None:
        blocks = []
        for title, registry, common in SECTIONS:
            entries = [_entry(registry, n, common, brief=True) for n in registry.names()]
            blocks.append(f"{title}\n{'=' * len(title)}\n" + "\n\n".join(entries))
        blocks.append(_config_doc("Cluster (cluster { ... })", ClusterConf))
        blocks.append(_config_doc("Job (top level of a job file)", JobConf))
        return "\n\n\n".join(blocks)
    lowered = name.lower()
    if lowered in ("cluster", "clusterconf"):
        return _config_doc("cluster { ... }", ClusterConf)
    if lowered in ("job", "jobconf"):
        return _config_doc("job file, top level", JobConf)
    for _, registry, common in SECTIONS:
        if name in registry:
            return _entry(registry, name, common, brief=False)
    known = [n for _, r, _ in SECTIONS for n in r.names()] + ["cluster", "job"]
    raise ParamError(f"no component named '{name}'; known: {', '.join(known)}")


def _entry(registry: ComponentRegistry, name: str, common: type[ComponentConf],
           brief: bool) -> str:
    canonical = registry.lookup(name)
    cls = registry.get(canonical)
    aliases = registry.aliases(canonical)
    head = canonical + (f" (also {', '.join(aliases)})" if aliases else "")
    text = inspect.getdoc(cls) or ""
    lines = [head, _indent(text.split("\n\n")[0] if brief else text)]
    key = registry.conf_name(canonical)
    if key is not None:
        lines.append(_indent(f"{key} {{ ... }}:\n" + _indent(cls.Config.doc())))
    if not brief:
        lines.append(_indent(f"common fields of {registry.kind} blocks:\n"
                             + _indent(common.doc())))
    return "\n".join(x for x in lines if x.strip())


def _config_doc(title: str, cls: type[Parameter]) -> str:
    return f"{title}\n{'=' * len(title)}\n{cls.doc()}"


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


__all__ = ["component_doc", "describe_conf", "job_report", "table"]
