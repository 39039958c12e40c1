"""Converters for PostgreSQL's text output of numbers, money, booleans, bits, bytea and point."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Context, Decimal, Inexact, InvalidOperation

from cdc_core.pgtypes.schema import BinaryMode, Unrepresentable

MAX_DECIMAL_PRECISION = 38
"""Spark's DecimalType limit."""
MONEY_INTEGER_DIGITS = 17
"""money is a 64-bit count of cents: at most 92233720368547758.07 (lc_monetary=C)."""
MAX_MONEY_DIGITS = MAX_DECIMAL_PRECISION - MONEY_INTEGER_DIGITS
"""The largest money.fraction.digits whose decimal(17 + n, n) Spark holds."""

_F32 = struct.Struct("<f")
_MONEY_NOISE = str.maketrans("", "", "$,()-")
_MONEY_CONTEXT = Context(prec=19, traps=[Inexact, InvalidOperation])
_CENT = Decimal("0.01")
_FLOAT32_SUBNORMAL = 2.0**-126
_BOOLEAN = {"t": True, "f": False, "true": True, "false": False}


def identity(text: str) -> str:
    return text


def boolean(text: str) -> bool:
    """'t' or 'f' (the output function, as pgoutput sends); 'true' or 'false' (a ::text cast)."""
    value = _BOOLEAN.get(text)
    if value is None:
        raise ValueError(f"{text!r} is not a PostgreSQL boolean (t or f)")
    return value


def bit1(text: str) -> bool:
    if text == "1":
        return True
    if text == "0":
        return False
    raise ValueError(f"{text!r} is not a bit(1) value (1 or 0)")


def numeric_typmod(modifier: int) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p,s), or None when unconstrained; scale may be negative."""
    if modifier < 4:
        return None
    packed = modifier - 4
    # PostgreSQL 15 packs the scale in 11 bits, two's complement (scales -1000..1000).
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def decimal_shape(precision: int, scale: int) -> tuple[int, int]:
    """The (precision, scale) of a decimal that holds every numeric(p,s) value exactly.

    PostgreSQL 15 allows scale < 0 (values are multiples of 10^-s) and scale > precision
    (values below 10^(p-s)); Spark needs 0 <= scale <= precision.
    """
    if scale < 0:
        return precision - scale, 0
    return max(precision, scale), scale


def numeric_decimal(precision: int, scale: int) -> Callable[[str], Decimal]:
    """Text -> Decimal with exactly `scale` digits; overflow or rounding is Unrepresentable."""
    quantum = Decimal(1).scaleb(-scale)
    context = Context(prec=precision, traps=[Inexact, InvalidOperation])
    integer_digits = precision - scale
    dot = -scale - 1

    def convert(text: str) -> Decimal:
        # PostgreSQL prints numeric(p,s) with exactly s fraction digits: text with its point
        # in that place (none when s = 0) and few enough integer digits is already exact.
        integers = len(text) - (text[0] == "-") - (scale + 1 if scale else 0)
        if 0 < integers <= integer_digits and (
            text[dot] == "." if scale else "." not in text and text[-1].isdigit()
        ):
            return Decimal(text)
        value = Decimal(text)
        if not value.is_finite():
            raise Unrepresentable(f"numeric {text} in decimal({precision},{scale})")
        try:
            return value.quantize(quantum, context=context)
        except (Inexact, InvalidOperation) as e:
            raise Unrepresentable(f"numeric {text} in decimal({precision},{scale})") from e

    return convert


def money(text: str) -> Decimal:
    """'-$1,234.56' (lc_monetary=C) -> Decimal('-1234.56')."""
    value = Decimal(text.translate(_MONEY_NOISE)).quantize(_CENT, context=_MONEY_CONTEXT)
    return -value if "-" in text or "(" in text else value


def money_scaled(digits: int) -> Callable[[str], Decimal]:
    """Text -> Decimal with `digits` fraction digits (money.fraction.digits), rounded half up
    (away from zero) as Debezium's `setScale(digits, HALF_UP)`."""
    if digits == 2:
        return money
    quantum = Decimal(1).scaleb(-digits)
    context = Context(prec=MONEY_INTEGER_DIGITS + digits, rounding=ROUND_HALF_UP)

    def convert(text: str) -> Decimal:
        return money(text).quantize(quantum, context=context)

    return convert


def money_double(text: str) -> float:
    return float(money(text))


def money_string(text: str) -> str:
    return str(money(text))


def float4(text: str) -> float:
    """The exact float32 value PostgreSQL printed, as a Python float."""
    wide = float(text)
    narrow: float = _F32.unpack(_F32.pack(wide))[0]
    if narrow == wide or not _is_float32_midpoint(wide):
        return narrow
    # Parsing to double then rounding to float32 rounds twice; when the double lands exactly
    # halfway between two float32 values, the text decides which one is nearer.
    other = 2.0 * wide - narrow
    exact, half = Decimal(text), Decimal(wide)
    if exact == half:
        return narrow
    return max(narrow, other) if exact > half else min(narrow, other)


def _is_float32_midpoint(x: float) -> bool:
    if not math.isfinite(x):
        return False
    if abs(x) < _FLOAT32_SUBNORMAL:
        return (x * 2.0**150) % 2.0 == 1.0
    return (math.frexp(x)[0] * 2.0**25) % 2.0 == 1.0


def point(text: str) -> dict[str, object]:
    """'(1.5,2)' -> {'x': 1.5, 'y': 2.0}."""
    if text[0] != "(" or text[-1] != ")":
        raise ValueError(f"{text!r} is not a PostgreSQL point")
    x, y = text[1:-1].split(",")
    return {"x": float(x), "y": float(y)}


def bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError(f"bytea text {text[:20]!r} is not in hex form (needs bytea_output=hex)")
    return bytes.fromhex(text[2:])


def _bytea_base64(text: str) -> str:
    return base64.b64encode(bytea(text)).decode("ascii")


def _bytea_base64_url(text: str) -> str:
    return base64.urlsafe_b64encode(bytea(text)).decode("ascii")


def _bytea_hex(text: str) -> str:
    if not text.startswith("\\x"):
        raise ValueError(f"bytea text {text[:20]!r} is not in hex form (needs bytea_output=hex)")
    return text[2:]


BYTEA: dict[BinaryMode, Callable[[str], object]] = {
    "bytes": bytea,
    "base64": _bytea_base64,
    "base64-url-safe": _bytea_base64_url,
    "hex": _bytea_hex,
}
