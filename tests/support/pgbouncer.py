"""
A real PgBouncer in transaction mode in front of the test's PostgreSQL
server (Debian's ``pgbouncer`` package, which ``.ci/run`` installs), started
and stopped by the test that needs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from tests.support.children import poll_until

#: Where Debian installs it.
PGBOUNCER = "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _config(folder: Path, port: int, pool_size: int) -> Path:
    settings = connection.settings_dict
    user = settings["USER"] or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={settings['HOST'] or '127.0.0.1'} port={settings['PORT'] or 5432}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 200\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    return ini


@contextmanager
def pgbouncer(pool_size: int = 3) -> Iterator[str]:
    """
    Start a PgBouncer in transaction mode with ``pool_size`` server
    sessions per database, in front of this test's server; yield the URL of
    the live test database through it; stop it after.
    """
    assert os.access(PGBOUNCER, os.X_OK), f"{PGBOUNCER} is missing: install Debian's pgbouncer package"
    folder = Path(tempfile.mkdtemp(prefix="pikku-pgbouncer-"))
    port = _free_port()
    ini = _config(folder, port, pool_size)
    command = [PGBOUNCER, "-q", str(ini)]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root.
        shutil.chown(folder, user="postgres")
        for path in folder.iterdir():
            shutil.chown(path, user="postgres")
        command[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        poll_until(lambda: _accepts(port) or proc.poll() is not None, timeout=10)
        log = folder / "pgbouncer.log"
        assert proc.poll() is None, f"pgbouncer exited: {log.read_text() if log.exists() else ''}"
        settings = connection.settings_dict
        yield f"postgres://{settings['USER'] or 'postgres'}@127.0.0.1:{port}/{settings['NAME']}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
