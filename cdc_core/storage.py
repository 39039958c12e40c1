"""Where the lake's own files live (`_staging/`, `_state/`): a local directory or an object store.

Bronze and silver are Delta tables that Spark reaches by URI on any file system; the staged
change files and the state documents are written by the driver's Python. For a local root they
are `pathlib.Path`s, written with fsync and rename. For an `s3a://bucket/prefix` root they are
`ObjectPath`s: the few path operations the product uses, through pyarrow's S3 client, with the
same settings Spark's s3a connector takes (`spark.hadoop.fs.s3a.*` in the environment file).

Atomicity on an object store: a document is written from memory in one request (an object
appears whole or not at all); a staged file is written under `_staging/tmp/`, then copied to its
final name and the temporary object deleted, so a reader never sees half of one. An `ObjectPath`
has no `__fspath__`: a stray `os` call on one fails instead of writing a local file.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_core.errors import CdcError, TerminalError, TransientError, first_line

if TYPE_CHECKING:
    import pyarrow.fs as pafs

OBJECT_SCHEMES = ("s3a",)
_S3A = "spark.hadoop.fs.s3a."


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store, read from Spark's s3a settings (one place to set)."""

    endpoint: str | None = None  # http://127.0.0.1:9000; None: AWS
    region: str | None = None
    access_key: str | None = None  # None: the AWS default chain (environment, profile, role)
    secret_key: str | None = None
    session_token: str | None = None
    ssl: bool = True

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], bucket: str | None = None) -> S3Options:
        """From `spark.hadoop.fs.s3a.*` (a `bucket.<b>.` setting wins over the general one)."""

        def get(key: str) -> str | None:
            if bucket:
                value = conf.get(f"{_S3A}bucket.{bucket}.{key}")
                if value:
                    return str(value)
            value = conf.get(f"{_S3A}{key}")
            return str(value) if value else None

        ssl = (get("connection.ssl.enabled") or "true").lower() != "false"
        return cls(
            get("endpoint"), get("endpoint.region"), get("access.key"), get("secret.key"),
            get("session.token"), ssl,
        )  # fmt: skip

    def __repr__(self) -> str:  # never the secret
        return f"S3Options(endpoint={self.endpoint!r}, region={self.region!r})"


@functools.lru_cache(maxsize=8)
def s3_filesystem(options: S3Options) -> pafs.S3FileSystem:
    """One client per set of options, for the process."""
    import pyarrow.fs as pafs

    kwargs: dict[str, object] = {
        "region": options.region or os.environ.get("AWS_REGION") or "us-east-1",
        "connect_timeout": 10,
        "request_timeout": 60,
        # an object smaller than a part goes in one PutObject at close, not a multipart
        # upload begun at open: a state document is one request, and a run killed while
        # writing one leaves no incomplete upload behind (errors still come, at close)
        "allow_delayed_open": True,
    }
    if options.endpoint:
        scheme, sep, host = options.endpoint.partition("://")
        kwargs["endpoint_override"] = host if sep else scheme
        kwargs["scheme"] = scheme if sep else ("https" if options.ssl else "http")
    if options.access_key and options.secret_key:
        kwargs |= {"access_key": options.access_key, "secret_key": options.secret_key}
        if options.session_token:
            kwargs["session_token"] = options.session_token
    return pafs.S3FileSystem(**kwargs)


@dataclass(frozen=True)
class Stat:
    st_size: int
    st_mtime: float


@dataclass(frozen=True)
class ObjectPath:
    """An object (or a prefix) in a bucket: `scheme://bucket/key`."""

    scheme: str
    key: str  # bucket/key, no leading or trailing slash
    options: S3Options

    @classmethod
    def parse(cls, uri: str, options: S3Options) -> ObjectPath:
        scheme, sep, rest = uri.partition("://")
        if not sep or scheme not in OBJECT_SCHEMES or not rest.strip("/"):
            raise ValueError(
                f"{uri!r} is not an object store location ({', '.join(OBJECT_SCHEMES)})"
            )
        return cls(scheme, rest.strip("/"), options)

    @property
    def fs(self) -> pafs.S3FileSystem:
        return s3_filesystem(self.options)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"  # what Spark reads

    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(self.scheme, f"{self.key}/{name.strip('/')}", self.options)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.scheme, self.key.rpartition("/")[0] or self.key, self.options)

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def read_bytes(self) -> bytes:
        """The object's content; FileNotFoundError when there is none."""
        with self.fs.open_input_stream(self.key) as f:
            data: bytes = f.read()
            return data

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def _info(self) -> pafs.FileInfo:

        info: pafs.FileInfo = self.fs.get_file_info(self.key)
        return info

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return bool(self._info().type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        return bool(self._info().type == pafs.FileType.File)

    def is_dir(self) -> bool:
        import pyarrow.fs as pafs

        return bool(self._info().type == pafs.FileType.Directory)

    def stat(self) -> Stat:
        info = self._info()
        if not info.is_file:
            raise FileNotFoundError(str(self))
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        return Stat(int(info.size or 0), mtime)

    def iterdir(self) -> Iterator[ObjectPath]:
        """The objects and prefixes right under this prefix (none when it has none)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.key, allow_not_found=True, recursive=False)
        for info in self.fs.get_file_info(selector):
            yield self / info.base_name

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Names right under this prefix matching `pattern` (no `/` or `**` in it)."""
        return (p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern))

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: prefixes exist while objects are under them."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def write_bytes(self, data: bytes) -> None:
        """Create or replace the object with `data`, written from memory: whole or not at all."""
        with self.fs.open_output_stream(self.key) as f:
            f.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())


