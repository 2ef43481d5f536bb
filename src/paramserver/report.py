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
    CDConf,
    ClusterConf,
    JobConf,
    LayerConf,
    LayerGroupConf,
    LRGenConf,
    NetConf,
    ParamConf,
    ParamGenConf,
    TrainOneBatchConf,
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


#: The blocks of a job file that are not components, by the key that opens them: ``paramserver
#: doc`` prints each, ``paramserver doc KEY`` one, ``paramserver doc FIELD`` finds a field.
BLOCKS: tuple[tuple[str, type[Parameter]], ...] = (
    ("job", JobConf),
    ("cluster", ClusterConf),
    ("train_one_batch", TrainOneBatchConf),
    ("cd_conf", CDConf),
    ("neuralnet", NetConf),
    ("layer_group", LayerGroupConf),
    ("layer", LayerConf),
    ("param", ParamConf),
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
    from .config.job import unbuilt_error
    from .params import ParamSet
    from .train.net import Net

    unbuilt = job.unbuilt()
    if unbuilt:  # everything else of the file was read and checked by load_job
        raise unbuilt_error(unbuilt)
    net = Net(job.neuralnet, seed=job.seed, phases=("kTrain", *job.eval_phases()))
    specs = net.param_specs()
    pset = ParamSet(specs)
    layer_of = {s.name: s.place.split("'")[1] if "'" in s.place else "" for s in specs}
    rows = []
    for p in pset.params:
        rows.append([p.name, layer_of.get(p.name, ""), "x".join(map(str, p.shape)) or "()",
                     describe_conf(p.conf.init), format_number(p.lr_scale),
                     format_number(p.wd_scale), p.owner.name if p.owner else ""])
    c = job.cluster
    out = [
        f"job '{job.name}': {job.train_steps} training steps, seed {job.seed}, "
        f"workspace {job.workspace_dir}",
        "",
        f"Params: {len(pset.params)} ({len(pset.owners)} owners, {pset.values.size:,} values)",
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
    loads = server_loads(pset, c)
    total = max(pset.values.size, 1)
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
        blocks += [_config_doc(_block_title(key), cls) for key, cls in BLOCKS]
        return "\n\n\n".join(blocks)
    lowered = name.lower()
    for key, cls in BLOCKS:
        if lowered in (key, cls.__name__.lower()):
            return _config_doc(_block_title(key), cls)
    found = _field_docs(name)
    for _, registry, common in SECTIONS:
        if name in registry:
            entry = _entry(registry, name, common, brief=False)
            return "\n\n".join([entry, *(["fields of the same name:"] if found else []),
                                 *found])
    if found:
        return "\n\n".join(found)
    known = [n for _, r, _ in SECTIONS for n in r.names()] + [k for k, _ in BLOCKS]
    raise ParamError(f"no component, block or field named '{name}'; known: "
                     f"{', '.join(known)}")


def _block_title(key: str) -> str:
    return "job file, top level" if key == "job" else f"{key} {{ ... }}"


def _field_docs(name: str) -> list[str]:
    """Every declaration of a field (or ``*_conf`` block) called ``name``, with where it is
    written: ``cluster.start_port``, ``layer { pooling_conf { pool } }``."""
    out = []
    blocks: list[tuple[str, type[Parameter]]] = [
        *BLOCKS, ("updater", UpdaterConf), ("learning_rate", LRGenConf), ("init", ParamGenConf)]
    for key, cls in blocks:
        f = cls.fields().get(name)
        if f is not None:
            out.append(f"{_block_title(key)}:\n" + _indent(f.describe()))
    for _, registry, _common in SECTIONS:
        readers: dict[type[Parameter], list[str]] = {}
        for component in registry.names():
            config = getattr(registry.get(component), "Config", None)
            conf_key = registry.conf_name(component)
            if config is None or conf_key is None:
                continue
            if name == conf_key or name in config.fields():
                readers.setdefault(config, []).append(f"{component} reads {conf_key}")
        for config, who in readers.items():
            body = config.doc() if name not in config.fields() else config.fields()[
                name].describe()
            out.append(f"{'; '.join(who)}:\n" + _indent(body or "(no fields)"))
    return out


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
