"""The lake layout under `target.root`: bronze, silver/<schema>/<table>, _staging, _state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cdc_core.errors import CdcError
from cdc_core.identifiers import TableName
from cdc_core.storage import Location, S3Options, bucket_of, location, store_problem


@dataclass(frozen=True)
class Lake:
    """Where each stage reads and writes, for one pipeline. `options`: how to reach the object
    store when `root` is on one (`Lake.of` reads them from the environment's Spark settings)."""

    root: str
    options: S3Options | None = None

    @classmethod
    def of(cls, root: str, spark_conf: Mapping[str, str]) -> Lake:
        """The lake at `root`, with the object store settings of `spark_conf` (if it is on one)."""
        bucket = bucket_of(root)
        return cls(root, S3Options.from_spark_conf(spark_conf, bucket)) if bucket else cls(root)

    @property
    def home(self) -> Location:
        """The root as a location for the driver's own file operations."""
        return location(self.root, self.options)

    @cached_property
    def store_problem(self) -> CdcError | None:
        """Why the object store holding the lake cannot be read (`storage.store_problem`), None
        for a local lake and a readable store; asked once of a job's lake, which its run lock
        and its owner check both need before anything is written."""
        return store_problem(self.home)

    def place(self, uri: str) -> Location:
        """A location under the lake (a Delta table's folder, say) for file operations."""
        return location(uri, self.options)

    @property
    def staging(self) -> Location:
        return self.home / "_staging"

    @property
    def changes(self) -> Location:
        """Staged change files, named by LSN range."""
        return self.staging / "changes"

    @property
    def staging_tmp(self) -> Location:
        """Files being written; never read, removed at the start of a run."""
        return self.staging / "tmp"

    @property
    def state(self) -> Location:
        return self.home / "_state"

    @property
    def bronze(self) -> str:
        return f"{self.root}/bronze"

    @property
    def transactions(self) -> str:
        """BEGIN and END events (provide.transaction.metadata)."""
        return f"{self.root}/transactions"

    @property
    def dead_letters(self) -> str:
        """Changes silver set aside (`cdc_core.dead_letters`), a Delta table."""
        return f"{self.root}/_state/dead_letters"

    def silver(self, table: TableName) -> str:
        return f"{self.root}/silver/{table.schema}/{table.name}"


def local_path(path: str) -> Path | None:
    """`path` as a local directory, or None for a URI with a scheme (s3a://, abfss://, ...)."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        return Path(path)
    return Path(rest) if scheme == "file" else None
