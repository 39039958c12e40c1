"""The snapshot's JDBC reads take the TLS settings of `source.dsn`; a PEM client key the JDBC
driver cannot read (libpq can) stops the run before any read, with the conversion to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_core.config import Dsn
from cdc_core.errors import TerminalError
from cdc_core.snapshot_read import jdbc_target

BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"


def _dsn(key: Path) -> Dsn:
    return Dsn(f"postgresql://cdc@127.0.0.1:5432/shop?sslmode=verify-full&sslcert=/c/client.crt"
               f"&sslkey={key}&sslpassword=secret&sslrootcert=/c/ca.crt")  # fmt: skip


def _pem(path: Path, kind: str) -> Path:
    path.write_text(f"-----BEGIN {kind}-----\n{BODY}-----END {kind}-----\n")
    return path


def test_the_reads_take_every_tls_setting_of_the_connection_string(tmp_path: Path) -> None:
    key = _pem(tmp_path / "client.key", "PRIVATE KEY")
    props = jdbc_target(_dsn(key))[1]
    assert {k: props[k] for k in ("sslmode", "sslcert", "sslkey", "sslpassword", "sslrootcert")} == {
        "sslmode": "verify-full", "sslcert": "/c/client.crt", "sslkey": str(key),
        "sslpassword": "secret", "sslrootcert": "/c/ca.crt",
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["ENCRYPTED PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"])
def test_a_pem_key_the_jdbc_driver_cannot_read_stops_the_run_naming_the_conversion(
    tmp_path: Path, kind: str
) -> None:
    key = _pem(tmp_path / "client.key", kind)
    with pytest.raises(TerminalError) as e:
        jdbc_target(_dsn(key))
    assert str(e.value) == (
        f"source.dsn: sslkey {key} is a PEM {kind.lower()}, which libpq reads but the PostgreSQL "
        "JDBC driver of the snapshot reads does not (it reads unencrypted PKCS #8 PEM, -----BEGIN "
        f"PRIVATE KEY-----); convert it, `openssl pkcs8 -topk8 -nocrypt -in {key} -out "
        "client.key`, keep the new file private (chmod 600) and point sslkey at it: both read it"
    )


def test_der_and_pkcs12_keys_and_keys_only_the_executors_have_go_to_the_driver(
    tmp_path: Path,
) -> None:
    der = tmp_path / "client.pk8"
    der.write_bytes(bytes([0x30, 0x82, 0x04, 0xBE]) + b"\x00" * 64)
    for key in (der, tmp_path / "client.p12", tmp_path / "elsewhere" / "client.key"):
        if key.suffix == ".p12":
            key.write_bytes(b"\x30\x82\x0a\x00" + b"\x01" * 32)
        assert jdbc_target(_dsn(key))[1]["sslkey"] == str(key)
