"""The reset marker: the logical message that starts one pipeline's mirror of a table over.

`cdc_core.start` writes it into the WAL (a table recreated, or `cdc snapshot` of a dropped
mirror), the reader stages it whatever the prefix filters say, and silver applies it as a
TRUNCATE. Logical messages reach every slot on the database, so the content names the slot
of the pipeline it is for, `{"slot": ..., "table": "schema.table"}`, and the other pipelines
drop it. The slot is the pipeline's identity on the server: each pipeline reads its own (no
two on a server share a name), and its lake's stream position is the slot's. A pipeline name
is unique only within one lake.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

RESET_PREFIX = "cdc-lake.reset"
"""Prefix of the message that starts a table's mirror over; staged whatever the prefix
filters, applied by silver as a TRUNCATE."""


@dataclass(frozen=True)
class ResetMarker:
    """A reset marker's content."""

    table: str  # schema.table, unquoted (`TableName.qualified`)
    slot: str | None  # the pipeline's slot; None: a marker from before markers named one

    def encode(self) -> str:
        if self.slot is None:
            return self.table
        return json.dumps({"slot": self.slot, "table": self.table}, sort_keys=True)

    @classmethod
    def decode(cls, content: bytes) -> ResetMarker:
        """The marker; content that is not a JSON object with a string table and slot is
        the older form, the bare table name (which content names no table, so no mirror)."""
        text = content.decode("utf-8", errors="replace")
        if text.startswith("{"):
            try:
                found = json.loads(text)
            except ValueError:
                found = None
            if isinstance(found, dict):
                table, slot = found.get("table"), found.get("slot")
                if isinstance(table, str) and isinstance(slot, str):
                    return cls(table, slot)
        return cls(text, None)

    def is_for(self, slot: str) -> bool:
        """Whether the pipeline reading `slot` applies it. A marker in the older form (no
        slot) counts for every pipeline: which one wrote it cannot be told (a pipeline's own
        marker written before an upgrade may still be in the WAL, staged or in bronze), and
        every pipeline applied it before markers named their slot."""
        return self.slot is None or self.slot == slot
