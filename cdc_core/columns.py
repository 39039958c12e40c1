"""Column filters and transforms, applied before anything is written: raw values never land.

Debezium's `column.include.list` / `column.exclude.list` drop columns (key columns, and the
columns of a DEFAULT or INDEX replica identity, always stay; under FULL only the key does);
`column.truncate.to.N.chars`, `column.mask.with.N.chars` and
`column.mask.hash[.v2].<algorithm>.with.salt.<salt>` rewrite the values of character columns
(text, varchar, char). A column several rules match gets only one, as in Debezium
(`ColumnMappers.mapperFor` takes the first): a mask, else a v1 hash, else a v2 hash, else a
truncation. Debezium puts truncation first, which would land a masked column's first N
characters in clear; here a mask or hash rule always wins. The reader rewrites each
pgoutput row message of an affected table (`ColumnPlan.rewrite`) and stages the table's
descriptor without the dropped columns, so staged files, bronze and silver never see what was
removed; snapshot reads select only the kept columns and pass their values through the same
functions.

Hashes are Debezium's: hex(digest(salt bytes + value bytes)), lower case, cut to the
column's declared length (varchar(n), char(n)) if it has one. The value's bytes are, for v2,
its UTF-8 encoding; for v1 (the default, as in Debezium), its Java serialization as a String
(`AC ED 00 05 74`, a 2-byte length, modified UTF-8). Truncation counts code points (Java
counts UTF-16 units: they differ only for characters outside the Basic Multilingual Plane).
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from cdc_core.events import ColumnDescriptor, RelationDescriptor
from cdc_core.identifiers import TableName
from cdc_core.name_patterns import checked_pattern, matches_any, split_patterns
from cdc_core.pg.pgoutput import ReplicaIdentity

Transform = Callable[[str], str]
CHARACTER_TYPES = frozenset({"text", "varchar", "bpchar", "name", "citext"})
_RULE = re.compile(
    r"column\.(?:truncate\.to\.(?P<truncate>\d+)\.chars"
    r"|mask\.with\.(?P<mask>\d+)\.chars"
    r"|mask\.hash\.(?:(?P<v2>v2)\.)?(?P<algorithm>.+?)\.with\.salt\.(?P<salt>.+))"
)
ALGORITHMS = {  # Java MessageDigest name -> hashlib name
    "MD5": "md5", "SHA-1": "sha1", "SHA-224": "sha224", "SHA-256": "sha256",
    "SHA-384": "sha384", "SHA-512": "sha512", "SHA-512/224": "sha512_224",
    "SHA-512/256": "sha512_256", "SHA3-224": "sha3_224", "SHA3-256": "sha3_256",
    "SHA3-384": "sha3_384", "SHA3-512": "sha3_512",
}  # fmt: skip
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")


def truncate(length: int) -> Transform:
    return lambda value: value[:length]


def mask(length: int) -> Transform:
    stars = "*" * length
    return lambda value: stars


def java_serialized(value: str) -> bytes:
    """`ObjectOutputStream.writeObject(value)` for a String: what Debezium's hash v1 digests."""
    data = _modified_utf8(value)
    if len(data) <= 0xFFFF:
        return b"\xac\xed\x00\x05\x74" + struct.pack(">H", len(data)) + data
    return b"\xac\xed\x00\x05\x7c" + struct.pack(">Q", len(data)) + data


