"""The SocialNetwork application (issue 12, examples/socialnet) on real
Redis, memcached and PostgreSQL servers, small data: it answers correctly
in every variant (Staccato by default, with internal calls through the
gateway, with managed concurrency off, and as RPC servers), each variant
does what it says, and killing a function's worker under load loses no
post whose compose was answered.

Needs root and runc (function containers) and the stores from Debian's
packages (scripts/setup.sh installs them).
"""
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from harness import REPO, free_port

sys.path.insert(0, str(REPO / "examples" / "socialnet"))
from snlib import check, data, stores, variants  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runc"), reason="the application's functions run in runc containers (root)")

USERS, EDGES = 80, 600


class App:
    """The stores, the data, and one variant at a time on them. The
    Staccato variants share one state directory: the first deploys, the
    others start on it with their own flags."""

    def __init__(self, root):
        self.root = root
        self.stores = stores.Stores(root / "stores", redis_port=free_port(), memcached_port=free_port(),
                                    pg_port=free_port())
        self.state = root / "staccato-state"
        self.current = None
        self.graph = None
        self.deployed = False

    def start(self, name):
        self.stop()
        if name == "rpc":
            v = variants.RpcVariant(self.root / "variants", None, self.stores, port_fn=lambda i: free_port())
            v.start(progress=lambda m: None)
        else:
            v = variants.make(name, self.root / "variants", free_port(), self.stores, state=self.state)
            v.start(progress=lambda m: None, deploy=not self.deployed)
            self.deployed = True
        self.current = v
        return v

    def stop(self):
        if self.current:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def app():
    # PostgreSQL runs as user postgres: its directory must be reachable by
    # it (pytest's own tmp_path is under a directory only root can enter).
    root = Path(tempfile.mkdtemp(prefix="socialnet-test-", dir="/tmp"))
    root.chmod(0o755)
    a = App(root)
    try:
        a.stores.up(progress=lambda m: None)
        v = a.start("staccato")
        a.graph = data.load(data.Api(v.url), USERS, EDGES, posts_per_user=1, threads=8, progress=lambda m: None)
        yield a
    finally:
        a.stop()
        a.stores.down()
        shutil.rmtree(root, ignore_errors=True)


def counted_at_gateway(v):
    """Calls of each function the gateway took (its /metrics), by name."""
    _, body = variants.http_get(v.port, "/metrics")
    out = {}
    for m in re.finditer(rb'staccato_invocations_total\{function="([^"]+)",outcome="[^"]+"\} (\d+)', body):
        out[m[1].decode()] = out.get(m[1].decode(), 0) + int(m[2])
    return out


def test_the_default_variant_answers_correctly_and_calls_stay_on_the_engine(app):
    v = app.current
    assert v.name == "staccato"
    check.check(data.Api(v.url), app.graph, users=USERS, seed=1)
    # Internal calls never reached the gateway: it counts only the API
    # functions the client called.
    seen = counted_at_gateway(v)
    assert seen.get("sn-post-compose", 0) > 0, seen
    assert not any(seen.get(s) for s in variants.GO_SERVICES + list(variants.PY_SERVICES)), seen


def test_a_worker_killed_under_load_loses_no_committed_post(app):
    """Eight clients compose posts while every process of sn-post-storage is
    SIGKILLed: each compose is answered once, those answered 200 are stored
    and on their author's timeline, and the function serves again after."""
    v = app.current
    api = data.Api(v.url, timeout=30)
    results, lock, stop = [], threading.Lock(), threading.Event()

    def client(i):
        import random
        rng = random.Random(i)
        while not stop.is_set():
            req = data.compose_request(rng, USERS)
            try:
                out = api.call("sn-post-compose", req)
                r = ("ok", req["user_id"], out["post_id"])
            except data.CallFailed as e:
                r = ("error", e.status, e.body)
            with lock:
                results.append(r)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    try:
        time.sleep(2)
        killed = v.kill_function("sn-post-storage")
        time.sleep(3)
    finally:
        stop.set()
        for t in ts:
            t.join(60)
    assert killed, "no process of sn-post-storage was found to kill"
    assert not any(t.is_alive() for t in ts), "a compose was never answered"
    ok = [r for r in results if r[0] == "ok"]
    errors = [r for r in results if r[0] == "error"]
    print(f"composes: {len(ok)} ok, {len(errors)} failed by the kill of {len(killed)} processes")
    assert len(ok) > 20, f"too little load: {len(ok)} ok, {len(errors)} errors"
    # Failures are the crash, reported as such, never something vaguer.
    for _, status, body in errors:
        assert status == 500 and b"worker_crashed" in body, (status, body)
    post_ids = [r[2] for r in ok]
    assert len(set(post_ids)) == len(post_ids), "a post id was answered twice"
    stored = set(int(x) for x in app.stores.psql(
        f"SELECT post_id FROM posts WHERE post_id IN ({','.join(map(str, post_ids))})").split())
    assert stored == set(post_ids), f"{len(set(post_ids) - stored)} answered posts are not stored"
    on_timeline = set(int(x) for x in app.stores.psql(
        f"SELECT post_id FROM user_timeline WHERE post_id IN ({','.join(map(str, post_ids))})").split())
    assert on_timeline == set(post_ids), f"{len(set(post_ids) - on_timeline)} answered posts are on no timeline"
    # Served again: the engine replaced the dead launcher.
    check.compose_and_verify(api, app.graph, seed=2, users=USERS)


