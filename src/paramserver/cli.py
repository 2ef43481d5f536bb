"""The ``paramserver`` command: check, doc, train, data, export, ray-token and completion.

A user's mistake (a bad job file, a missing data file, an unknown component) prints its
messages on stderr and exits with status 2, without a traceback. Messages of the library
(the ``paramserver`` logger) and Python warnings are printed on stderr as plain lines.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from . import __version__
from .config import ParamError
from .console import EXIT_OUTPUT_CLOSED, LOG_FORMATS, OutputClosed

EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    from .console import attach, error_text

    parser = _parser()
    args = parser.parse_args(singa_argv(sys.argv[1:] if argv is None else list(argv)))
    if hasattr(args, "usage_error") and args.job is None and args.conf is None:
        # check's and train's JOB is optional to argparse only because SINGA's -conf may
        # give it instead: its absence is the same usage error as any missing argument.
        args.usage_error("the following arguments are required: JOB (or, as SINGA's "
                         "command line gave it, -conf JOB)")
    detach = attach(quiet=getattr(args, "quiet", False),
                    log_format=getattr(args, "log_format", "paramserver"))
    try:
        job = getattr(args, "job", None)
        if job is not None or getattr(args, "conf", None) is not None:
            args.job = _job_path(args)
        imports = [*args.imports, *args.sub_imports]
        if imports:
            # A module of the user's: in the current folder, or beside the job file (as a
            # script's own modules are beside it), as well as on the path.
            places = [os.getcwd(), *([os.path.dirname(os.path.abspath(args.job))]
                                     if getattr(args, "job", None) else [])]
            sys.path[:0] = [p for p in dict.fromkeys(places) if p not in sys.path]
        for module in imports:
            _import_user_module(module)
        status: int = args.run(args)
        return status
    except ParamError as e:
        print(error_text(args.command, e), file=sys.stderr)
        return EXIT_USER_ERROR
    except RuntimeError as e:
        from .cluster import ClusterError

        if not isinstance(e, ClusterError):
            raise
        print(error_text(args.command, str(e), "the run failed"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("paramserver: interrupted", file=sys.stderr)
        return 130
    except OutputClosed:  # said by the run, which stopped with a checkpoint
        sys.stdout = None  # type: ignore[assignment]  # nothing more to flush at exit
        return EXIT_OUTPUT_CLOSED
    except BrokenPipeError:  # the reader went away (``paramserver doc | head``)
        sys.stdout = None  # type: ignore[assignment]  # nothing more to flush at exit
        return 0
    except OSError as e:  # the disk filled up, a file went away while running
        from .paths import shown

        place = f"{shown(str(e.filename))}: " if e.filename else ""
        if e.errno == errno.ENAMETOOLONG:  # a path the user gave: paramserver makes no such
            print(error_text(args.command, f"{place}{e.strerror} (a path given to "
                             f"paramserver)"), file=sys.stderr)
            return EXIT_USER_ERROR
        print(error_text(args.command, f"{place}{e.strerror or e}", "failed"), file=sys.stderr)
        return 1
    finally:
        detach()


#: SINGA's command-line options (``singa-run.sh -conf JOB [-resume|-test]``), as accepted.
SINGA_OPTIONS = ("-conf", "-resume", "-test")


def singa_argv(argv: list[str]) -> list[str]:
    """``argv`` with SINGA's spelling made a ``train`` command: ``paramserver -conf JOB
    -resume`` (singa-run.sh's line) is ``paramserver train -conf JOB -resume`` (and
    ``paramserver -resume``, its JOB left out, is train's usage error)."""
    commands = ("check", "doc", "train", "data", "export", "completion", "ray-token")
    if any(a in SINGA_OPTIONS for a in argv) and not any(a in commands for a in argv):
        return ["train", *argv]
    return argv


def _job_path(args: argparse.Namespace) -> str:
    """The job file of ``check`` or ``train``: the argument (or SINGA's ``-conf``), a file
    there is; else one of paramserver's examples by its short name (``digits_mlp``,
    ``singa/mnist/conv``, or a README path such as ``examples/digits_mlp.conf`` run from
    another folder)."""
    from .train.jobfile import find_example

    conf = getattr(args, "conf", None)
    if conf is not None and args.job is not None:
        raise ParamError(f"give the job file once: '{args.job}' or -conf {conf}")
    job = conf if conf is not None else args.job
    found = None if os.path.lexists(job) else find_example(job)
    if found is None:
        return str(job)
    if not getattr(args, "json", False):  # --json: nothing but the JSON on stdout
        logging.getLogger("paramserver").info("%s: paramserver's example %s", job, found)
    return str(found)


def _import_user_module(name: str) -> None:
    """Import a module of the user's; its failure is their mistake, told in one line:
    the module, the exception, and the place in their code where it was raised."""
    try:
        importlib.import_module(name)
    except ParamError as e:  # a declaration or a registration refused: with its place
        raise ParamError(f"--import {name}: {_exception_line(e)}") from None
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise ParamError(f"--import {name}: no module named '{e.name}' in the current "
                             "folder, the job file's folder or on PYTHONPATH") from None
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
    libraries = tuple({sys.prefix, sys.base_prefix, os.path.dirname(__file__)})
    own = [f for f in frames if not os.path.abspath(f.filename).startswith(libraries)]
    frames = own or frames
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = str(e).strip().splitlines()
    return f"{type(e).__name__}" + (f": {message[0]}" if message else "") + where


def _parser() -> argparse.ArgumentParser:
    from .shipped import doc_file

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

    settings = argparse.ArgumentParser(add_help=False)
    settings.add_argument("--set", dest="settings", action="append", default=[],
                          metavar="PATH=VALUE",
                          help="set a field of the job, e.g. --set "
                          "neuralnet.layer[data].store_conf.batchsize=8 (repeatable; the job "
                          f"is checked as if its file said it; {doc_file('cli.md')})")

    check = sub.add_parser("check", parents=[common, settings], help="check a job file and "
                           "show its Params, updater and servers")
    check.add_argument("job", nargs="?", metavar="JOB", help="the job file (SINGA's text "
                       "format), or the name of one of paramserver's examples (digits_mlp, "
                       "singa/mnist/conv)")
    check.add_argument("-conf", dest="conf", metavar="JOB", help="the job file, as SINGA's "
                       "command line gave it")
    check.add_argument("--json", action="store_true", help="print the report (or the "
                       f"problems) as JSON on stdout ({doc_file('cli.md')} describes it)")
    check.add_argument("--allow-outside", action="store_true",
                       help="as train's: output layers may write outside the workspace")
    check.add_argument("--data", action="store_true", help="also read the data the net reads "
                       "(datasets, SINGA's stores, texts) and check it as training will; "
                       "without it only what tells the samples' shape is read")
    check.set_defaults(run=_check, usage_error=check.error)

    doc = sub.add_parser("doc", parents=[common], help="document the registered components")
    doc.add_argument("name", nargs="?", help="one component (e.g. kSGD, kStep, kGaussian, "
                     "kInnerProduct, cluster; any letter case), a field (momentum) or a "
                     "field of one (kSGD.momentum, job.train_steps); all when left out")
    doc.add_argument("--json", action="store_true", help="print the documentation as JSON")
    doc.set_defaults(run=_doc)

    train = sub.add_parser("train", parents=[common, settings], help="train a job")
    train.add_argument("job", nargs="?", metavar="JOB", help="the job file (SINGA's text "
                       "format), or the name of one of paramserver's examples (digits_mlp, "
                       "singa/mnist/conv)")
    train.add_argument("-conf", dest="conf", metavar="JOB", help="the job file, as SINGA's "
                       "command line gave it (singa-run.sh -conf JOB)")
    train.add_argument("--steps", type=int, help="train this many steps (default: "
                       "the job's train_steps)")
    train.add_argument("--workspace", help="folder for checkpoints, metrics and the plot "
                       "(default: the job's workspace)")
    train.add_argument("--seed", type=int, help="seed of the job (default: the job's seed)")
    again = train.add_mutually_exclusive_group()
    again.add_argument("--resume", "-resume", action="store_true",
                       help="go on from the newest checkpoint in the workspace that can be "
                       "read (or SINGA's, when newer; a damaged newer one is set aside, with "
                       "a warning); refused when there is none")
    again.add_argument("--resume-or-start", action="store_true",
                       help="as --resume, but start from the beginning when the workspace "
                       "holds nothing to resume from (for scripts that rerun a job until it "
                       "ends)")
    again.add_argument("--overwrite", action="store_true",
                       help="start afresh in a workspace that holds an earlier run, deleting "
                       "its checkpoints, TensorBoard event files and metrics (without "
                       "--resume or --overwrite such a workspace is refused)")
    again.add_argument("--test", "-test", action="store_true",
                       help="train nothing: test the Params once (those checkpoint_path "
                       "loads; SINGA's -test)")
    train.add_argument("--backend", choices=("local", "ray"),
                       help="where servers and workers run (default: the job's, local)")
    train.add_argument("--address", help="with --backend ray: address of an existing Ray "
                       "cluster (default: start a local one on 127.0.0.1)")
    train.add_argument("--quiet", action="store_true",
                       help="no progress display and no messages but warnings")
    train.add_argument("--log-format", choices=LOG_FORMATS, default="paramserver",
                       help="paramserver's progress display and messages, or SINGA's log "
                       "lines, as the job's release printed them (Train @ step 10  Loss = "
                       f"2.223607, accuracy = 0.189063; {doc_file('singa.md')})")
    train.add_argument("--no-tensorboard", dest="tensorboard", action="store_false",
                       help="write no TensorBoard event files")
    train.add_argument("--allow-outside", action="store_true",
                       help="let output layers (kCSVOutput, kRecordOutput) write where an "
                       "absolute store_conf path says, outside the workspace")
    train.set_defaults(run=_train, usage_error=train.error)

    from .singa import datasets

    data = sub.add_parser("data", parents=[common], help="write a dataset in SINGA's store "
                          "formats (kvfile, DataShard, CSV) for a SINGA job file")
    datasets.add_arguments(data)
    data.set_defaults(run=datasets.run)

    export = sub.add_parser("export", parents=[common], help="write the values of a "
                            "checkpoint as a safetensors model file")
    export.add_argument("checkpoint", help="a checkpoint file, or a workspace or folder of "
                        "checkpoints (the newest is read)")
    export.add_argument("--to", required=True, metavar="FILE",
                        help="the safetensors file to write")
    export.add_argument("--job", help="the job file, to name and shape the values of a "
                        "checkpoint of an earlier release")
    export.set_defaults(run=_export)

    token = sub.add_parser("ray-token", help="make the token of a Ray cluster, readable by "
                           "you only, before its `ray start` (docs/ray.md)",
                           description="Make Ray's authentication token where Ray reads it "
                           "(RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token) with mode 0600, or "
                           "make an existing one private; prints the file's path. Copy that "
                           "file to every machine of the cluster.")
    token.set_defaults(run=_ray_token, sub_imports=[])

    completion = sub.add_parser("completion", help="print a shell completion script",
                                description="Print a completion script for bash or zsh; "
                                "see the README for where to put it.")
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(run=_completion, sub_imports=[])
    return parser


# -- check ----------------------------------------------------------------------------------

def _check(args: argparse.Namespace) -> int:
    from .config.textformat import paused_gc
    from .report import job_report, job_summary, json_safe, problems_data
    from .train.jobfile import read_job_file

    # A short-lived command that makes a few objects per value of the job and frees little:
    # with the cyclic collector on, a job of 20,000 layers spent most of its time in it.
    with paused_gc():
        try:
            job_file = read_job_file(args.job, args.settings)
            net = job_file.build_net(read_data=args.data)
            loaded = job_file.check_params(net)
            job_file.check_outputs(args.allow_outside)
        except ParamError as e:
            if not args.json:
                raise
            _print_json({"ok": False, "file": args.job, "problems": problems_data(e)})
            return EXIT_USER_ERROR
        summary = job_summary(job_file.job, net, loaded)
        if args.json:
            _print_json(json_safe({"ok": True, "file": args.job, **summary, "problems": []}))
        else:
            print(job_report(job_file.job, summary=summary))
            for warning in summary["warnings"]:
                logging.getLogger("paramserver").warning("%s", warning)
    return 0


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, allow_nan=False))


