"""Readable text about a job and about the registered components, for the command line."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Collection, Sequence
from typing import Any

from .config import Location, ParamError, Parameter
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
from .console import cut
from .paths import shown

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
    ("cluster", ClusterConf),
    ("job", JobConf),
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
    skip = {"type", "user_type", "learning_rate"}
    parts = [f"{k}={_show(v)}" for k, v in conf.non_defaults().items()
             if k not in skip and not isinstance(v, Parameter)]
    own = conf.own
    if own is not None:
        parts += [f"{k}={_show(v)}" for k, v in own.non_defaults().items()]
    return f"{conf.component}({', '.join(parts)})"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, Parameter):
        return describe_conf(value) if isinstance(value, ComponentConf) else repr(value)
    return str(value)


def job_summary(job: JobConf, net: Any = None, loaded: Collection[str] = ()
                ) -> dict[str, Any]:
    """What ``paramserver check`` reports, as plain data (``check --json``): the job, its
    Params, updater, learning-rate schedule, cluster and server loads.

    Args:
        job: the job.
        net: the job's :class:`~paramserver.train.net.Net` if already built (default: built
            here from the job, data paths relative to the working folder).
        loaded: the Params that ``checkpoint_path`` gives values (their init is not used).
    """
    from .cluster import server_loads
    from .config.job import unbuilt_error
    from .init import is_constant
    from .params import plan_params
    from .schedules import create_lr_method
    from .train.net import Net
    from .train.workspace import written_files

    unbuilt = job.unbuilt()
    if unbuilt:  # everything else of the file was read and checked by load_job
        raise unbuilt_error(unbuilt)
    if net is None:
        net = Net(job.neuralnet, seed=job.seed, phases=("kTrain", *job.eval_phases()))
    specs = net.param_specs()
    plan = plan_params(specs)  # sizes and sharing only: no memory for the Params
    tables = plan.table_names()  # what a training job makes row-sparse tables
    by_name = {s.name: s for s in specs}
    params = []
    warnings = []
    for s in specs:
        owner = by_name[plan.owner_of[s.name]]  # a sharer takes its owner's configuration
        # A matrix (two dimensions of more than one element: SINGA's (1, C, 1, 1) scales
        # are vectors) whose units would all start, and stay, equal.
        if owner is s and sum(d > 1 for d in s.shape) >= 2 and is_constant(s.conf.init) and (
                s.name not in loaded):
            init = ("none given, so SINGA's default: kConstant, value 1"
                    if s.conf.init == ParamGenConf() else describe_conf(s.conf.init))
            warnings.append(
                f"Param '{s.name}' ({s.place}) of shape {'x'.join(map(str, s.shape))} has a "
                f"constant init ({init}): every unit computes the same and gets the same "
                "gradient, so they stay equal; give it a random init, e.g. init { type: "
                "glorot_uniform }")
        params.append({"name": s.name, "layer": s.place.split("'")[1] if "'" in s.place else "",
                       "shape": list(s.shape), "size": math.prod(s.shape),
                       "init": describe_conf(owner.conf.init),
                       "lr_scale": float(owner.conf.lr_scale),
                       "wd_scale": float(owner.conf.wd_scale),
                       "share_from": owner.name if owner is not s else None,
                       "row_sparse": s.name in tables,
                       "from_checkpoint": owner.name in loaded})
    c = job.cluster
    sizes, dims = plan.server_sizes()  # as the servers slice them: tables last, by rows
    lr = create_lr_method(job.updater.learning_rate)
    last = max(job.train_steps - 1, 0)
    samples = sorted({0, last // 4, last // 2, 3 * last // 4, last})
    total = max(plan.num_values, 1)
    return {
        "job": {"name": job.name, "train_steps": job.train_steps, "seed": job.seed,
                "workspace": job.workspace_dir, "disp_freq": job.disp_freq,
                "test_freq": job.test_freq, "checkpoint_freq": job.checkpoint_freq},
        "params": params,
        "num_params": len(specs), "num_owners": len(plan.owners),
        "num_values": plan.num_values,
        "updater": {"description": describe_conf(job.updater),
                    "conf": job.updater.to_dict()},
        "schedule": {"description": describe_conf(job.updater.learning_rate),
                     "conf": job.updater.learning_rate.to_dict(),
                     "lr": [[step, lr(step)] for step in samples]},
        "cluster": {**c.to_dict(),
                    "consistency": "BSP" if c.nworker_groups == 1 else "Downpour"},
        "servers": [{"server": x.server, "slices": list(x.slice_ids),
                     "values": x.num_values, "share": x.num_values / total}
                    for x in server_loads(sizes, c, dims)],
        "writes": [{"what": what, "path": str(path)} for what, path in written_files(job)],
        "warnings": warnings,
    }


def job_report(job: JobConf, net: Any = None, loaded: Collection[str] = (),
               summary: dict[str, Any] | None = None) -> str:
    """What ``paramserver check`` prints: Params, updater, cluster and server loads, from
    ``summary`` (default: :func:`job_summary`'s); its warnings go to stderr."""
    d = summary if summary is not None else job_summary(job, net, loaded)
    j, c = d["job"], job.cluster
    rows = [[p["name"], p["layer"], ("x".join(map(str, p["shape"])) or "()")
             + (" (row-sparse)" if p["row_sparse"] else ""),
             "checkpoint_path" if p["from_checkpoint"] else p["init"],
             format_number(p["lr_scale"]), format_number(p["wd_scale"]),
             p["share_from"] or ""] for p in d["params"]]
    out = [
        f"job '{shown(j['name'])}': {j['train_steps']} training steps, seed {j['seed']}, "
        f"workspace {shown(j['workspace'])}",
        "",
        f"Params: {d['num_params']} ({d['num_owners']} owners, {d['num_values']:,} values)",
        table(["name", "layer", "shape", "init", "lr_scale", "wd_scale", "shares"], rows),
        "",
        f"Updater: {d['updater']['description']}",
        f"Learning rate: {d['schedule']['description']}",
        "",
        f"Cluster: {c.nworker_groups} worker group(s) x {c.nworkers_per_group} worker(s), "
        f"{c.nserver_groups} server group(s) x {c.nservers_per_group} server(s); "
        + ("synchronous (BSP)" if c.nworker_groups == 1 else "asynchronous between groups "
           "(Downpour)") + (f", staleness {c.staleness}" if c.staleness is not None else "")
        + f"; backend {c.backend}",
    ]
    out.append(table(["server", "slices", "values", "share"], [
        [x["server"], _ranges(x["slices"]), f"{x['values']:,}", f"{100 * x['share']:.1f}%"]
        for x in d["servers"]]))
    out += ["", "Writes (a run of this job):", table(
        ["path", "what"], [[shown(w["path"]), w["what"]] for w in d["writes"]])]
    return "\n".join(out)


def _ranges(ids: Sequence[int]) -> str:
    if not ids:
        return "-"
    return f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"


def find_component(name: str) -> tuple[str, ComponentRegistry, type[ComponentConf]] | str:
    """The section and canonical name of the component called ``name`` in any spelling
    (``ksgd``, ``SGD``, ``kSGD``); the key of a block of the job schema (``"cluster"``,
    ``"job"``, ``"layer"``, ... of :data:`BLOCKS`) for those configurations.

    Raises:
        ParamError: naming the closest known names.
    """
    lowered = name.lower()
    for key, cls in BLOCKS:
        if lowered in (key, cls.__name__.lower()):
            return key
    spellings = [name] + ([name[1:]] if len(name) > 1 and name[0] in "kK" else [])
    for _, registry, common in SECTIONS:
        for spelling in spellings:
            if spelling in registry:
                return registry.lookup(spelling), registry, common
    known = [n for _, r, _ in SECTIONS for n in r.names()]
    by_lower = {key: key for key, _ in BLOCKS}  # every spelling -> its canonical name
    for _, registry, _ in SECTIONS:
        for n in registry.names():
            for spelling in (n, *registry.aliases(n)):
                by_lower.setdefault(spelling.lower(), n)
    close = difflib.get_close_matches(lowered, list(by_lower), n=6, cutoff=0.6)
    names = list(dict.fromkeys(by_lower[c] for c in close))[:3]
    hint = f"; did you mean {' or '.join(repr(n) for n in names)}?" if names else ""
    blocks = ", ".join(key for key, _ in BLOCKS)
    raise ParamError(f"no component named '{name}'{hint} (known: {', '.join(known)}, "
                     f"{blocks}; or a field of one of them)")


def component_doc(name: str | None = None) -> str:
    """The documentation of every registered component, or of the one called ``name``
    (any spelling, any letter case)."""
    if name is None:
        blocks = []
        for title, registry, common in SECTIONS:
            entries = [_entry(registry, n, common, brief=True) for n in registry.names()]
            blocks.append(f"{title}\n{'=' * len(title)}\n" + "\n\n".join(entries))
        blocks += [_config_doc(_block_title(key), cls) for key, cls in BLOCKS]
        return "\n\n\n".join(blocks)
    if "." in name:
        where, found_field = _dotted_field(name)
        return f"{where}:\n" + _indent(found_field.describe())
    fields = _field_docs(name)
    try:
        found = find_component(name)
    except ParamError:
        if fields:
            return "\n\n".join(text for _, text, _ in fields)
        raise
    if isinstance(found, str):
        return _config_doc(_block_title(found), dict(BLOCKS)[found])
    canonical, registry, common = found
    entry = _entry(registry, canonical, common, brief=False)
    return "\n\n".join([entry, *(["fields of the same name:"] if fields else []),
                         *(text for _, text, _ in fields)])


def _dotted_field(name: str) -> tuple[str, Any]:
    """``OWNER.FIELD`` (``kSGD.momentum``, ``job.train_steps``, ``cluster.nworker_groups``,
    ``kStep.gamma``): where the field is written, and its declaration. The owner is a
    component (its own block's fields and the common fields of its kind) or a block of the
    job schema.

    Raises:
        ParamError: an unknown owner, or a field it does not have (with the close ones).
    """
    owner, _, key = name.rpartition(".")
    found = find_component(owner)
    if isinstance(found, str):
        candidates: list[tuple[str, type[Parameter]]] = [(_block_title(found),
                                                          dict(BLOCKS)[found])]
    else:
        canonical, registry, common = found
        conf_key = registry.conf_name(canonical)
        own = getattr(registry.get(canonical), "Config", None)
        candidates = ([(f"{canonical}: {conf_key} {{ ... }}", own)]
                      if own is not None and conf_key is not None else [])
        candidates.append((f"{canonical}: common fields of {registry.kind} blocks", common))
    for where, cls in candidates:
        f = cls.fields().get(cls.__keys__.get(key, key))
        if f is not None:
            return where, f
    known = [k for _, cls in candidates for k in cls.fields()]
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ParamError(f"{owner} has no field '{key}'{hint} (its fields: {', '.join(known)})")


def _block_title(key: str) -> str:
    return "job file, top level" if key == "job" else f"{key} {{ ... }}"


def _field_docs(name: str) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Every declaration of a field (or ``*_conf`` block) called ``name``: where it is
    written (``cluster { ... }``, ``kPooling reads pooling_conf``), its documentation, and
    the same as data (``doc --json``)."""
    out = []
    blocks: list[tuple[str, type[Parameter]]] = [
        *BLOCKS, ("updater", UpdaterConf), ("learning_rate", LRGenConf), ("init", ParamGenConf)]
    for key, cls in blocks:
        f = cls.fields().get(name)
        if f is not None:
            where = _block_title(key)
            out.append((where, f"{where}:\n" + _indent(f.describe()),
                        [d for d in fields_data(cls) if d["name"] == name]))
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
            one = name in config.fields()
            body = config.fields()[name].describe() if one else config.doc()
            where = "; ".join(who)
            out.append((where, f"{where}:\n" + _indent(body or "(no fields)"),
                        [d for d in fields_data(config) if not one or d["name"] == name]))
    return out


def component_data(name: str | None = None) -> dict[str, Any]:
    """``paramserver doc --json``: every component (or the one called ``name``) as data."""
    if name is not None and "." in name:
        where, f = _dotted_field(name)
        owner = name.rpartition(".")[0]
        declared = [d for d in fields_data(_declaring(where, owner)) if d["name"] == f.name]
        return {"name": name, "kind": "field", "places": [{"where": where,
                                                           "fields": declared}]}
    if name is not None:
        try:
            found = find_component(name)
        except ParamError:
            fields = _field_docs(name)
            if not fields:
                raise
            return {"name": name, "kind": "field",
                    "places": [{"where": where, "fields": data} for where, _, data in fields]}
        if isinstance(found, str):
            cls = dict(BLOCKS)[found]
            return {"name": found, "kind": "configuration", "doc": inspect.getdoc(cls) or "",
                    "fields": fields_data(cls)}
        canonical, registry, common = found
        return {**_component_data(registry, canonical),
                "common_fields": fields_data(common)}
    return {
        "sections": [{"title": title, "kind": registry.kind,
                      "common_fields": fields_data(common),
                      "components": [_component_data(registry, n) for n in registry.names()]}
                     for title, registry, common in SECTIONS],
        "configurations": [{"name": key, "fields": fields_data(cls)} for key, cls in BLOCKS],
    }


def _declaring(where: str, owner: str) -> type[Parameter]:
    """The configuration class :func:`_dotted_field` found a field in, by its ``where``."""
    found = find_component(owner)
    if isinstance(found, str):
        return dict(BLOCKS)[found]
    canonical, registry, common = found
    return common if where.endswith("blocks") else registry.get(canonical).Config


def component_text(registry: ComponentRegistry, cls: type) -> str:
    """The documentation of the component ``cls``: its own docstring; else that of the
    nearest registered component it extends (a variant, documented there); never that of a
    base class that is no component (``Layer``'s is not a user's layer's): then a line
    saying that the class has none."""
    registered = {id(registry.get(n)) for n in registry.names()}
    for klass in cls.__mro__:
        doc = klass.__dict__.get("__doc__")
        if klass is not cls and id(klass) not in registered:
            continue
        if doc and doc.strip():
            return inspect.cleandoc(doc)
    return f"({cls.__module__}.{cls.__qualname__} has no docstring.)"


def _component_data(registry: ComponentRegistry, name: str) -> dict[str, Any]:
    cls = registry.get(name)
    text = component_text(registry, cls)
    key = registry.conf_name(name)
    return {"name": name, "kind": registry.kind, "aliases": list(registry.aliases(name)),
            "summary": text.split("\n\n")[0].replace("\n", " "), "doc": text,
            "conf_block": key,
            "fields": fields_data(cls.Config) if key is not None else []}


def fields_data(cls: type[Parameter]) -> list[dict[str, Any]]:
    """The declared fields of a configuration as data, in declaration order."""
    out = []
    for f in cls.fields().values():
        enum = f.enum
        if enum is not None and not isinstance(enum, tuple):
            enum = enum.names() if hasattr(enum, "names") else None
        out.append({"name": f.name, "type": f.type.name, "required": f.required,
                    "default": None if f.required else json_safe(
                        f.type.plain(f.make_default())),
                    "doc": f.doc, "lower": json_safe(f.lower), "upper": json_safe(f.upper),
                    "lower_exclusive": f.lower_exclusive,
                    "enum": list(enum) if enum is not None else None,
                    "aliases": list(f.aliases)})
    return out


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``
    (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return format_number(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def problems_data(error: ParamError) -> list[dict[str, Any]]:
    """Every problem of an error as data: ``file``, ``line``, ``column`` (for a place in a
    file), ``path`` (for a key path), and ``message``."""
    out = []
    for p in error.problems:
        where = p.where
        loc = where if isinstance(where, Location) else None
        out.append({"file": loc.file if loc else None, "line": loc.line if loc else None,
                    "column": loc.column if loc else None,
                    "path": where if isinstance(where, str) else None,
                    "message": cut(p.message)})
    return out


def _entry(registry: ComponentRegistry, name: str, common: type[ComponentConf],
           brief: bool) -> str:
    canonical = registry.lookup(name)
    cls = registry.get(canonical)
    aliases = registry.aliases(canonical)
    head = canonical + (f" (also {', '.join(aliases)})" if aliases else "")
    text = component_text(registry, cls)
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


__all__ = ["component_data", "component_doc", "component_text", "describe_conf", "fields_data",
           "find_component", "job_report", "job_summary", "json_safe", "problems_data", "table"]