def test_internal_calls_through_the_gateway(app):
    v = app.start("staccato-via-gateway")
    before = counted_at_gateway(v)
    check.check(data.Api(v.url), app.graph, users=USERS, seed=3)
    after = counted_at_gateway(v)
    grew = {f for f in variants.GO_SERVICES + list(variants.PY_SERVICES) if after.get(f, 0) > before.get(f, 0)}
    # A compose reaches every one of these through the gateway.
    want = {"sn-compose-post", "sn-text", "sn-url-shorten", "sn-user-mention", "sn-unique-id", "sn-media",
            "sn-user", "sn-post-storage", "sn-user-timeline", "sn-home-timeline", "sn-social-graph"}
    assert want <= grew, f"not seen at the gateway: {sorted(want - grew)}"


def test_managed_concurrency_off_runs_every_function_at_max_workers(app):
    v = app.start("staccato-fixed")
    check.check(data.Api(v.url), app.graph, users=USERS, seed=4)
    taus = {f["name"]: f["status"]["scheduler"]["tau"] for f in v.functions()}
    assert set(taus.values()) == {32}, taus


def test_the_rpc_servers_answer_correctly(app):
    v = app.start("rpc")
    api = data.Api(v.url)
    check.check(api, app.graph, users=USERS, seed=5)
    served = v.calls_total()
    # Every service took calls from another, never from the client.
    assert all(served[s] > 0 for s in variants.GO_SERVICES + list(variants.PY_SERVICES)), served
    # A bad request is refused with the same error shape as the gateway's.
    with pytest.raises(data.CallFailed) as e:
        api.call("sn-home-timeline-read", {"user_id": 1, "start": 5, "stop": 1})
    assert e.value.status == 500 and b"function_error" in e.value.body and b"start and stop" in e.value.body
    with pytest.raises(data.CallFailed) as e:
        api.call("sn-nope", {})
    assert e.value.status == 404 and b"not_found" in e.value.body


def test_bad_requests_get_precise_errors(app):
    v = app.start("staccato")
    api = data.Api(v.url)
    cases = [
        ("sn-post-compose", {"username": "user_1", "user_id": 1, "text": "x", "media_ids": [1], "media_types": []},
         b"pair up"),
        ("sn-post-compose", {"username": "user_1", "user_id": 1, "text": "x", "bogus": 1}, b"unknown field"),
        ("sn-user-register", {"username": data.username(1), "password": "p", "user_id": 1}, b"already registered"),
        ("sn-user-login", {"username": "nobody_here", "password": "p"}, b"no user named"),
        ("sn-user-timeline-read", {"user_id": 0, "start": 0, "stop": 10}, b"user_id"),
    ]
    for name, body, want in cases:
        with pytest.raises(data.CallFailed) as e:
            api.call(name, body)
        assert e.value.status == 500 and want in e.value.body, (name, e.value)
    with pytest.raises(data.CallFailed) as e:
        api.call("sn-post-compose", b"{not json")
    assert e.value.status == 500 and b"bad request" in e.value.body, e.value
    # The application still serves.
    check.compose_and_verify(api, app.graph, seed=6, users=USERS)