# -- doc ------------------------------------------------------------------------------------

def _doc(args: argparse.Namespace) -> int:
    from .report import component_data, component_doc, json_safe, problems_data

    if args.json:
        try:
            data = component_data(args.name)
        except ParamError as e:
            _print_json({"ok": False, "problems": problems_data(e)})
            return EXIT_USER_ERROR
        _print_json(json_safe(data))
    else:
        print(component_doc(args.name))
    return 0


# -- train ----------------------------------------------------------------------------------

def _train(args: argparse.Namespace) -> int:
    from .train.jobfile import read_job_file
    from .train.trainer import Trainer, check_start

    job_file = read_job_file(args.job, args.settings)
    job = job_file.job
    if args.test and args.steps:
        raise ParamError(f"--test trains nothing: leave out --steps {args.steps}")
    # Each option checked as its field, every mistake named by its option.
    options = [("--steps", job, "train_steps", 0 if args.test else args.steps),
               ("--seed", job, "seed", args.seed),
               ("--workspace", job, "workspace", args.workspace),
               ("--backend", job.cluster, "backend", args.backend),
               ("--address", job.cluster, "ray_address", args.address)]
    problems = ["--workspace '': the path is empty; give a folder"] if args.workspace == "" else []
    for option, conf, key, value in options:
        if value is None:
            continue
        try:
            conf.update({key: value}, allow_unknown=False)
        except ParamError as e:
            problems.append(f"{option} {value}: {e}")
    if problems:
        raise ParamError(problems)
    job_file.check_outputs(args.allow_outside)  # the job file itself among the inputs
    with job_file.placing():
        if not args.test:  # refused before anything is built (on Ray, before any actor)
            check_start(job, resume=args.resume or args.resume_or_start,
                        overwrite=args.overwrite, or_start=args.resume_or_start)
        on_ray: dict[str, Any] = {}
        if job.cluster.backend == "ray":  # Ray's own messages and where its actors are
            workspace = os.path.abspath(job.workspace_dir)
            on_ray = {"log_file": os.path.join(workspace, "ray.log"),
                       "placement_file": os.path.join(workspace, "placement.json")}
        trainer = Trainer(job, progress=not args.quiet, base_dir=job_file.base_dir,
                          tensorboard=args.tensorboard, stream=sys.stdout,
                          log_format=args.log_format, allow_outside=args.allow_outside,
                          cluster_options=on_ray)
        try:
            trainer.train(resume=args.resume or args.resume_or_start,
                          overwrite=args.overwrite, or_start=args.resume_or_start)
        finally:
            trainer.close()
    return 0


