"""Converters for PostgreSQL's ISO text output of date, timestamp[tz], time and interval.

Values become integers (days, microseconds), not `datetime` objects: the Arrow layer builds
its arrays from them directly. Only years 0001..9999 are representable, as in Spark.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone

from cdc_core.pgtypes.schema import Unrepresentable

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NTZ = datetime(1970, 1, 1)
_ONE_US = timedelta(microseconds=1)
_FRACTION_SCALE = (1_000_000, 100_000, 10_000, 1_000, 100, 10, 1)
_SECOND_US = 1_000_000
_DAY_US = 86_400 * _SECOND_US
_MONTH_US = 2_629_800 * _SECOND_US
"""Debezium's month of 365.25 / 12 = 30.4375 days, which is a whole number of seconds."""
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1

MIN_TIMESTAMP_US = (date(1, 1, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_US
"""0001-01-01T00:00:00, the first instant Spark's timestamps hold reliably."""
MAX_TIMESTAMP_US = (date(9999, 12, 31).toordinal() - _EPOCH_ORDINAL + 1) * _DAY_US - 1
"""9999-12-31T23:59:59.999999."""

_INTERVAL = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+)(?:\.(\d{1,6}))?S)?)?"
)


def py310_isoformat(text: str, seconds_end: int) -> str:
    """PostgreSQL's ISO text in the form Python 3.10's `fromisoformat` accepts.

    Python 3.10 takes only 3 or 6 fraction digits and offsets of the form +HH:MM[:SS];
    PostgreSQL prints 0 to 6 fraction digits and '+00' for whole hours.
    """
    end = seconds_end
    head = text[:seconds_end]
    if text[end : end + 1] == ".":
        end += 1
        while end < len(text) and text[end].isdigit():
            end += 1
        head += "." + text[seconds_end + 1 : end].ljust(6, "0")
    offset = text[end:]
    return head + (offset + ":00" if len(offset) == 3 else offset)


# The C `fromisoformat` is several times faster than slicing the text in Python; before
# Python 3.11 it needs the text normalised first.
_datetime: Callable[[str], datetime]
_time: Callable[[str], time]
if sys.version_info >= (3, 11):
    _datetime, _time = datetime.fromisoformat, time.fromisoformat
else:

    def _datetime(text: str) -> datetime:
        return datetime.fromisoformat(py310_isoformat(text, 19))

    def _time(text: str) -> time:
        return time.fromisoformat(py310_isoformat(text, 8))


def _out_of_range(text: str, what: str) -> ValueError:
    """Unrepresentable for infinity, BC and years past 9999; a plain ValueError for garbage."""
    if text in ("infinity", "-infinity") or text.endswith(" BC") or text[:5].isdigit():
        return Unrepresentable(f"{what} {text!r} is outside 0001-01-01..9999-12-31")
    return ValueError(f"{text!r} is not a PostgreSQL {what} in ISO form")


def date_days(text: str) -> int:
    """'2017-09-15' -> 17424 (days since 1970-01-01)."""
    if len(text) != 10:
        raise _out_of_range(text, "date")
    return date.fromisoformat(text).toordinal() - _EPOCH_ORDINAL


def timestamp_ntz(text: str) -> int:
    """'2018-06-20 15:13:16.945104' -> 1529507596945104 (wall-clock µs since 1970-01-01)."""
    if len(text) < 19 or text[4] != "-" or text[-1] == "C":
        raise _out_of_range(text, "timestamp")
    value = _datetime(text)
    if value.tzinfo is not None:
        raise ValueError(f"{text!r} is a timestamp with a UTC offset")
    micros: int = (value - _EPOCH_NTZ) // _ONE_US
    return micros


def timestamptz(text: str) -> int:
    """'2021-06-05 07:23:45.5+05:30' -> µs since the epoch of that instant (UTC)."""
    if len(text) < 22 or text[4] != "-" or text[-1] == "C":
        raise _out_of_range(text, "timestamptz")
    value = _datetime(text)
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset")
    micros: int = (value - _EPOCH) // _ONE_US
    if MIN_TIMESTAMP_US <= micros <= MAX_TIMESTAMP_US:
        return micros
    raise Unrepresentable(f"timestamptz {text!r} is outside 0001-01-01..9999-12-31 UTC")


def time_us(text: str) -> int:
    """'04:05:11.789' -> 14711789000 (µs past midnight); '24:00:00' -> 86400000000."""
    if text == "24:00:00":
        return _DAY_US
    t = _time(text)
    return (t.hour * 3_600 + t.minute * 60 + t.second) * _SECOND_US + t.microsecond


def time_ns(text: str) -> int:
    """Nanoseconds past midnight (nanoseconds mode, Debezium's NanoTime); exact, as PostgreSQL
    keeps microseconds: '04:05:11.789' -> 14711789000000."""
    return time_us(text) * 1_000


def time_ms(text: str) -> int:
    """Milliseconds past midnight; exact for time(0..3), truncating beyond (connect mode)."""
    return time_us(text) // 1_000


def interval_us(text: str) -> int:
    """'P1Y2M3DT4H5M6.78S' -> 37091106780000: Debezium's approximation, computed exactly.

    A month counts 30.4375 days and a year 12 months, as in Debezium's `MicroDuration`; the
    sum is done in integers, where Debezium uses doubles.
    """
    m = _INTERVAL.fullmatch(text)
    if m is None:
        if text in ("infinity", "-infinity"):
            raise Unrepresentable(f"interval {text!r} has no microsecond count")
        raise ValueError(f"{text!r} is not an interval in IntervalStyle iso_8601")
    years, months, days, hours, minutes, seconds, fraction = m.groups()
    micros = (
        (int(years or 0) * 12 + int(months or 0)) * _MONTH_US
        + int(days or 0) * _DAY_US
        + (int(hours or 0) * 3_600 + int(minutes or 0) * 60) * _SECOND_US
    )
    if seconds is not None:
        micros += int(seconds) * _SECOND_US
        if fraction is not None:
            part = int(fraction) * _FRACTION_SCALE[len(fraction)]
            micros += -part if seconds[0] == "-" else part
    if _LONG_MIN <= micros <= _LONG_MAX:
        return micros
    raise Unrepresentable(f"interval {text!r} overflows a long of microseconds")
