"""A real STAC API for the tests: stac-fastapi-pgstac (Transactions on) over a throwaway PostgreSQL cluster
with pgstac, both on 127.0.0.1 at free ports, in a temporary directory that is removed afterwards.

PostgreSQL refuses to run as root, so as root the cluster runs as the `postgres` system user (Debian's
package creates it) through `runuser`. `unavailable()` says why the API cannot start here (no PostgreSQL,
no PostGIS, no stac-fastapi-pgstac), so the tests that need it skip saying so, never silently.
"""
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterable, List, Optional

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
POSTGIS_CONTROL_GLOB = "/usr/share/postgresql/*/extension/postgis.control"
START_TIMEOUT_S = 60


def pg_bin() -> Optional[Path]:
    found = sorted(glob.glob(PG_BIN_GLOB))
    return Path(found[-1]) if found and (Path(found[-1]) / "initdb").exists() else None


def unavailable() -> Optional[str]:
    """Why the STAC API cannot run here, or None."""
    if pg_bin() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql; `make test` does it as root)"
    if not glob.glob(POSTGIS_CONTROL_GLOB):
        return "PostGIS is not installed (Debian: apt-get install postgresql-15-postgis-3; `make test` does it)"
    for module in ("pypgstac", "stac_fastapi.pgstac", "pystac_client"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[test]')"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "PostgreSQL cannot run as root and runuser is missing"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StacApi:
    """`with StacApi() as api:` a migrated, empty pgstac behind a STAC API at `api.url`;
    `api.load(collection, items)` adds a collection and its items (pypgstac's loader)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="stac-api-"))
        self.pg_port, self.api_port = free_port(), free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.api: Optional[subprocess.Popen] = None

    def _as_postgres(self, args: List[str]) -> List[str]:
        return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self):
        bin_dir, data = pg_bin(), self.dir / "data"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        subprocess.run(self._as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                          "-E", "UTF8", "--locale=C.UTF-8"]), check=True, capture_output=True)
        # A test database: durability off (it is thrown away), sockets in our directory, TCP on loopback only.
        options = (f"-h 127.0.0.1 -p {self.pg_port} -k {self.dir} -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off")
        subprocess.run(self._as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "pg.log"),
                                          "-o", options, "-w", "start"]), check=True, capture_output=True)
        from pypgstac.db import PgstacDB
        from pypgstac.migrate import Migrate

        with PgstacDB(dsn=self.dsn) as db:
            Migrate(db).run_migration()
        env = {**os.environ, "PGUSER": "postgres", "PGPASSWORD": "unused", "PGHOST": "127.0.0.1",
               "PGPORT": str(self.pg_port), "PGDATABASE": "postgres", "ENABLE_TRANSACTIONS_EXTENSIONS": "true"}
        self.log = open(self.dir / "api.log", "wb")
        self.api = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "stac_fastapi.pgstac.app:create_app",
                                     "--host", "127.0.0.1", "--port", str(self.api_port), "--log-level", "warning"],
                                    env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/_mgmt/ping", timeout=2):
                    return
            except OSError:
                if self.api.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the STAC API did not start: "
                                       f"{(self.dir / 'api.log').read_text()[-2000:]}") from None
                time.sleep(0.2)

    def load(self, collection: dict, items: Iterable[dict]) -> None:
        from pypgstac.db import PgstacDB
        from pypgstac.load import Loader, Methods

        with PgstacDB(dsn=self.dsn) as db:
            loader = Loader(db)
            loader.load_collections(iter([collection]), insert_mode=Methods.upsert)
            loader.load_items(iter(items), insert_mode=Methods.upsert)

    def __exit__(self, *exc):
        if self.api is not None:
            self.api.terminate()
            try:
                self.api.wait(10)
            except subprocess.TimeoutExpired:
                self.api.kill()
                self.api.wait()
            self.log.close()
        if (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run(self._as_postgres([str(pg_bin() / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                                              "immediate", "stop"]), capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