# -- export ---------------------------------------------------------------------------------

def _export(args: argparse.Namespace) -> int:
    import logging

    from .export import export_model, param_table
    from .paths import refuse_inputs

    refuse_inputs([("--to", args.to)], [("--job", args.job)])
    table = None
    if args.job is not None:
        from .params import ParamSet
        from .train.jobfile import read_job_file

        job_file = read_job_file(args.job)
        # laid out as the trainer lays them out (tables last), holding no table's values
        table = param_table(ParamSet(job_file.build_net().param_specs(), tables=True,
                                     hold_tables=False))
    path, names = export_model(args.checkpoint, args.to, table)
    logging.getLogger("paramserver.export").info(
        "wrote %d tensors to %s: %s", len(names), path,
        ", ".join(names[:8]) + (", ..." if len(names) > 8 else ""))
    return 0


# -- ray-token ------------------------------------------------------------------------------

def _ray_token(args: argparse.Namespace) -> int:
    from .cluster.ray_auth import make_token

    path, done = make_token()
    print(done, file=sys.stderr)  # what was done; the path alone on stdout, for scripts
    if path is not None:
        print(path)
    return 0


# -- completion -----------------------------------------------------------------------------

#: Arguments that name files (completed as paths by the shell).
_PATH_ARGS = ("job", "conf", "checkpoint", "to", "workspace")


def _completion(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ImportError:
        raise ParamError("shell completion needs shtab (pip install shtab)") from None
    parser = _parser()
    for action in _all_actions(parser):
        if action.dest in _PATH_ARGS:
            action.complete = shtab.FILE  # type: ignore[attr-defined]
    print(shtab.complete(parser, shell=args.shell))
    return 0


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    out = []
    for action in parser._actions:
        out.append(action)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _all_actions(sub)
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
