"""A throwaway PostgreSQL cluster (initdb + pg_ctl on a free loopback port) for tests, benchmarks and
trying the controller against PostgreSQL without installing a service.

Needs the PostgreSQL server binaries (Debian: postgresql-15, under /usr/lib/postgresql/15/bin). As root
the cluster runs as the `postgres` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from shared.runtime.natsd import free_port


def find_pg_bin() -> Path | None:
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin"):
        for d in sorted(glob.glob(pattern), reverse=True):
            if (Path(d) / "initdb").is_file() and (Path(d) / "pg_ctl").is_file():
                return Path(d)
    which = shutil.which("initdb")
    return Path(which).parent if which else None


class TempPostgres:
    def __init__(self, bin_dir: Path | None = None):
        self.bin_dir = bin_dir or find_pg_bin()
        if self.bin_dir is None:
            raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
        self.dir = Path(tempfile.mkdtemp(prefix="jetrl-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user = "postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        res = subprocess.run([*self._as, *args], capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({res.returncode}): {res.stderr[-2000:] or res.stdout[-2000:]}")

    def start(self) -> TempPostgres:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8",
                  "--no-sync")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c synchronous_commit=off -c max_connections=200")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"),
                  "-w", "-t", "60", "start")
        return self

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run([*self._as, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                           capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def create_database_at(url: str, name: str) -> str:
    """Create database `name` on the server of `url` (an existing server, e.g. JETRL_TEST_PG_URL)."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conninfo = {"host": u.host or "127.0.0.1", "port": u.port or 5432, "user": u.username or "postgres",
                "dbname": u.database or "postgres"}
    if u.password:
        conninfo["password"] = u.password
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return u.set(database=name).render_as_string(hide_password=False)
