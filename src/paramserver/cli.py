"""The ``paramserver`` command: check, doc and train.

A user's mistake (a bad job file, a missing data file, an unknown component) prints its
messages on stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
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
        # One problem starts on the line of the command; several go below it, one a line.
        sep = " " if len(e.problems) == 1 else "\n"
        print(f"paramserver {args.command}: error:{sep}{e}", file=sys.stderr)
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
    except OSError as e:  # the disk filled up, a file went away while running
        place = f"{e.filename}: " if e.filename else ""
        print(f"paramserver {args.command}: failed: {place}{e.strerror or e}", file=sys.stderr)
        return 1


def _import_user_module(name: str) -> None:
    """Import a module of the user's; its failure is their mistake, told in one line:
    the module, the exception, and the place in their code where it was raised."""
    try:
        importlib.import_module(name)
    except ParamError:
        raise  # a registration refused (a name taken twice): already a clear message
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise ParamError(f"--import {name}: no module named '{e.name}' (is it on "
                             "PYTHONPATH, or in the current folder?)") from None
        raise ParamError(f"--import {name}: {_exception_line(e)}") from None
    except SyntaxError as e:
        where = f"{e.filename}:{e.lineno}" + (f":{e.offset}" if e.offset else "")
        raise ParamError(f"--import {name}: SyntaxError: {e.msg} ({where})") from None
    except Exception as e:
        raise ParamError(f"--import {name}: {_exception_line(e)}") from None


def _exception_line(e: BaseException) -> str:
    """``Type: message (file:line)``: the place is the innermost frame in the user's own
    code (not in the standard library, installed packages or paramserver), else the
    innermost one."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<frozen")]
    libraries = tuple({sys.prefix, sys.base_prefix, str(Path(__file__).parent)})
    own = [f for f in frames if not os.path.abspath(f.filename).startswith(libraries)]
    frames = own or frames
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = str(e).strip().splitlines()
    return f"{type(e).__name__}" + (f": {message[0]}" if message else "") + where


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
    # Each option checked as its field, every mistake named by its option.
    options = [("--steps", job, "train_steps", args.steps), ("--seed", job, "seed", args.seed),
               ("--workspace", job, "workspace", args.workspace),
               ("--backend", job.cluster, "backend", args.backend),
               ("--address", job.cluster, "ray_address", args.address)]
    problems = []
    for option, conf, key, value in options:
        if value is None:
            continue
        try:
            conf.update({key: value}, allow_unknown=False)
        except ParamError as e:
            problems.append(f"{option} {value}: {e}")
    if problems:
        raise ParamError(problems)
    trainer = Trainer(job, progress=not args.quiet, base_dir=Path(args.job).parent)
    try:
        trainer.train(resume=args.resume)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
