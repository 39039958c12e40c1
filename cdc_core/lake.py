"""The lake layout under `target.root`: bronze, silver/<schema>/<table>, _staging, _state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cdc_core.identifiers import TableName


@dataclass(frozen=True)
class Lake:
    """Where each stage reads and writes, for one pipeline."""

    root: str

    @property
    def staging(self) -> Path:
        return Path(self.root) / "_staging"

    @property
    def changes(self) -> Path:
        """Staged change files, named by LSN range."""
        return self.staging / "changes"

    @property
    def staging_tmp(self) -> Path:
        """Files being written; never read, removed at the start of a run."""
        return self.staging / "tmp"

    @property
    def state(self) -> Path:
        return Path(self.root) / "_state"

    @property
    def bronze(self) -> str:
        return f"{self.root}/bronze"

    @property
    def transactions(self) -> str:
        """BEGIN and END events (provide.transaction.metadata)."""
        return f"{self.root}/transactions"

    def silver(self, table: TableName) -> str:
        return f"{self.root}/silver/{table.schema}/{table.name}"


def local_path(path: str) -> Path | None:
    """`path` as a local directory, or None for a URI with a scheme (s3a://, abfss://, ...)."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        return Path(path)
    return Path(rest) if scheme == "file" else None
