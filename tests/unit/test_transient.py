"""Failures that may pass by themselves become TransientError (exit 75); real bugs stay exit 1.

The Spark side is stood in for by objects shaped like Py4J's: the real ones need a JVM (the
integration tier meets them, tests/integration/test_server_faults.py)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import psycopg
import pytest

from cdc_core import snapshot_read
from cdc_core.cli import guarded
from cdc_core.errors import EXIT_FAILURE, EXIT_TRANSIENT, TerminalError, TransientError
from cdc_core.identifiers import TableName
from cdc_core.pg.replication import decoding_missed_publication, publication_missing
from cdc_core.transient import as_transient, transient_failures


class JavaThrowable:
    """A Py4J proxy of a Java exception: class name, SQLState (PSQLException only), cause;
    the methods keep Java's names."""

    def __init__(self, name: str, message: str, state: str | None = None,
                 cause: JavaThrowable | None = None) -> None:  # fmt: skip
        self.name, self.message, self.state, self.cause = name, message, state, cause

    def getClass(self) -> JavaThrowable:
        return self

    def getName(self) -> str:
        return self.name

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> JavaThrowable | None:
        return self.cause

    def getSQLState(self) -> str | None:
        if self.state is None:
            raise RuntimeError("Method getSQLState([]) does not exist")
        return self.state


class Py4JJavaError(Exception):
    def __init__(self, text: str, java: JavaThrowable | None) -> None:
        super().__init__(text)
        self.java_exception = java


def _spark_job_failure(message: str, state: str) -> Py4JJavaError:
    psql = JavaThrowable("org.postgresql.util.PSQLException", message, state)
    job = JavaThrowable("org.apache.spark.SparkException", "Job aborted due to stage failure", None, psql)  # fmt: skip
    text = (
        "An error occurred while calling o57.save.\n: org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, most recent failure: "
        f"Lost task 0.0 (TID 0) (executor driver): org.postgresql.util.PSQLException: {message}\n"
        "\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2733)"
    )
    return Py4JJavaError(text, job)


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
         "a query on the source ran past source.query_timeout_s"),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
         "not granted within lock_timeout"),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
         "the server is shutting down"),
        (psycopg.errors.CannotConnectNow("the database system is starting up"),
         "the server is starting up"),
        (psycopg.OperationalError("consuming input failed: server closed the connection"),
         "the connection to PostgreSQL was lost"),
    ],
)  # fmt: skip
def test_a_psycopg_failure_that_may_pass_is_transient(error: psycopg.Error, says: str) -> None:
    mapped = as_transient(error)
    assert isinstance(mapped, TransientError)
    assert says in str(mapped)
    assert str(error) in str(mapped)
    assert "the next run resumes where this one stopped" in str(mapped)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UndefinedTable('relation "t" does not exist'),
        psycopg.errors.UndefinedObject('publication "p" does not exist'),
        psycopg.errors.ObjectNotInPrerequisiteState(
            "logical decoding requires wal_level >= logical"
        ),
        psycopg.errors.DiskFull("could not extend file"),
        psycopg.ProgrammingError("the query has 1 placeholder but 2 parameters were passed"),
        ValueError("a bug"),
        KeyError("state"),
        OSError(  # pyarrow's S3 client: no retry makes a bucket
            "When uploading object with key 'p/_state/stream.json' in bucket 'nope': AWS Error "
            "NO_SUCH_BUCKET during PutObject operation: The specified bucket does not exist"
        ),
        OSError(
            "When getting information for key 'p/_state': AWS Error ACCESS_DENIED during "
            "HeadObject operation: No response body."
        ),
    ],
)
def test_a_failure_retrying_will_not_fix_is_left_alone(error: Exception) -> None:
    assert as_transient(error) is None


def test_an_object_store_that_does_not_answer_is_transient() -> None:
    """pyarrow's S3 client, for the driver's own files: the store down was exit 1, `unexpected
    OSError`, which a scheduler does not retry."""
    error = OSError(
        "When reading information for key 'y/_state/batches/latest.json' in bucket 'lake': AWS "
        "Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Couldn't connect to "
        "server"
    )
    mapped = as_transient(error)
    assert mapped is not None
    assert mapped.exit_code == 75
    assert str(mapped).startswith("the object store did not answer (NETWORK_CONNECTION): When")
    assert as_transient(OSError("AWS Error SLOW_DOWN during PutObject operation")) is not None


