"""A throw-away PostgreSQL server (Debian's postgresql: initdb, pg_ctl) on a Unix socket in a
temporary folder, for the database test and the fleet benchmark.

    with PgServer() as pg:      # pg.url: postgresql://kiln@/postgres?host=...&port=...
        pg.stop(); pg.start()   # the server going away and coming back
"""

import glob
import os
import shutil
import subprocess
import tempfile


class PgServer:
    def __init__(self):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("PostgreSQL server binaries not found (Debian's postgresql package; "
                               "scripts/install_deps.sh installs it)")
        self.bindir = os.path.dirname(bins[-1])
        self.work = tempfile.mkdtemp(prefix="kiln_pg_")
        os.chmod(self.work, 0o777)
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.data = os.path.join(self.work, "data")
        self.port = str(54000 + os.getpid() % 1000)
        self.url = f"postgresql://kiln@/postgres?host={self.work}&port={self.port}"

    def _pg(self, *args):
        return subprocess.run([*self.as_postgres, os.path.join(self.bindir, args[0]), *args[1:]],
                              capture_output=True, text=True)

    def sql(self, statements):
        """Runs SQL on the server (psql); raises on an error."""
        r = subprocess.run([os.path.join(self.bindir, "psql"), "-h", self.work, "-p", self.port, "-U", "kiln",
                            "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", statements], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr}")
        return r.stdout

    def start(self):
        r = self._pg("pg_ctl", "-D", self.data, "-w", "-l", os.path.join(self.work, "log"), "-o",
                     f"-p {self.port} -k {self.work} -c listen_addresses=''", "start")
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {r.stderr}")

    def stop(self, mode="immediate"):
        self._pg("pg_ctl", "-D", self.data, "-w", "-m", mode, "stop")

    def __enter__(self):
        r = self._pg("initdb", "-D", self.data, "-A", "trust", "-U", "kiln")
        if r.returncode != 0:
            shutil.rmtree(self.work, ignore_errors=True)
            raise RuntimeError(f"initdb failed: {r.stderr}")
        try:
            self.start()
        except RuntimeError:
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.work, ignore_errors=True)
        return False
