"""Through a real router process: oversized heads are answered 431 and the router keeps serving;
the admin API takes only its own credential, or loopback without one; probes stay out of the log."""

from __future__ import annotations

import contextlib
import json
import socket

import httpx
import pytest

from conftest import Cluster, wait_until

pytestmark = pytest.mark.timeout(120)

MB = 1 << 20


def raw_exchange(port: int, head: bytes, *, timeout: float = 10.0) -> bytes:
    """Send bytes on a fresh connection; everything the router answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # The router may answer and stop reading before it has the rest: read what it said.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def error_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def machine_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.254", 9))  # no packet is sent: this only picks a source address
            address = sock.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_a_1_mb_header_is_answered_431_and_the_router_keeps_serving(cluster: Cluster):
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(cluster.write_workers([w0.entry()]), wait=False)
    router.wait_rotation({"w0"}, timeout=40)
    big = b"GET /whoami HTTP/1.1\r\nHost: router\r\nX-Session-Id: " + b"s" * MB + b"\r\n\r\n"
    status, body = error_of(raw_exchange(router.port, big))
    assert status == 431
    assert body == {
        "error": {
            "message": "The request line and headers are larger than the router's limit of 65536 bytes "
            "(--max-header-bytes); send smaller headers.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_headers_too_large",
        }
    }
    # A head that never ends is refused as well, without waiting for its end.
    status, body = error_of(raw_exchange(router.port, b"GET / HTTP/1.1\r\nX-A: " + b"a" * (2 * MB)))
    assert (status, body["error"]["code"]) == (431, "request_headers_too_large")
    with httpx.Client(base_url=router.url, trust_env=False, timeout=5) as client:
        too_long = client.get("/whoami", headers={"X-Session-Id": "k" * 257})
        assert too_long.status_code == 431
        assert too_long.json()["error"]["code"] == "session_key_too_long"
        assert client.get("/health").status_code == 200
        answer = client.get("/whoami", headers={"X-Session-Id": "k" * 256})
        assert answer.status_code == 200 and answer.json()["worker"] == "w0"
    # Nothing the client sent made it into the log whole.
    router.stop()
    assert max(len(line) for line in router.log.read_text().splitlines()) < 4096


def test_admin_takes_the_admin_key_only(cluster: Cluster, tmp_path):
    keys, admin = tmp_path / "keys", tmp_path / "admin"
    keys.write_text("sk-client\n")
    admin.write_text("# operators\nadm-secret\n")
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(
        cluster.write_workers([w0.entry()]),
        "--api-keys-file",
        str(keys),
        "--admin-keys-file",
        str(admin),
        wait=False,
    )
    wait_until(lambda: _status(f"{router.url}/health") == 200, timeout=30, what="router", log=router.log)
    client_key = {"Authorization": "Bearer sk-client"}
    admin_key = {"Authorization": "Bearer adm-secret"}
    with httpx.Client(base_url=router.url, trust_env=False, timeout=5) as client:
        refused = client.post("/admin/workers/w0/drain", headers=client_key)
        assert refused.status_code == 403
        assert refused.json() == {
            "error": {
                "message": "A client API key cannot use the admin API: send `Authorization: Bearer <key>` "
                "with a key from the router's --admin-keys-file.",
                "type": "invalid_request_error",
                "param": None,
                "code": "admin_forbidden",
            }
        }
        missing = client.get("/admin/workers")  # loopback is no substitute once admin keys exist
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "invalid_admin_key")
        assert missing.headers["www-authenticate"] == "Bearer"
        assert client.get("/admin/workers", headers={"Authorization": "Bearer sk-clien"}).status_code == 401
        assert client.get("/v1/models", headers=admin_key).status_code == 401  # not a client key either
        router.wait_rotation({"w0"}, timeout=40, headers=admin_key)
        drained = client.post("/admin/workers/w0/drain", headers=admin_key)
        assert drained.status_code == 200 and drained.json()["state"] == "draining"
        assert client.get("/whoami", headers=client_key).status_code == 503  # nothing left in rotation


def test_without_admin_keys_admin_answers_on_loopback_only(cluster: Cluster, tmp_path):
    address = machine_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to call the router from")
    keys = tmp_path / "keys"
    keys.write_text("sk-client\n")
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(
        cluster.write_workers([w0.entry()]), "--api-keys-file", str(keys), "--host", "0.0.0.0", wait=False
    )
    router.wait_rotation({"w0"}, timeout=40)  # over loopback, with no key at all
    remote = f"http://{address}:{router.port}"
    with httpx.Client(base_url=remote, trust_env=False, timeout=5) as client:
        for headers in ({}, {"Authorization": "Bearer sk-client"}):
            refused = client.post("/admin/workers/w0/drain", headers=headers)
            assert (refused.status_code, refused.json()["error"]["code"]) == (403, "admin_forbidden")
        assert client.get("/whoami", headers={"Authorization": "Bearer sk-client"}).json()["worker"] == "w0"
    assert router.workers()["w0"]["state"] == "ready"


def test_the_router_binds_loopback_by_default(cluster: Cluster, tmp_path):
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(cluster.write_workers([w0.entry()]))
    # The harness passes --host 127.0.0.1; start the same router without it to see the default.
    argv = list(router.popen.args)  # type: ignore[arg-type]
    router.stop()
    while "--host" in argv:
        index = argv.index("--host")
        del argv[index : index + 2]
    popen, log = cluster._spawn("router-default", argv)
    try:
        wait_until(
            lambda: b"Uvicorn running on" in log.read_bytes(), timeout=30, what="router listening", log=log
        )
        assert b"Uvicorn running on http://127.0.0.1:" in log.read_bytes()
        address = machine_address()
        if address is not None:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"http://{address}:{router.port}/health", trust_env=False, timeout=2)
    finally:
        popen.terminate()
        popen.wait(timeout=10)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2.0, trust_env=False).status_code
    except httpx.HTTPError:
        return None


def test_probes_leave_no_log_line_while_requests_do(cluster: Cluster):
    (w0,) = cluster.upstreams("w0", wait=False)
    router = cluster.router(cluster.write_workers([w0.entry()]), wait=False)
    router.wait_rotation({"w0"}, timeout=40)
    with httpx.Client(base_url=router.url, trust_env=False, timeout=5) as client:
        for _ in range(5):
            assert client.get("/health").status_code == 200
            assert client.get("/ready").status_code == 200
        assert client.get("/whoami").status_code == 200
    # Request lines leave in batches (at most BufferedLineHandler.FLUSH_S later): wait for this one
    # rather than count on the exit's flush (a router slow to stop on a busy machine is killed).
    wait_until(
        lambda: b'"/whoami"' in router.log.read_bytes(), timeout=10, what="the request line", log=router.log
    )
    router.stop()
    lines = [json.loads(line) for line in router.log.read_text().splitlines() if line.startswith("{")]
    paths = [line.get("path") for line in lines if line.get("event") == "request"]
    assert paths == ["/whoami"]
    assert not [line for line in lines if "/health" in line["msg"] or "/ready" in line["msg"]]