def test_a_spark_jdbc_read_cancelled_by_statement_timeout_is_transient_by_its_sqlstate() -> None:
    mapped = as_transient(_spark_job_failure("ERROR: canceling statement due to statement timeout", "57014"))  # fmt: skip
    assert str(mapped) == (
        "a query on the source ran past source.query_timeout_s (or was cancelled by a cancel "
        "request): a lock another session holds, or a busy server, may be why; if the query is "
        "merely slow, raise source.query_timeout_s (0: no limit): Spark JDBC read: ERROR: "
        "canceling statement due to "
        "statement timeout [SQLSTATE 57014]; safe to retry: the next run resumes where this one "
        "stopped"
    )


def test_a_spark_jdbc_connection_refused_is_transient() -> None:
    message = "Connection to 127.0.0.1:5432 refused. Check that the hostname and port are correct"
    mapped = as_transient(_spark_job_failure(message, "08001"))
    assert mapped is not None
    assert "the connection to PostgreSQL was lost: Spark JDBC read: Connection to" in str(mapped)
    assert "[SQLSTATE 08001]" in str(mapped)


def test_without_the_jvm_the_sqlstate_is_found_from_the_driver_text() -> None:
    error = _spark_job_failure("FATAL: terminating connection due to administrator command", "57P01")  # fmt: skip
    error.java_exception = None  # the JVM is gone: only the text is left
    mapped = as_transient(error)
    assert mapped is not None
    assert "the server is shutting down" in str(mapped)
    assert "[SQLSTATE 57P01]" in str(mapped)
    assert "QueryExecutorImpl" not in str(mapped)  # the driver's line, not its stack


def test_a_chunk_readers_lock_timeout_carries_its_sqlstate_by_the_jvm_or_the_text() -> None:
    error = _spark_job_failure("ERROR: canceling statement due to lock timeout", "55P03")
    mapped = as_transient(error)
    assert mapped is not None
    assert mapped.sqlstate == "55P03"  # what a snapshot read gives way on
    error.java_exception = None
    from_text = as_transient(error)
    assert from_text is not None
    assert from_text.sqlstate == "55P03"


def test_a_spark_jdbc_error_retrying_will_not_fix_is_left_alone() -> None:
    error = _spark_job_failure('ERROR: relation "t" does not exist', "42P01")
    assert as_transient(error) is None
    error.java_exception = None
    assert as_transient(error) is None


def test_a_spark_failure_with_no_postgresql_cause_is_left_alone() -> None:
    job = JavaThrowable("org.apache.spark.SparkException", "Task failed while writing rows")
    assert as_transient(Py4JJavaError("An error occurred while calling o1.save.", job)) is None


def test_a_wrapped_cause_is_found_and_a_product_error_keeps_its_verdict() -> None:
    wrapped = RuntimeError("reading the key bounds failed")
    wrapped.__cause__ = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    assert isinstance(as_transient(wrapped), TransientError)
    terminal = TerminalError("slot is lost")
    terminal.__cause__ = psycopg.OperationalError("server closed the connection")
    assert as_transient(terminal) is None


def test_transient_failures_re_raises_as_transient_from_the_original() -> None:
    original = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    with pytest.raises(TransientError) as raised, transient_failures():
        raise original
    assert raised.value.__cause__ is original
    with pytest.raises(ValueError, match="a bug stays a bug"), transient_failures():
        raise ValueError("a bug stays a bug")


def test_guarded_exits_75_for_a_timeout_and_1_for_a_bug(capsys: pytest.CaptureFixture[str]) -> None:
    def timed_out(_: argparse.Namespace) -> int:
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    def buggy(_: argparse.Namespace) -> int:
        raise ValueError("a bug")

    assert guarded(timed_out, argparse.Namespace()) == EXIT_TRANSIENT
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: a query on the source ran past source.query_timeout_s")
    assert guarded(buggy, argparse.Namespace()) == EXIT_FAILURE
    assert "error: unexpected ValueError: a bug" in capsys.readouterr().err


