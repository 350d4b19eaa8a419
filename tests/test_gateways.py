"""Several gateways share one truth (issue 11): two gateways keep their
functions in one etcd (Debian's etcd-server, started here on loopback with
its data in the test's directory), and engines join both. A deploy through
one is served through the other, reaches an engine that joined only the
other (its source archive travels through etcd), and a restarted gateway
reads it back. With etcd gone, management calls get 503
store_unavailable, and calls to deployed functions are still served.
"""
import contextlib
import secrets
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from harness import BIN, FUNCS, check_error, free_port, ok_body, own_server, request, stop_process, wait_for
from test_cluster import ENGINE_TOKEN, TOKEN, EngineProc, served_by

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class Etcd:
    """A one-member etcd on loopback, its data under `root`."""

    def __init__(self, root):
        self.root = Path(root)
        self.port, self.peer = free_port(), free_port()
        self.proc = None

    def start(self):
        data = self.root / "etcd-data"
        log = open(self.root / "etcd.log", "ab")
        c, p = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
        self.proc = subprocess.Popen(
            [ETCD, "--name", "test", "--data-dir", str(data), "--listen-client-urls", c, "--advertise-client-urls", c,
             "--listen-peer-urls", p, "--initial-advertise-peer-urls", p, "--initial-cluster", f"test={p}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

        def healthy():
            with contextlib.suppress(OSError, ValueError):
                return request(self.port, "GET", "/health", timeout=1).json().get("health") == "true"
            return False
        assert wait_for(healthy, timeout=20), (self.root / "etcd.log").read_text()[-2000:]

    def stop(self):
        if self.proc:
            stop_process(self.proc, signal.SIGTERM)
            self.proc = None


def gateway_argv(port, root, name, store):
    return [str(BIN), "gateway", "--listen", f"127.0.0.1:{port}", "--token", TOKEN, "--engine-token", ENGINE_TOKEN,
            "--state-dir", str(root / name), "--store", store]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    if not Path(ETCD).exists():
        pytest.fail("etcd is not installed: run scripts/setup.sh (it installs Debian's etcd-server)")
    root = tmp_path_factory.mktemp("gateways")
    etcd = Etcd(root)
    etcd.start()
    store = f"etcd://127.0.0.1:{etcd.port}/test-{secrets.token_hex(4)}"
    pa, pb = free_port(), free_port()
    engines = [EngineProc(root, [pa, pb], f"engine{i}", extra=["--label", f"host=engine{i}"]) for i in range(2)]
    try:
        with own_server(root / "a", port=pa, argv=gateway_argv(pa, root, "a-state", store), token=TOKEN) as a, \
                own_server(root / "b", port=pb, argv=gateway_argv(pb, root, "b-state", store), token=TOKEN) as b:
            for g in (a, b):
                assert wait_for(lambda: len(ready_ids(g)) == 2, timeout=20), g.get("/system/engines").json()
            (root / "staccato.yml").write_text(
                f"functions:\n  echo:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n")
            a.deploy(root / "staccato.yml")
            a.root, a.store, a.etcd, a.engines, a.b = root, store, etcd, engines, b
            yield a
    except BaseException:
        for p in engines:
            print(f"--- tail of {p.log}\n" + "\n".join(p.log.read_text(errors="replace").splitlines()[-20:]))
        raise
    finally:
        for p in engines:
            p.stop()
        etcd.stop()


def ready_ids(g):
    r = g.get("/system/engines")
    assert r.status == 200, r
    return [e["id"] for e in r.json() if e["state"] == "ready"]


def functions_on(g, engine_id):
    return next((e["functions"] for e in g.get("/system/engines").json() if e["id"] == engine_id), [])


def test_a_deploy_through_one_gateway_is_served_through_the_other(two):
    a, b = two, two.b
    assert ok_body(b.invoke("echo", b"via b")) == b"via b"
    assert b.function("echo")["runtime"] == "python"
    # A placed function: the other gateway routes by the placement it reads
    # from the store, within its watch period.
    (a.root / "placed.yml").write_text(
        f"functions:\n  placed:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
        "    placement: {labels: {host: engine1}}\n")
    a.deploy(a.root / "placed.yml")
    e1 = a.engines[1].id

    def routed():
        return Counter(served_by(b.invoke("placed", b"p")) for _ in range(10)) == {e1: 10}
    assert wait_for(routed, timeout=5)


def test_invoke_keys_made_or_revoked_through_one_gateway_hold_at_the_other(two):
    """Keys live in the shared store: the other gateway sees a new key, a
    revoked one, and a function's `auth: key`, within its watch period."""
    a, b = two, two.b
    (a.root / "locked.yml").write_text(
        f"functions:\n  locked:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
        "    auth: key\n")
    a.deploy(a.root / "locked.yml")
    # At once, though b has not read the store since: the engine refuses
    # the call b sends unchecked, and b judges it again.
    r = b.invoke("locked", b"x")
    assert r.status == 401 and r.json()["error"]["kind"] == "unauthorized", r
    made = request(a.port, "POST", "/system/keys/locked", headers=a.auth())
    assert made.status == 201, made
    key, key_id = made.json()["key"], made.json()["id"]
    with_key = {"Authorization": f"Bearer {key}"}
    assert wait_for(lambda: b.invoke("locked", b"k", headers=with_key).status == 200, timeout=5)
    assert [k["id"] for k in b.get("/system/keys/locked").json()["keys"]] == [key_id]
    assert request(b.port, "DELETE", f"/system/keys/locked/{key_id}", headers=b.auth()).status == 200
    assert wait_for(lambda: a.invoke("locked", b"k", headers=with_key).status == 401, timeout=5)

    # Made and revoked between two of a gateway's reads of the store: the
    # store is then as it was before the key (as many entries, the same
    # newest write), yet the gateway that made it must see it go.
    time.sleep(1.2)  # a has read the store as it is now
    made = request(a.port, "POST", "/system/keys/locked", headers=a.auth())
    assert made.status == 201, made
    with_key = {"Authorization": f"Bearer {made.json()['key']}"}
    assert a.invoke("locked", b"k", headers=with_key).status == 200
    assert request(b.port, "DELETE", f"/system/keys/locked/{made.json()['id']}", headers=b.auth()).status == 200
    assert wait_for(lambda: a.invoke("locked", b"k", headers=with_key).status == 401, timeout=5)
    assert b.cli("rm", "locked").returncode == 0


def test_async_calls_are_kept_in_the_shared_store(two):
    """An async call accepted by one gateway is run by it, and its result
    is read through the other; an input too large for an etcd value is
    refused up front."""
    a, b = two, two.b
    ids = []
    for i in range(20):
        r = request(a.port, "POST", "/async-function/echo", body=f"async-{i}".encode())
        assert r.status == 202, r
        ids.append(r.json()["call_id"])

    def state(g, cid):
        return g.get(f"/system/calls/{cid}").json()
    assert wait_for(lambda: all(state(b, c)["state"] == "ok" for c in ids), timeout=30), state(b, ids[-1])
    assert [state(b, c)["result"]["output"] for c in ids] == [f"async-{i}" for i in range(20)]
    listed = b.get("/system/calls?function=echo").json()
    assert set(ids) <= {c["id"] for c in listed["calls"]}, listed
    r = request(a.port, "POST", "/async-function/echo", body=b"x" * ((1 << 20) + 1))
    check_error(r, 413, "payload_too_large", in_message="shared store", call_id=False)


def test_an_engine_that_joined_only_the_other_gateway_gets_the_functions(two):
    """Its gateway never saw the source archives: they come from etcd. A
    deploy through the other gateway afterwards reaches it too (the store's
    revision changes, its gateway reconciles it)."""
    a, b = two, two.b
    late = EngineProc(a.root, [b.port], "late-engine", extra=["--label", "host=late"])
    a.engines.append(late)
    assert wait_for(lambda: late.id in ready_ids(b), timeout=30), b.get("/system/engines").json()
    assert "echo" in functions_on(b, late.id)
    assert late.id not in [e["id"] for e in a.get("/system/engines").json()]
    (a.root / "fresh.yml").write_text(
        f"functions:\n  fresh:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n"
        "    placement: {labels: {host: late}}\n")
    # Through gateway a, which has no engine with that label: refused.
    out = a.cli("deploy", str(a.root / "fresh.yml"), timeout=60)
    assert out.returncode != 0 and "host=late" in out.stdout + out.stderr, out.stdout + out.stderr
    # Through b, which has one; a then lists it, and b serves it there.
    b.deploy(a.root / "fresh.yml")
    assert served_by(b.invoke("fresh", b"f")) == late.id
    assert a.function("fresh")["placement"]["labels"] == {"host": "late"}
    # A new version through a reaches the late engine through b's
    # reconciliation: fresh2 runs everywhere.
    (a.root / "fresh2.yml").write_text(
        f"functions:\n  fresh2:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n")
    a.deploy(a.root / "fresh2.yml")
    assert wait_for(lambda: "fresh2" in functions_on(b, late.id), timeout=15), functions_on(b, late.id)
    # Removed through a: gone from the engine only b knows too.
    assert a.cli("rm", "fresh2").returncode == 0
    assert wait_for(lambda: "fresh2" not in functions_on(b, late.id), timeout=15), functions_on(b, late.id)


def test_a_restarted_gateway_reads_the_store_back(two):
    b = two.b
    before = sorted(f["name"] for f in b.get("/system/functions").json())
    b.stop()
    b.start()
    after = sorted(f["name"] for f in b.get("/system/functions").json())
    assert after == before and "echo" in after, (before, after)
    assert wait_for(lambda: len(ready_ids(b)) >= 2, timeout=20)
    assert ok_body(b.invoke("echo", b"back")) == b"back"


def test_an_unreachable_store_refuses_management_calls_and_calls_go_on(two):
    a = two
    a.etcd.stop()
    try:
        check_error(a.get("/system/functions"), 503, "store_unavailable", call_id=False)
        out = a.cli("deploy", str(a.root / "staccato.yml"), timeout=60)
        assert out.returncode != 0 and "store" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
        # Refused before any engine was given it: nothing runs a function
        # the store does not have.
        (a.root / "ghost.yml").write_text(
            f"functions:\n  ghost:\n    runtime: python\n    source: {FUNCS / 'py'}\n    handler: echo:handle\n")
        out = a.cli("deploy", str(a.root / "ghost.yml"), timeout=60)
        assert out.returncode != 0, out.stdout + out.stderr
        time.sleep(0.5)  # two status rounds
        assert all("ghost" not in functions_on(a, e.id) for e in a.engines[:2])
        r = request(a.port, "DELETE", "/system/functions/echo", headers=a.auth())
        check_error(r, 503, "store_unavailable", call_id=False)
        # Calls to what is deployed do not need the store.
        for _ in range(10):
            assert ok_body(a.invoke("echo", b"still")) == b"still"
    finally:
        a.etcd.start()
    assert a.get("/system/functions").status == 200
    assert ok_body(a.b.invoke("echo", b"again")) == b"again"
