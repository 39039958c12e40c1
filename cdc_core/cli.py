"""The `cdc` command: checking, watching and operating pipelines, and the local demo.

Commands: doctor, status, validate, snapshot requests, accept-lost-position, retire, Debezium
import, local PostgreSQL, demo, workload.

Every command maps failures to the product's exit codes (0 done, 2 configuration or usage,
75 transient, 1 anything else) and prints one clear line on stderr; `--debug` adds the
traceback. Output whose reader went away (`cdc status | head -1`) ends the command quietly
with 141, as a SIGPIPE would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO, cast

from cdc_core.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CdcError,
    UsageError,
    first_line,
    text_of,
)

if TYPE_CHECKING:
    from cdc_core.config import Config
    from cdc_core.pg.doctor import Check

Command = Callable[[argparse.Namespace], int]
EXIT_SIGPIPE = 141  # 128 + SIGPIPE: how a shell reports a process its closed pipe ended
DEFAULT_PG_PORT = 5432  # a new local cluster's, and the demo's, preferred port


def guarded(command: Command, args: argparse.Namespace) -> int:
    """Run `command`, turning any failure into one stderr line and the right exit code."""
    debug = bool(getattr(args, "debug", False))
    output = _Output(sys.stdout)
    sys.stdout = cast(TextIO, output)
    try:
        code = command(args)
        output.flush()  # a write that fails does so here, not in the interpreter's exit
        return code
    except CdcError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the last line of defence: one line, not a wall of traceback
        if debug:
            traceback.print_exc()
        if isinstance(e, OSError) and e is output.failed:
            return _stdout_lost(e)
        from cdc_core.transient import as_transient, store_refusal

        known = as_transient(e) or store_refusal(e)  # a lost server: exit 75; refused: 1
        if known is not None:
            print(f"error: {known}", file=sys.stderr)
            return known.exit_code
        text = text_of(e)
        if text is None:  # a Py4J error whose JVM is gone: its text went with it
            text = "its text is lost with the Spark driver (JVM), which is gone"
        print(f"error: unexpected {type(e).__name__}: {text} (run with --debug for the traceback)",
              file=sys.stderr)  # fmt: skip
        return EXIT_FAILURE
    finally:
        sys.stdout = output.stream


class _Output:
    """Standard output, remembering the error a write or flush of it raised: which `OSError`s
    are the output's, not the command's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream: TextIO = stream.stream if isinstance(stream, _Output) else stream
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as e:
            self.failed = e
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as e:
            self.failed = e
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _stdout_lost(e: OSError) -> int:
    """A command whose output cannot be written: its reader went away (`cdc status | head -1`),
    which is no error of the command's, so it ends quietly, with the exit status of a process a
    SIGPIPE ended; or a full disk or a failing device, which one stderr line names. Standard
    output then points at /dev/null, or the interpreter's exit would fail on it again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    if isinstance(e, BrokenPipeError):
        return EXIT_SIGPIPE
    print(f"error: standard output cannot be written: {first_line(e)}", file=sys.stderr)
    return EXIT_FAILURE


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO-8601), level, logger, message[, exception]."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


def configure_logging(debug: bool = False) -> None:
    """Plain lines on a terminal; JSON lines otherwise (schedulers, log shippers).
    CDC_LOG_FORMAT=text or json chooses."""
    handler = logging.StreamHandler(sys.stderr)
    wanted = os.environ.get("CDC_LOG_FORMAT") or ("text" if sys.stderr.isatty() else "json")
    if wanted == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=[handler])
    for noisy in ("py4j", "psycopg"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not debug:  # PySpark logs every failed query as a JSON record; one line says it all
        logging.getLogger("DataFrameQueryContextLogger").setLevel(logging.CRITICAL)


def _doctor(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.pg.doctor import DoctorReport, format_report, run_doctor

    config = load_pipeline(args.pipeline, args.env)
    report = run_doctor(_with_dropped(config))
    retired = _retired_check(config)
    if retired is not None:  # the source may be fine; the pipeline still runs no more
        report = DoctorReport((retired, *report.checks))
    print(format_report(report, color=sys.stdout.isatty()))
    return EXIT_OK if report.ok else EXIT_USAGE


def _retired_check(config: Config) -> Check | None:
    """A failed line when `cdc retire` took the pipeline out of service (every run is refused
    then); None when it did not, or when the lake cannot be read (a run would say why)."""
    from cdc_core.lake import Lake
    from cdc_core.pg.doctor import Check
    from cdc_core.state import retired_file, retirement

    try:
        lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
        retired = retirement(lake)
    except (CdcError, OSError, ValueError) as e:
        logging.getLogger("cdc_core.cli").debug("the lake's retirement not read: %s", e)
        return None
    if retired is None:
        return None
    name = config.pipeline.name
    if not retired.done:
        fix = (f"cdc retire --pipeline {name} --yes finishes it; to keep the pipeline instead, "
               f"delete {retired_file(lake)}")  # fmt: skip
        return Check("retired", "fail", f"the pipeline is {retired.describe()}", fix)
    fix = (f"runs are refused; to run it again, delete {retired_file(lake)} (its stream "
           "position is gone: a new snapshot follows under snapshot.mode when_needed or "
           "always)")  # fmt: skip
    return Check("retired", "fail", f"the pipeline was {retired.describe()}", fix)


def _with_dropped(config: Config) -> Config:
    """`config` with the captured tables its lake found dropped at the source, as a run sees
    them (the doctor warns of them instead of failing); as it is when the source or the lake
    cannot be read (the doctor says why of the source)."""
    import psycopg

    from cdc_core import dropped
    from cdc_core.lake import Lake

    try:
        return dropped.found(config, Lake.of(config.pipeline.target.root, config.env.spark.conf),
                             save=False)  # fmt: skip
    except (CdcError, OSError, psycopg.Error) as e:
        logging.getLogger("cdc_core.cli").debug("dropped tables not looked for: %s", e)
        return config


def seconds(text: str) -> float:
    """An argparse type: a finite number (`nan` and `inf` are refused by name)."""
    value = float(text)  # a ValueError: argparse says "invalid seconds value: 'x'"
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0")
    return value


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 or more")
    return value


def _status(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.status import format_json, format_status, gather_status

    if args.stale_after <= 0:
        raise UsageError(f"cdc status: --stale-after {args.stale_after:g}: give seconds above 0")
    config = load_pipeline(args.pipeline, args.env)
    status = gather_status(config, stale_after_s=args.stale_after)
    print(format_json(status) if args.json else format_status(status))
    return status.exit_code


def _snapshot(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.identifiers import TableName
    from cdc_core.lake import Lake
    from cdc_core.pg.connect import connect
    from cdc_core.pg.discover import discover
    from cdc_core.snapshot import condition_problem, load_current
    from cdc_core.start import request_snapshot
    from cdc_core.state import check_owner, refuse_retired

    config = discover(load_pipeline(args.pipeline, args.env))
    tables = config.pipeline.source.tables
    try:
        table = TableName.parse(args.table)
    except ValueError as e:
        raise UsageError(f"cdc snapshot: --table {e}") from e
    if table not in tables:
        captured = ", ".join(str(t) for t in tables)
        raise UsageError(f"cdc snapshot: pipeline {args.pipeline} does not capture {table} "
                         f"(it captures {captured})")  # fmt: skip
    if args.where is not None:
        if not args.where.strip():  # an unset shell variable: not a request for every row
            raise UsageError("cdc snapshot: --where needs a condition (leave --where out to "
                             "read the whole table)")  # fmt: skip
        keys = config.pipeline.source.message_key_columns
        with connect(config.pipeline.source.dsn) as conn:
            problem = condition_problem(conn, table, args.where, keys)
        if problem:
            raise UsageError(f"cdc snapshot: {problem}")
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    check_owner(lake, config.pipeline.name)
    refuse_retired(lake, config.pipeline.name)  # no run would read the request
    path = request_snapshot(
        lake,
        table,
        args.where,
        args.blocking,
    )
    kind = "blocking" if args.blocking else "incremental"
    print(f"{kind} snapshot of {table} requested ({path}); the next run of pipeline "
          f"{args.pipeline} reads it")  # fmt: skip
    paused = [job.id for job in load_current(lake) if job.paused]
    if paused:  # the new one is not: it is read on the next run
        print(f"paused by a pause-snapshot signal, until a resume-snapshot one: "
              f"{', '.join(paused)}")  # fmt: skip
    return EXIT_OK


def _accept_lost_position(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.errors import TerminalError
    from cdc_core.lake import Lake
    from cdc_core.lost_position import forked_history, request_accept, stored_position
    from cdc_core.pg.connect import connect
    from cdc_core.pg.history import current_timeline
    from cdc_core.pg.slot import slot_state, system_identifier
    from cdc_core.start import holds_position
    from cdc_core.state import check_owner, read_stream, refuse_retired

    config = load_pipeline(args.pipeline, args.env)
    source = config.pipeline.source
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    check_owner(lake, config.pipeline.name)
    refuse_retired(lake, config.pipeline.name)  # no run would act on it
    stored = stored_position(lake)
    if stored is None:
        print(f"pipeline {args.pipeline} has no stored position yet: nothing to accept")
        return EXIT_OK
    with connect(source.dsn) as conn:
        slot, system = slot_state(conn, source.slot), system_identifier(conn)
        forked = forked_history(source.dsn, lake, current_timeline(conn))
    if forked is not None:
        raise TerminalError(
            f"pipeline {args.pipeline}: {forked}; going on without a snapshot cannot bring the "
            "lake in line: set snapshot.mode: when_needed and run again"
        )
    if holds_position(slot, read_stream(lake), system):
        print(f"slot {source.slot} still has the stored position {stored}: nothing to accept")
        return EXIT_OK
    path = request_accept(lake, source.slot, stored)
    print(f"recorded ({path}): no change was made after {stored}. The next run of pipeline "
          f"{args.pipeline} goes on from the slot's position (a lost or missing slot is "
          "created anew) without a snapshot; changes made after that position and before it "
          "are not read")  # fmt: skip
    return EXIT_OK


def _retire(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.lake import Lake
    from cdc_core.retire import carry_out, plan
    from cdc_core.run_lock import run_lock
    from cdc_core.state import check_owner

    config = load_pipeline(args.pipeline, args.env)
    lake = Lake.of(config.pipeline.target.root, config.env.spark.conf)
    check_owner(lake, config.pipeline.name)
    with run_lock(lake, config.pipeline.name):  # no run of the pipeline is under way meanwhile
        planned = plan(config, lake, drop_publication=args.drop_publication)
        print("\n".join(planned.lines()))
        if not args.yes:
            raise UsageError(f"cdc retire: nothing was changed; run it again with --yes to "
                             f"retire pipeline {args.pipeline}")  # fmt: skip
        print("\n".join(carry_out(config, lake, planned)))
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    from cdc_core.config import load_pipeline
    from cdc_core.identifiers import TableName
    from cdc_core.pg.discover import discover

    config = _with_dropped(discover(load_pipeline(args.pipeline, args.env)))  # none to compare
    captured = config.pipeline.source.tables
    tables = []
    for text in args.table or []:
        try:
            table = TableName.parse(text)
        except ValueError as e:
            raise UsageError(f"cdc validate: --table {e}") from e
        if table not in captured:
            raise UsageError(f"cdc validate: pipeline {args.pipeline} does not capture {table} "
                             f"(it captures {', '.join(str(t) for t in captured)})")  # fmt: skip
        tables.append(table)
    if args.settle < 0 or args.max_keys < 0:
        raise UsageError("cdc validate: --settle and --max-keys take 0 or more")

    from cdc_core.spark import build_spark
    from cdc_core.validate import Options, validate
    from cdc_core.validate_report import format_json, format_report

    spark = build_spark(
        config.env.spark, f"cdc-validate-{config.pipeline.name}", root=config.pipeline.target.root
    )
    options = Options(tuple(tables), args.settle, args.max_keys, quality=not args.no_quality)
    report = validate(config, spark, options)
    print(format_json(report) if args.json else format_report(report))
    return report.exit_code


def _import_debezium(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cdc_core.config.debezium_file import import_connector

    output = Path(args.output) if args.output else None
    print(import_connector(Path(args.file), args.name, output, args.force))
    return EXIT_OK


def _port(text: str) -> int:
    """A TCP port, for argparse (which exits 2 naming the option otherwise)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _pg(args: argparse.Namespace) -> int:
    from cdc_core.pg.local import ensure_cluster, find_cluster, home_dir

    if args.action == "start":
        new = find_cluster(args.name) is None
        port = args.port or (DEFAULT_PG_PORT if new else None)
        cluster = ensure_cluster(args.name, port=port)
        print(f"PostgreSQL running: {cluster.dsn()}")
        print(f"data {cluster.data_dir}, log {cluster.log_file}")
        return EXIT_OK
    found = find_cluster(args.name)
    if found is None:
        print(f"no local cluster named {args.name!r} in {home_dir()}")
        return EXIT_FAILURE if args.action == "status" else EXIT_OK
    if args.action == "status":
        running = found.running()
        state = "running" if running else "stopped"
        print(f"{args.name}: {state} on {found.dsn()} ({found.data_dir})")
        return EXIT_OK if running else EXIT_FAILURE
    if args.action == "stop":
        found.stop()
    else:
        found.destroy()
    print(f"{args.name}: {'stopped' if args.action == 'stop' else 'destroyed'}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from cdc_core.demo import run_demo

    return run_demo(port=args.port, changes=args.changes, lake=args.lake)


def _workload(args: argparse.Namespace) -> int:
    from cdc_core.sample.workload import WorkloadSpec, run_workload

    if args.changes is None and args.duration is None:
        raise UsageError("cdc workload: give --changes N or --duration SECONDS")
    spec = WorkloadSpec(
        changes=args.changes, duration_s=args.duration, rate=args.rate,
        concurrency=args.concurrency, seed=args.seed,
    )  # fmt: skip
    stats = run_workload(args.dsn, spec)
    print(stats)
    return EXIT_OK


def _pipeline_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, run: Command, summary: str
) -> argparse.ArgumentParser:
    """A command about one pipeline: `--pipeline NAME [--env ENV]`, then its own arguments."""
    p = sub.add_parser(name, help=summary)
    p.add_argument("--pipeline", required=True, help="pipeline name (pipelines/NAME.yaml)")
    p.add_argument("--env", default="local", help="environment (conf/ENV.yaml), default local")
    p.set_defaults(run=run)
    return p