def test_guarded_names_each_java_exception_of_a_failed_job_without_its_frames(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = (
        "An error occurred while calling o412.execute.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 9.0"
        " failed 1 times, most recent failure: Lost task 0.0 (TID 9) (executor driver):"
        " java.lang.VirtualMachineError: Out of space in CodeCache for adapters\n"
        "\tat org.apache.spark.sql.catalyst.expressions.GeneratedClass.generate(Unknown Source)\n"
        "\tat java.base/java.lang.Thread.run(Thread.java:840)\n"
        "\n"
        "Driver stacktrace:\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)\n"
        "Caused by: java.lang.VirtualMachineError: Out of space in CodeCache for adapters\n"
        "\tat org.apache.spark.sql.catalyst.expressions.GeneratedClass.generate(Unknown Source)\n"
        "\t... 41 more\n"
    )  # fmt: skip

    def command(_: argparse.Namespace) -> int:
        raise Py4JJavaError(text, None)

    assert guarded(command, argparse.Namespace()) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "\tat " not in err
    assert "more" not in err
    assert "Driver stacktrace" not in err
    assert err.startswith("error: unexpected Py4JJavaError: An error occurred while calling o412")
    assert ": org.apache.spark.SparkException: Job aborted due to stage failure" in err
    assert "Caused by: java.lang.VirtualMachineError: Out of space in CodeCache for adapters" in err
    assert err.rstrip().endswith("(run with --debug for the traceback)")


def test_a_delta_commit_conflict_is_transient_by_its_class_or_its_text() -> None:
    conflict = JavaThrowable(
        "io.delta.exceptions.ConcurrentAppendException",
        "Files were added to the root of the table by a concurrent update. Please try the "
        "operation again.\nConflicting commit: {...}",
    )
    mapped = as_transient(Py4JJavaError("An error occurred while calling o90.execute.", conflict))
    assert str(mapped) == (
        "a concurrent writer committed to the same Delta table first: ConcurrentAppendException: "
        "Files were added to the root of the table by a concurrent update. Please try the "
        "operation again.; safe to retry: the next run resumes where this one stopped"
    )
    text = "An error occurred.\n: io.delta.exceptions.MetadataChangedException: The metadata of the Delta table has been changed by a concurrent update."  # fmt: skip
    assert "MetadataChangedException" in str(as_transient(Py4JJavaError(text, None)))
    other = JavaThrowable("io.delta.exceptions.DeltaAnalysisException", "not a Delta table")
    assert as_transient(Py4JJavaError("An error occurred.", other)) is None


class Py4JNetworkError(Exception):
    """Py4J's own: the JVM stopped answering."""


class JvmGoneError(Exception):
    """A Py4J error whose text must be asked of a JVM that is gone."""

    def __str__(self) -> str:
        raise ConnectionRefusedError(111, "Connection refused")

    __module__ = "py4j.protocol"


class SparkJobError(Exception):
    """PySpark's captured form of a failed job."""

    __module__ = "pyspark.errors.exceptions.captured"


def test_a_driver_that_died_is_told_from_a_failure_that_did_not_kill_it() -> None:
    from cdc_core.spark import driver_died

    gone = JvmGoneError()
    assert driver_died(gone)
    wrapped = RuntimeError("while writing bronze")
    wrapped.__cause__ = Py4JNetworkError("Answer from Java side is empty")
    assert driver_died(wrapped)
    assert driver_died(SparkJobError("Job aborted: java.lang.OutOfMemoryError: Java heap space"))
    assert not driver_died(SparkJobError("Job aborted: Task failed while writing rows"))
    assert not driver_died(ValueError("java.lang.OutOfMemoryError"))  # not from Spark
    assert not driver_died(_spark_job_failure("ERROR: canceling statement", "57014"))


class StoppingContext:
    """A SparkContext's JVM side as `driver_dying` probes it: `sc().isStopped()` answers
    False `alive` times, then True (the JVM's shutdown stopped it), or raises (the gateway
    is gone) when `gone`."""

    def __init__(self, alive: int, *, gone: bool = False) -> None:
        self.alive, self.gone, self.asked = alive, gone, 0
        self._jsc = self

    @property
    def sparkContext(self) -> StoppingContext:
        return self

    def sc(self) -> StoppingContext:
        return self

    def isStopped(self) -> bool:
        self.asked += 1
        if self.gone:
            raise ConnectionRefusedError(111, "Connection refused")
        return self.asked > self.alive


def test_a_spark_error_while_the_jvm_shuts_down_is_the_driver_dying() -> None:
    """A task's OutOfMemoryError exits the JVM; its shutdown stops the SparkContext first, so
    the job in hand can fail with an error that does not name the cause while the JVM still
    answers. Such an error is the driver dying when the context stops within the grace time."""
    from cdc_core.spark import driver_dying

    cancelled = SparkJobError("Job 7 cancelled because SparkContext was shut down")
    context = StoppingContext(alive=2)  # stops on the third look, 0.4 s in
    assert driver_dying(cancelled, lambda: context, grace_s=2.0)
    assert context.asked == 3
    assert driver_dying(cancelled, lambda: StoppingContext(0, gone=True))
    alive = StoppingContext(alive=10**6)  # a Spark error that left the driver running
    assert not driver_dying(cancelled, lambda: alive, grace_s=0.5)
    assert 2 <= alive.asked <= 5
    untouched = StoppingContext(alive=0)
    assert not driver_dying(ValueError("not from Spark"), lambda: untouched)
    assert untouched.asked == 0  # not probed: no Spark error in its chain
    oom = SparkJobError("Job aborted: java.lang.OutOfMemoryError: Java heap space")
    assert driver_dying(oom, lambda: untouched)
    assert untouched.asked == 0


def test_guarded_says_the_driver_is_gone_when_an_error_s_text_went_with_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def command(_: argparse.Namespace) -> int:
        raise JvmGoneError()

    assert guarded(command, argparse.Namespace()) == EXIT_FAILURE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: unexpected JvmGoneError: its text is lost with the Spark driver (JVM), which is "
        "gone (run with --debug for the traceback)"
    ]


