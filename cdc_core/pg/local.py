"""A throwaway local PostgreSQL cluster (initdb + pg_ctl): the embedded default of demo and tests.

The server refuses to run as root, so under root every server command runs as an unprivileged
OS user (`$CDC_PG_OS_USER`, else `postgres`, else `nobody`) and the cluster lives under a
directory that user can reach (`$CDC_PG_HOME`, default `/var/tmp/cdc-lake-pg`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc_core.errors import SetupError, UsageError

DEFAULT_HOME = Path("/var/tmp/cdc-lake-pg")
SUPERUSER = "postgres"

_INSTALL_HINT = (
    "install the PostgreSQL server (Debian: sudo apt-get install postgresql postgresql-contrib), "
    "set CDC_PG_BINDIR to its bin directory, or point at an existing server with CDC_TEST_PG_DSN"
)


def find_bindir() -> Path:
    """Directory holding initdb, pg_ctl and postgres: `$CDC_PG_BINDIR`, Debian's newest, PATH."""
    candidates: list[Path] = []
    if os.environ.get("CDC_PG_BINDIR"):
        candidates.append(Path(os.environ["CDC_PG_BINDIR"]))
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    candidates.extend(reversed(debian))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for c in candidates:
        if all((c / b).is_file() for b in ("initdb", "pg_ctl", "postgres")):
            return c
    raise SetupError(
        f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: {_INSTALL_HINT}"
    )


def free_port(preferred: int | None = None) -> int:
    """`preferred` if nothing listens on it on 127.0.0.1, else a free port the OS picks. The
    probe binds as the server does (SO_REUSEADDR): connections to a server just stopped, still
    in TIME-WAIT, do not keep it from its port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise SetupError("no free TCP port on 127.0.0.1")


def _os_user() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    wanted = [os.environ.get("CDC_PG_OS_USER") or "", "postgres", "nobody"]
    for name in filter(None, wanted):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise SetupError(
        "running as root and no unprivileged user to run PostgreSQL: set CDC_PG_OS_USER"
    )


@dataclass(frozen=True)
class LocalPostgres:
    """One local cluster: its data directory, port and the OS user it runs as."""

    data_dir: Path
    port: int
    bindir: Path

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def port_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.port"

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        user = _os_user()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        if user is not None:
            env["HOME"] = str(self.data_dir.parent)
        proc = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            cwd=self.data_dir.parent, env=env, capture_output=True, text=True, check=False,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )  # fmt: skip
        if check and proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            log_tail = self._log_tail()
            raise SetupError(
                f"{args[0]} failed for the local PostgreSQL in {self.data_dir} (exit "
                f"{proc.returncode}): {' | '.join(tail)}{log_tail}"
            )
        return proc

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            return ""
        return "\nserver log: " + " | ".join(lines) if lines else ""

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def running(self) -> bool:
        return (
            self.initialized()
            and self._run(["pg_ctl", "status", "-D", str(self.data_dir)], check=False).returncode
            == 0
        )

    def init(self, settings: Mapping[str, str]) -> None:
        """initdb with trust auth on 127.0.0.1 only, and `settings` in postgresql.auto.conf."""
        user = _os_user()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if user is not None:
            os.chown(self.data_dir.parent, user.pw_uid, user.pw_gid)
        self._run(["initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                   "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"])  # fmt: skip
        lines = [f"{k} = '{v}'" for k, v in settings.items()]
        with (self.data_dir / "postgresql.auto.conf").open("a") as f:
            f.write("\n".join(["# cdc-lake local cluster", *lines, ""]))

    def start(self) -> None:
        self._run(["pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data_dir),
                   "-l", str(self.log_file), "-o", f"-p {self.port}"])  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run(["pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data_dir)])

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.log_file.unlink(missing_ok=True)
        self.port_file.unlink(missing_ok=True)


def cluster_settings(*, durable: bool) -> dict[str, str]:
    """What every local cluster needs for logical replication; `durable=False` trades crash
    safety of the server for speed (tests kill the product, never the machine)."""
    settings = {
        "listen_addresses": "127.0.0.1",
        "unix_socket_directories": "",
        "wal_level": "logical",
        "max_replication_slots": "32",
        "max_wal_senders": "32",
        "max_connections": "100",
        "shared_buffers": "256MB",
        "max_wal_size": "2GB",
        "timezone": "UTC",
        "log_timezone": "UTC",
    }
    if not durable:
        settings |= {"fsync": "off", "full_page_writes": "off"}
    return settings


def home_dir() -> Path:
    return Path(os.environ.get("CDC_PG_HOME") or DEFAULT_HOME)


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def cluster_dir(name: str) -> Path:
    """Where cluster `name` lives: a directory of its own under the home directory, never a
    path the name points to (`--name /srv/data` would have been that directory, which a start
    that finds no cluster there clears)."""
    if not _CLUSTER_NAME.fullmatch(name):
        raise UsageError(
            f"cluster name {name!r}: use letters, digits, '_', '.' and '-' (at most 63, the "
            f"first a letter or digit); it names a directory under {home_dir()}"
        )
    return home_dir() / name


def find_cluster(name: str) -> LocalPostgres | None:
    """The cluster `name` under the home directory if it was created, running or not."""
    data_dir = cluster_dir(name)
    port_file = data_dir.parent / f"{name}.port"
    if not ((data_dir / "PG_VERSION").is_file() and port_file.is_file()):
        return None
    return LocalPostgres(data_dir, int(port_file.read_text()), find_bindir())


def ensure_cluster(
    name: str,
    *,
    port: int | None = None,
    durable: bool = True,
    extra: Mapping[str, str] | None = None,
    bindir: Path | None = None,
) -> LocalPostgres:
    """Start cluster `name` under the home directory, creating it if needed (idempotent).

    An existing cluster keeps its port while that is free, or moves to `port` when given; for a
    new one `port` is a preference (None: a port the OS picks). `extra` settings are added to
    the standard ones at creation; `bindir`: the server's binaries for a new one
    (`find_bindir`'s if None).
    """
    cluster = find_cluster(name)
    if cluster is not None and cluster.running():
        return cluster
    if cluster is not None:
        cluster = LocalPostgres(cluster.data_dir, free_port(port or cluster.port), cluster.bindir)
    else:
        data_dir = cluster_dir(name)
        shutil.rmtree(data_dir, ignore_errors=True)  # a creation that failed half way
        cluster = LocalPostgres(data_dir, free_port(port), bindir or find_bindir())
        cluster.init(cluster_settings(durable=durable) | dict(extra or {}))
    cluster.port_file.write_text(str(cluster.port))
    cluster.start()
    return cluster


@contextlib.contextmanager
def throwaway_cluster(
    prefix: str = "test", *, extra: Mapping[str, str] | None = None, bindir: Path | None = None
) -> Iterator[LocalPostgres]:
    """A fresh, non-durable cluster for the duration of a block, destroyed afterwards."""
    name = f"{prefix}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    cluster = ensure_cluster(name, durable=False, extra=extra, bindir=bindir)
    try:
        yield cluster
    finally:
        cluster.destroy()