def _modified_utf8(value: str) -> bytes:
    out = bytearray()
    utf16 = value.encode("utf-16-le", "surrogatepass")
    for unit in struct.unpack(f"<{len(utf16) // 2}H", utf16):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:  # NUL too: C0 80
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:  # surrogates stay separate units, three bytes each
            out += bytes((0xE0 | unit >> 12, 0x80 | (unit >> 6) & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def hashed(algorithm: str, salt: str, *, v2: bool, length: int | None = None) -> Transform:
    name = ALGORITHMS[algorithm]
    salt_bytes = salt.encode("utf-8")

    def apply(value: str) -> str:
        digest = hashlib.new(name, salt_bytes)
        digest.update(value.encode("utf-8") if v2 else java_serialized(value))
        out = digest.hexdigest()
        return out[:length] if length else out

    return apply


_MAX_CHARS = 1 << 30  # a text value holds at most 1 GB


@dataclass(frozen=True)
class Rule:
    """One transform property: its kind and parameters, and the columns it applies to."""

    key: str
    patterns: tuple[str, ...]
    truncate: int | None = None
    mask: int | None = None
    algorithm: str | None = None
    salt: str = ""
    v2: bool = False

    @classmethod
    def parse(cls, key: str, value: str) -> Rule:
        """`key` as Debezium writes it; ValueError says what is wrong."""
        m = _RULE.fullmatch(key)
        if not m:
            raise ValueError(
                "not a column transform: write column.truncate.to.<n>.chars, "
                "column.mask.with.<n>.chars or column.mask.hash[.v2].<algorithm>.with.salt.<salt>"
            )
        patterns = tuple(split_patterns(value))
        if not patterns:
            raise ValueError("list the columns (schema.table.column regular expressions)")
        for p in patterns:
            checked_pattern(p)
        if m["algorithm"] is not None and m["algorithm"] not in ALGORITHMS:
            raise ValueError(
                f"unknown hash algorithm {m['algorithm']!r}: use one of {', '.join(ALGORITHMS)}"
            )
        if m["truncate"] is not None and int(m["truncate"]) == 0:
            raise ValueError(  # Debezium's TruncateStrings: "Maximum length must be positive"
                "the length to truncate to must be positive, as in Debezium: to empty the "
                "values write column.mask.with.0.chars, to drop the column column.exclude.list"
            )
        for n in (m["truncate"], m["mask"]):
            if n is not None and int(n) > _MAX_CHARS:  # a mask is built of that many `*`
                raise ValueError(f"{int(n):,} characters is more than a column transform "
                                 f"takes ({_MAX_CHARS:,}, PostgreSQL's largest text)")  # fmt: skip
        return cls(
            key, patterns,
            truncate=int(m["truncate"]) if m["truncate"] is not None else None,
            mask=int(m["mask"]) if m["mask"] is not None else None,
            algorithm=m["algorithm"], salt=m["salt"] or "", v2=bool(m["v2"]),
        )  # fmt: skip

    def matches(self, column_id: str) -> bool:
        return matches_any(self.patterns, column_id)

    def rank(self) -> int:
        """Which rule a column several rules match gets: a mask, a v1 hash, a v2 hash (Debezium's
        order), then a truncation (first in Debezium's, which would let a masked column's first
        N characters through)."""
        if self.truncate is not None:
            return 3
        if self.mask is not None:
            return 0
        return 2 if self.v2 else 1

    @property
    def digest_chars(self) -> int:
        """How many hex characters a hash rule's digest has (0 for other rules)."""
        return hashlib.new(ALGORITHMS[self.algorithm]).digest_size * 2 if self.algorithm else 0

    def transform(self, column: ColumnDescriptor) -> Transform:
        if self.truncate is not None:
            return truncate(self.truncate)
        if self.mask is not None:
            return mask(self.mask)
        assert self.algorithm is not None
        length = declared_length(column.base_type, column.base_modifier)
        return hashed(self.algorithm, self.salt, v2=self.v2, length=length)


def declared_length(base_type: str, modifier: int) -> int | None:
    """n of varchar(n) / char(n) (a base type and its modifier); None for types without one."""
    if base_type in ("varchar", "bpchar") and modifier > 4:
        return modifier - 4
    return None


@dataclass(frozen=True)
class ColumnRules:
    """What a pipeline does to columns: which it keeps, and how it rewrites values."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude or self.rules)

    def _in_debezium_order(self) -> list[Rule]:
        """The rules in the order a column's one rule is chosen (`Rule.rank`; each kind in the
        order written): as Debezium's `ColumnMappers.create` registers them, but truncation
        last; as in its `mapperFor`, the first that matches a column applies and no other."""
        return sorted(self.rules, key=Rule.rank)

    def keeps(self, table: TableName, column: str) -> bool:
        """Whether the include and exclude lists keep `column` of `table` (key and identity
        columns are kept whatever they say, as `plan` keeps them)."""
        column_id = f"{table.schema}.{table.name}.{column}"
        if self.include and not matches_any(self.include, column_id):
            return False
        return not matches_any(self.exclude, column_id)

    def rule_for(self, column_id: str) -> Rule | None:
        """The one rule that rewrites `column_id` (schema.table.column), if any."""
        return next((r for r in self._in_debezium_order() if r.matches(column_id)), None)

    def applied(self, table: TableName, columns: Iterable[str]) -> dict[str, str]:
        """What the filters and transforms do to each of `columns` of `table` that they touch:
        "excluded", or the key of the rule rewriting it. Key columns, which are always kept,
        and rules a column's type ignores count too: this tells when what a mirror holds
        would change, and a rule that changes nothing then costs a needless read, not a miss."""
        done = {}
        for column in columns:
            column_id = f"{table.schema}.{table.name}.{column}"
            if not self.keeps(table, column):
                done[column] = "excluded"
            elif (rule := self.rule_for(column_id)) is not None:
                done[column] = rule.key
        return done

    def plan(self, descriptor: RelationDescriptor) -> ColumnPlan | None:
        """How a table's rows are rewritten; None when nothing changes for it."""
        if not self:
            return None
        prefix = f"{descriptor.schema}.{descriptor.table}."
        full = descriptor.replica_identity is ReplicaIdentity.FULL  # every column is identity
        keep, transforms = [], {}
        for i, c in enumerate(descriptor.columns):
            column_id = prefix + c.name
            always = c.name in descriptor.primary_key or (c.in_identity and not full)
            if not always and self.include and not matches_any(self.include, column_id):
                continue
            if not always and matches_any(self.exclude, column_id):
                continue
            keep.append(i)
            textual = c.base_type in CHARACTER_TYPES and not c.is_array
            if textual and (rule := self.rule_for(column_id)) is not None:
                transforms[len(keep) - 1] = rule.transform(c)
        if len(keep) == len(descriptor.columns) and not transforms:
            return None
        kept = replace(descriptor, columns=tuple(descriptor.columns[i] for i in keep))
        return ColumnPlan(kept, tuple(keep), transforms, len(descriptor.columns))


NO_RULES = ColumnRules()

SILVER_OWN = ("_cdc_lsn", "_cdc_seq", "_cdc_op", "_cdc_commit_ts", "_cdc_deleted", "_cdc_raw",
              "_cdc_unavailable", "_cdc_row_hash", "_cdc_count")  # fmt: skip
"""The columns silver adds to a mirror (`silver_shape.CDC_COLUMNS`, `MULTISET_COLUMNS`): no
source column may have their names."""


@dataclass(frozen=True)
class ColumnPlan:
    """One table's rewrite: the staged descriptor, the kept column positions, and the
    transforms by position among the kept columns."""

    descriptor: RelationDescriptor
    keep: tuple[int, ...]
    transforms: Mapping[int, Transform]
    width: int  # columns in the messages the server sends

    def rewrite(self, data: bytes) -> bytes:
        """An INSERT/UPDATE/DELETE message with only the kept columns, values transformed."""
        out = bytearray(data[:6])  # tag, relation OID, first tuple marker
        pos = self._tuple(data, 6, out)
        if data[0] == 0x55 and data[5] in (0x4B, 0x4F):  # UPDATE with an old tuple: new follows
            out.append(data[pos])  # 'N'
            pos = self._tuple(data, pos + 1, out)
        return bytes(out)

    def _tuple(self, data: bytes, pos: int, out: bytearray) -> int:
        (ncols,) = _I16.unpack_from(data, pos)
        if ncols != self.width:
            raise ValueError(
                f"{self.descriptor.schema}.{self.descriptor.table}: a row of {ncols} columns, "
                f"its relation has {self.width}"
            )
        pos += 2
        values = []
        for _ in range(ncols):
            kind = data[pos]
            if kind in (0x74, 0x62):
                (length,) = _I32.unpack_from(data, pos + 1)
                values.append((kind, data[pos + 5 : pos + 5 + length]))
                pos += 5 + length
            else:
                values.append((kind, b""))
                pos += 1
        out += _I16.pack(len(self.keep))
        for n, i in enumerate(self.keep):
            kind, raw = values[i]
            transform = self.transforms.get(n)
            if kind == 0x74 and transform is not None:
                raw = transform(raw.decode("utf-8")).encode("utf-8")
            out.append(kind)
            if kind in (0x74, 0x62):
                out += _I32.pack(len(raw)) + raw
        return pos

    def text(self, values: Mapping[str, str | None]) -> dict[str, str | None]:
        """A snapshot row (column name -> text) rewritten the same way."""
        out: dict[str, str | None] = {}
        for n, c in enumerate(self.descriptor.columns):
            value = values.get(c.name)
            transform = self.transforms.get(n)
            out[c.name] = transform(value) if value is not None and transform else value
        return out