DECODING = 'slot "s", output plugin "pgoutput", in the change callback, associated LSN 0/15037C0'


@pytest.mark.parametrize(
    ("state", "context", "missed"),
    [
        ("42704", DECODING, True),  # publication "p" does not exist, met decoding a change
        ("42704", None, False),  # replication slot "s" does not exist: no decoding context
        ("42P01", DECODING, False),
        ("57P01", None, False),  # an administrator ended the walsender: a retry may work
    ],
)  # fmt: skip
def test_a_publication_missing_while_decoding_is_told_by_its_state_and_context(
    state: str, context: str | None, missed: bool
) -> None:
    assert decoding_missed_publication(state, context) is missed


def test_a_missing_publication_stops_for_good_naming_it_and_the_way_out() -> None:
    error = publication_missing("s", "p", 'publication "p" does not exist')
    assert isinstance(error, TerminalError)
    assert as_transient(error) is None
    assert str(error).startswith("publication 'p' (source.publication) did not exist")
    assert "SELECT pg_drop_replication_slot('s')" in str(error)
    assert "snapshot.mode: when_needed" in str(error)


def test_a_read_that_gave_way_every_time_says_what_it_gave_way_to_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts = []

    def blocked(*args: object, **kwargs: object) -> None:
        attempts.append(1)
        with snapshot_read._giving_way():  # where Spark's reader hits its lock_timeout
            raise _spark_job_failure("ERROR: canceling statement due to lock timeout", "55P03")

    monkeypatch.setattr(snapshot_read, "_read_group", blocked)
    monkeypatch.setattr(snapshot_read.time, "sleep", lambda seconds: None)
    read = SimpleNamespace(table=TableName("public", "items"), group=2)
    with pytest.raises(TransientError) as raised:
        snapshot_read.read_group(None, None, None, read, catch_up=None)  # type: ignore[arg-type]
    assert len(attempts) == 5
    assert str(raised.value) == (
        "snapshot of public.items: group 3 gave way 5 times to a lock request queued behind its "
        "read (an ALTER TABLE, TRUNCATE or VACUUM FULL of the table, or a LOCK TABLE): Spark JDBC "
        "read: ERROR: canceling statement due to lock timeout [SQLSTATE 55P03]; the next run "
        "reads it again"
    )
    assert raised.value.sqlstate == "55P03"
    assert caplog.text.count("the read gave way to it and starts again") == 4


