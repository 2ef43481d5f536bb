"""The ``paramserver`` command: check, doc, train and data.

A user's mistake (a bad job file, a missing data file, an unknown component) prints its
messages on stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .config import ParamError

EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        for module in [*args.imports, *args.sub_imports]:
            _import_user_module(module)
        status: int = args.run(args)
        return status
    except ParamError as e:
        print(f"paramserver {args.command}: error:\n{e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RuntimeError as e:
        from .cluster import ClusterError

        if not isinstance(e, ClusterError):
            raise
        print(f"paramserver {args.command}: the run failed:\n{e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("paramserver: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``paramserver doc | head``)
        sys.stdout = None  # type: ignore[assignment]  # nothing more to flush at exit
        return 0


def _import_user_module(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise ParamError(f"--import {name}: no module named '{e.name}' (is it on "
                             "PYTHONPATH, or in the current folder?)") from None
        raise


def _parser() -> argparse.ArgumentParser:
    def with_import(default: Any, dest: str) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--import", dest=dest, action="append", default=default,
                       metavar="MODULE",
                       help="import a module that registers your own components (repeatable)")
        return p

    # Before or after the command: the two lists are joined (a subparser's default would
    # otherwise replace what was given before the command).
    top, common = with_import([], "imports"), with_import([], "sub_imports")
    parser = argparse.ArgumentParser(
        prog="paramserver", parents=[top],
        description="Parameters of machine-learning training, after Apache SINGA.")
    parser.add_argument("--version", action="version", version=f"paramserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", parents=[common], help="check a job file and show its "
                           "Params, updater and servers")
    check.add_argument("job", help="the job file (SINGA's text format)")
    check.set_defaults(run=_check)

    doc = sub.add_parser("doc", parents=[common], help="document the registered components")
    doc.add_argument("name", nargs="?", help="one component (e.g. kSGD, kStep, kGaussian, "
                     "kInnerProduct, cluster); all when left out")
    doc.set_defaults(run=_doc)

    train = sub.add_parser("train", parents=[common], help="train a job")
    train.add_argument("job", help="the job file (SINGA's text format)")
    train.add_argument("--steps", type=int, help="train this many steps (default: "
                       "the job's train_steps)")
    train.add_argument("--workspace", help="folder for checkpoints, metrics and the plot "
                       "(default: the job's workspace)")
    train.add_argument("--seed", type=int, help="seed of the job (default: the job's seed)")
    train.add_argument("--resume", action="store_true",
                       help="go on from the newest checkpoint in the workspace")
    train.add_argument("--backend", choices=("local", "ray"),
                       help="where servers and workers run (default: the job's, local)")
    train.add_argument("--address", help="with --backend ray: address of an existing Ray "
                       "cluster (default: start a local one on 127.0.0.1)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=_train)

    from .singa import datasets

    data = sub.add_parser("data", parents=[common], help="write a dataset in SINGA's store "
                          "formats (kvfile, DataShard, CSV) for a SINGA job file")
    datasets.add_arguments(data)
    data.set_defaults(run=datasets.run)
    return parser


# -- check ----------------------------------------------------------------------------------

def _check(args: argparse.Namespace) -> int:
    from .config.job import load_job
    from .report import job_report

    job = load_job(args.job)
    print(job_report(job))
    return 0


# -- doc ------------------------------------------------------------------------------------

def _doc(args: argparse.Namespace) -> int:
    from .report import component_doc

    print(component_doc(args.name))
    return 0


# -- train ----------------------------------------------------------------------------------

def _train(args: argparse.Namespace) -> int:
    from .config.job import load_job
    from .train.trainer import Trainer

    job = load_job(args.job)
    overrides: dict[str, Any] = {}
    if args.steps is not None:
        overrides["train_steps"] = args.steps
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.workspace is not None:
        overrides["workspace"] = args.workspace
    try:
        job.update(overrides, allow_unknown=False)
        if args.backend is not None or args.address is not None:
            cluster: dict[str, Any] = {}
            if args.backend is not None:
                cluster["backend"] = args.backend
            if args.address is not None:
                cluster["ray_address"] = args.address
            job.cluster.update(cluster, allow_unknown=False)
    except ParamError as e:
        raise ParamError(f"command-line option: {e}") from None
    trainer = Trainer(job, progress=not args.quiet, base_dir=Path(args.job).parent)
    try:
        trainer.train(resume=args.resume)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
