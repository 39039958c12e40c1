#!/usr/bin/env bash
# Set-up for the two README commands: installs what is missing (or says exactly what to
# install), then creates the project virtualenv. Safe to run again; it only does what is needed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CDC_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

say() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }
can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- Python >= 3.10 -------------------------------------------------------------------------
command -v "$python" >/dev/null 2>&1 || die "python3 not found: install Python >= 3.10 (Debian: apt-get install python3 python3-venv)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("$python" -V 2>&1) is too old: install Python >= 3.10"

# --- Java 17+ for Spark 4 ---------------------------------------------------------------------
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
    if can_apt; then
        say "installing Java 17 (Debian openjdk-17-jre-headless)"
        apt_install openjdk-17-jre-headless
    else
        die "Spark 4 needs Java 17+: install it (Debian: sudo apt-get install openjdk-17-jre-headless) and put java on PATH"
    fi
fi

# --- PostgreSQL server binaries (initdb, pg_ctl, postgres) ------------------------------------
pg_bindir() {
    if [ -n "${CDC_PG_BINDIR:-}" ]; then echo "$CDC_PG_BINDIR"; return; fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}
if [ -z "${CDC_TEST_PG_DSN:-}" ] && [ ! -x "$(pg_bindir)/initdb" ]; then
    if can_apt; then
        say "installing the PostgreSQL server (Debian postgresql), without its default cluster"
        mkdir -p /etc/postgresql-common
        [ -f /etc/postgresql-common/createcluster.conf ] \
            || echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf
        apt_install postgresql postgresql-contrib
    else
        die "PostgreSQL server binaries not found: install them (Debian: sudo apt-get install postgresql postgresql-contrib) or set CDC_TEST_PG_DSN to an existing server with wal_level=logical"
    fi
fi

# --- openssl, which the TLS test makes its certificates with ----------------------------------
if ! command -v openssl >/dev/null 2>&1; then
    if can_apt; then
        say "installing openssl (Debian openssl), for the TLS test's certificates"
        apt_install openssl
    else
        say "openssl not found: the TLS test needs it (Debian: sudo apt-get install openssl)"
    fi
fi

# --- the project virtualenv --------------------------------------------------------------------
stamp="$venv/.cdc-installed"
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    "$python" -m venv "$venv" || die "could not create a virtualenv: install the venv module (Debian: apt-get install python3-venv)"
fi
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    say "installing the project and its dev tools into $venv (pyspark is large: first time takes a few minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e "$root[dev]"
    touch "$stamp"
fi

# --- the jars Spark needs (Delta, PostgreSQL JDBC), resolved once and cached -------------------
"$venv/bin/python" -m cdc_core.jars --quiet