def _s3a_failure(with_jvm: bool) -> Py4JJavaError:
    """Delta's save of bronze with the store gone quiet, as the s3a connector reports it."""
    said = ("getFileStatus on s3a://lake/p/bronze/_delta_log: software.amazon.awssdk.core."
            "exception.SdkClientException: Unable to execute HTTP request: The target server "
            "failed to respond")  # fmt: skip
    eof = JavaThrowable("org.apache.hadoop.fs.s3a.HttpChannelEOFException", said)
    text = ("An error occurred while calling o147.save.\n: org.apache.hadoop.fs.s3a."
            f"HttpChannelEOFException: {said}\n\tat org.apache.hadoop.fs.s3a.impl."
            "ErrorTranslation.maybeExtractChannelException(ErrorTranslation.java:200)")  # fmt: skip
    return Py4JJavaError(text, eof if with_jvm else None)


@pytest.mark.parametrize("with_jvm", [True, False])
def test_spark_finding_the_object_store_not_answering_is_transient(with_jvm: bool) -> None:
    """s3a's failures in Spark's stage (bronze, silver) were exit 1, `unexpected Py4JJavaError`:
    only pyarrow's, the driver's own files, were known to pass by themselves."""
    mapped = as_transient(_s3a_failure(with_jvm))
    assert mapped is not None
    assert mapped.exit_code == EXIT_TRANSIENT
    assert str(mapped).startswith(
        "the object store did not answer Spark (HttpChannelEOFException): getFileStatus on s3a://"
    )
    assert "ErrorTranslation" not in str(mapped)


def test_a_jdbc_read_refused_by_the_network_stays_the_source_s_failure() -> None:
    message = "Connection to 127.0.0.1:5432 refused. Check that the hostname and port are correct"
    error = _spark_job_failure(message, "08001")
    error.java_exception = None
    error.args = (f"{error.args[0]}\nCaused by: java.net.ConnectException: Connection refused",)
    mapped = as_transient(error)
    assert mapped is not None
    assert "the connection to PostgreSQL was lost" in str(mapped)


@pytest.mark.parametrize(
    "error",
    [
        OSError("When uploading object with key 'p/_state/run.holder.json' in bucket 'lake': AWS "
                "Error ACCESS_DENIED during PutObject operation: Access Denied"),
        Py4JJavaError("An error occurred while calling o88.save.\n: java.nio.file."
                      "AccessDeniedException: s3a://lake/p/bronze/_delta_log: getFileStatus on "
                      "s3a://lake/p/bronze/_delta_log: Forbidden (Service: S3, Status Code: 403)",
                      None),
    ],
)  # fmt: skip
def test_a_store_refusing_the_credentials_says_so_and_exits_1(
    error: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    """Credentials that may read the bucket but not write it: `unexpected OSError`, as a bug."""

    def command(_: argparse.Namespace) -> int:
        raise error

    assert guarded(command, argparse.Namespace()) == EXIT_FAILURE
    said = capsys.readouterr().err
    assert said.startswith("error: the object store refused these credentials what the job asked")
    assert "An error occurred" not in said  # the store's own line, not Py4J's first
    assert "ACCESS_DENIED" in said or "AccessDeniedException: s3a://lake" in said
    assert "unexpected" not in said
    assert as_transient(error) is None


def test_a_missing_bucket_or_a_local_folder_refused_is_not_a_refusal_of_the_credentials() -> None:
    from cdc_core.transient import store_refusal

    assert store_refusal(OSError("AWS Error NO_SUCH_BUCKET during HeadBucket")) is None
    local = Py4JJavaError("An error occurred while calling o9.save.\n: java.nio.file."
                          "AccessDeniedException: /lake/bronze/_delta_log", None)  # fmt: skip
    assert store_refusal(local) is None