Location = Path | ObjectPath
"""A file or folder of the lake's own: local, or on an object store."""


def store_problem(root: Location) -> CdcError | None:
    """Why the object store holding `root` cannot be read: its bucket missing (or hidden from
    these credentials), or the store not answering (a `TransientError`); None for a local root
    and a readable store (an empty lake included). Listing a missing bucket finds nothing, as
    in an empty lake, and a first write failed with an `unexpected OSError`."""
    from cdc_core.transient import as_transient

    if not isinstance(root, ObjectPath):
        return None
    bucket = root.key.partition("/")[0]
    try:
        found = ObjectPath(root.scheme, bucket, root.options).is_dir()
    except OSError as e:
        why = f"the object store holding {root} cannot be read: {first_line(e)}"
        return TransientError(why) if as_transient(e) else TerminalError(why)
    if found:
        return None
    return TerminalError(
        f"bucket {bucket} of {root} does not exist, or these credentials cannot see it"
    )


def bucket_of(uri: str) -> str | None:
    """The bucket of an object store URI (`s3a://bucket/key` -> `bucket`), None for others."""
    scheme, sep, rest = uri.partition("://")
    return rest.strip("/").partition("/")[0] if sep and scheme in OBJECT_SCHEMES else None


def plain_location(uri: str) -> str:
    """A location as one spelling: `file:/x`, `file:///x` and `/x/` are `/x` (a catalog's
    table locations come with `file:`); object store URIs keep their scheme."""
    for prefix in ("file://", "file:"):
        if uri.startswith(prefix):
            uri = uri[len(prefix) :]
            break
    return uri.rstrip("/") or "/"


def location(root: str, options: S3Options | None = None) -> Location:
    """The lake root `root` as a location: a local path (plain or `file:`), or an object path."""
    scheme, sep, rest = root.partition("://")
    if not sep:
        return Path(root)
    if scheme == "file":
        return Path(rest)
    if scheme in OBJECT_SCHEMES:
        return ObjectPath.parse(root, options or S3Options.from_spark_conf({}, bucket_of(root)))
    raise TerminalError(
        f"target.root {root!r}: the {scheme}:// file system is not supported for the lake's own "
        f"files (_staging, _state); use a local path, file:, or {', '.join(OBJECT_SCHEMES)}://"
    )


def write_atomic(path: Location, data: bytes) -> None:
    """Replace the file at `path` in one step, durably: a reader sees the old or the new bytes."""
    if isinstance(path, ObjectPath):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_for(path)
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def temporary_for(path: Path) -> Path:
    """The name a local file is written under before it replaces `path` in one step."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def publish(tmp: Location, final: Location) -> None:
    """Give a finished file its final name, durably and all at once. Locally a rename (and the
    folders fsynced); on an object store a server-side copy, then the temporary object goes."""
    if isinstance(tmp, ObjectPath) and isinstance(final, ObjectPath):
        tmp.fs.copy_file(tmp.key, final.key)
        tmp.unlink(missing_ok=True)
        return
    assert isinstance(tmp, Path), tmp
    assert isinstance(final, Path), final
    fsync(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.rename(tmp, final)
    fsync(final.parent)


def fsync(path: Location) -> None:
    """Flush a local file or folder to disk (an object store write is durable once it returns)."""
    if isinstance(path, ObjectPath):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def arrow(path: Location) -> tuple[str, pafs.FileSystem | None]:
    """(path, filesystem) arguments for pyarrow's readers and writers."""
    if isinstance(path, ObjectPath):
        return path.key, path.fs
    return str(path), None


def is_local(path: Location) -> bool:
    return isinstance(path, Path)