def _add_import_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "import-debezium", help="write a pipeline file from a Debezium connector configuration"
    )
    p.add_argument(
        "file", metavar="FILE",
        help="the connector's JSON (as POSTed to Kafka Connect, or its config object) or "
        ".properties",
    )  # fmt: skip
    p.add_argument("--name", default=None,
                   help="pipeline name, default topic.prefix (made a valid name)")  # fmt: skip
    p.add_argument("--output", default=None, metavar="PATH",
                   help="the pipeline file to write, default pipelines/NAME.yaml")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(run=_import_debezium)


def _add_accept_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _pipeline_command(
        sub, "accept-lost-position", _accept_lost_position,
        "after a drain (writes stopped, e.g. for pg_upgrade): go on from a new slot without a "
        "snapshot when the stored position is gone",
    )  # fmt: skip


def _add_retire_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = _pipeline_command(
        sub, "retire", _retire,
        "take a pipeline out of service: drop its slot (and publication), keep its lake, refuse "
        "later runs",
    )  # fmt: skip
    p.add_argument(
        "--drop-publication",
        action="store_true",
        help="drop the publication too (only if no other pipeline reads through it)",
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="do it; without it, show what would be dropped and lost (exit 2)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _pipeline_command(sub, "doctor", _doctor, "check that the source is ready for a pipeline")

    p = _pipeline_command(
        sub, "status", _status, "slot, last batch, tables and pending work of a pipeline"
    )
    p.add_argument("--json", action="store_true", help="one JSON object, for machines")
    p.add_argument(
        "--stale-after", type=seconds, default=3600.0, metavar="SECONDS",
        help="a pipeline whose last batch ended longer ago is stale (exit 1), default 3600",
    )  # fmt: skip

    p = _pipeline_command(
        sub, "snapshot", _snapshot, "request a snapshot of a table for the next run"
    )
    p.add_argument("--table", required=True, help="a captured table, schema.name")
    p.add_argument("--where", default=None, help="read only rows matching this SQL condition")
    p.add_argument(
        "--blocking",
        action="store_true",
        help="a blocking snapshot (Debezium's type=blocking) instead of incremental",
    )

    _add_accept_parser(sub)
    _add_retire_parser(sub)

    p = _pipeline_command(
        sub, "validate", _validate, "prove each silver mirror equals its source; data quality"
    )
    p.add_argument("--table", action="append", metavar="T",
                   help="only this captured table, schema.name (repeatable)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object, for machines")
    p.add_argument(
        "--settle", type=seconds, default=0.0, metavar="SECONDS",
        help="compare keys that may differ by lag again (while ingest runs) for up to this long",
    )  # fmt: skip
    p.add_argument("--max-keys", type=int, default=100, metavar="N",
                   help="differing keys listed per table (default 100)")  # fmt: skip
    p.add_argument("--no-quality", action="store_true",
                   help="skip the great-expectations suites (parity only)")  # fmt: skip

    _add_import_parser(sub)

    p = sub.add_parser("pg", help="the local PostgreSQL cluster used by the demo")
    p.add_argument("action", choices=["start", "stop", "status", "destroy"])
    p.add_argument("--name", default="demo", help="cluster name, default demo")
    p.add_argument("--port", type=_port, help="preferred port when starting (default: the "
                   f"cluster's own; {DEFAULT_PG_PORT} for a new one)")  # fmt: skip
    p.set_defaults(run=_pg)

    p = sub.add_parser("demo", help="start a local PostgreSQL with the shop data and run orders")
    p.add_argument("--port", type=_port, default=DEFAULT_PG_PORT,
                   help=f"preferred port, default {DEFAULT_PG_PORT}")  # fmt: skip
    p.add_argument("--changes", type=int, default=2000, help="workload changes before ingest")
    p.add_argument("--lake", default="./lake", help="lake root, default ./lake")
    p.set_defaults(run=_demo)

    p = sub.add_parser("workload", help="write realistic traffic into a shop database")
    p.add_argument("--dsn", required=True, help="connection string of the shop database")
    p.add_argument("--changes", type=positive, default=None,
                   help="stop after about N row changes")  # fmt: skip
    p.add_argument("--duration", type=positive_seconds, default=None,
                   help="stop after S seconds")  # fmt: skip
    p.add_argument("--rate", type=positive_seconds, default=None, help="row changes per second")
    p.add_argument("--concurrency", type=positive, default=3, help="interleaved transactions")
    p.add_argument("--seed", type=int, default=1)
    p.set_defaults(run=_workload)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    configure_logging(args.debug)
    result: int = guarded(args.run, args)
    return result


if __name__ == "__main__":
    sys.exit(main())
