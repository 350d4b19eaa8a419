"""Asynchronous calls (issue 15): `POST /async-function/{name}` answers 202
once the call is stored; the gateway runs it, retries it after runtime
errors, keeps failures as dead letters to replay, posts results to a
callback URL, and loses no call across a restart."""
import http.client
import http.server
import json
import threading
import time

import pytest

from harness import FUNCS, check_error, own_server, request, send_too_large, wait_for

PY = FUNCS / "async" / "py"


def manifest(root, record_to, record_delay_ms=0):
    m = root / "async.yml"
    m.write_text(f"""
functions:
  record:
    runtime: python
    source: {PY}
    handler: record:handle
    max_workers: 4
    env: {{ RECORD_TO: {record_to}, RECORD_DELAY_MS: "{record_delay_ms}" }}
    async: {{ queue: 20000 }}
  crash:
    runtime: python
    source: {PY}
    handler: crash:handle
    async: {{ retries: 2, backoff: 300ms }}
  throws:
    runtime: python
    source: {PY}
    handler: throws:handle
  flaky:
    runtime: python
    source: {PY}
    handler: flaky:handle
    async: {{ backoff: 20ms }}
  slow:
    runtime: python
    source: {PY}
    handler: slow:handle
    env: {{ RECORD_TO: {record_to} }}
    worker_mode: fork
    min_workers: 2
    max_workers: 2
    async: {{ queue: 3, concurrency: 1 }}
  keyed:
    runtime: python
    source: {PY}
    handler: record:handle
    auth: key
    env: {{ RECORD_TO: {record_to} }}
""")
    return m


class Hook(http.server.BaseHTTPRequestHandler):
    """A callback receiver: records what it is sent; answers the status
    the path asks for (/fail: 500)."""
    got = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Hook.got.append((self.path, dict(self.headers), body))
        self.send_response(500 if self.path.startswith("/fail") else 204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def hook():
    s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s.server_address[1]
    s.shutdown()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    with own_server(root, extra=["--isolation", "process", "--callback-allow", "127.0.0.1/32"]) as s:
        s.record_to = root / "record.log"
        s.root = root
        s.deploy(manifest(root, s.record_to))
        yield s


def submit(srv, name, data=b"", headers=None):
    return request(srv.port, "POST", f"/async-function/{name}", body=data, headers=headers)


def accepted(r):
    assert r.status == 202, r
    v = r.json()
    assert v["state"] == "queued" and v["status_url"] == f"/system/calls/{v['call_id']}", v
    assert r.headers["x-call-id"] == v["call_id"] and r.headers["location"] == v["status_url"], r.headers
    return v["call_id"]


def ended(srv, cid, timeout=30):
    """The call's record once it has ended."""
    last = {}

    def done():
        last["v"] = srv.get(f"/system/calls/{cid}").json()
        return last["v"]["state"] in ("ok", "failed")
    assert wait_for(done, timeout), last
    return last["v"]


def test_a_call_is_accepted_at_once_and_its_result_kept(srv):
    cid = accepted(submit(srv, "record", b"first-1"))
    v = ended(srv, cid)
    assert v["state"] == "ok" and v["attempts"] == 1, v
    assert v["result"]["output"] == "done:first-1" and v["result"]["status"] == 200, v
    assert v["result"]["engine"] and v["result"]["exec_us"] > 0, v
    assert "first-1\n" in srv.record_to.read_text()
    # The CLI: `invoke --async` prints the id; `calls get --output` the result.
    p = srv.cli("invoke", "--async", "record", "-d", "cli-1")
    assert p.returncode == 0, p.stderr
    cid = p.stdout.strip()
    ended(srv, cid)
    p = srv.cli("calls", "get", cid, "--output")
    assert p.returncode == 0 and p.stdout == "done:cli-1", (p.stdout, p.stderr)


def test_runtime_errors_are_retried_then_kept_as_dead_letters_to_replay(srv):
    cid = accepted(submit(srv, "crash", b"x"))
    v = ended(srv, cid)
    assert v["state"] == "failed" and v["attempts"] == 3 == v["max_attempts"], v
    assert [e["error"] for e in v["errors"]] == ["worker_crashed"] * 3, v
    assert v["result"]["error"] == "worker_crashed" and v["result"]["status"] == 502, v
    # Backoff: 300 ms, then 600 ms (give or take a quarter) between attempts
    # (a crashed worker's replacement takes far less).
    at = [e["at_ms"] for e in v["errors"]]
    assert at[1] - at[0] >= 225 and at[2] - at[1] >= 450, at
    p = srv.cli("calls", "--state", "failed", "--function", "crash")
    assert p.returncode == 0 and cid in p.stdout and "worker_crashed" in p.stdout, p.stdout
    listed = srv.get("/system/calls?state=failed&function=crash").json()
    assert cid in [c["id"] for c in listed["calls"]] and listed["by_state"]["failed"] >= 1, listed
    # Replayed: run again from its first attempt; two replays at once run
    # it once (the other is refused).
    replays = []

    def replay():
        replays.append(request(srv.port, "POST", f"/system/calls/{cid}/replay", headers=srv.auth()).status)
    ts = [threading.Thread(target=replay) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(replays) == [202, 409], replays
    v = ended(srv, cid)
    assert v["state"] == "failed" and v["replays"] == 1 and v["attempts"] == 3, v
    assert srv.cli("calls", "replay", cid).returncode == 0
    v = ended(srv, cid)
    assert v["replays"] == 2, v
    # A finished call can be removed.
    p = srv.cli("calls", "rm", cid)
    assert p.returncode == 0, p.stderr
    check_error(srv.get(f"/system/calls/{cid}"), 404, "not_found", call_id=False)
    # A handler's own error is not retried unless retry_on names it.
    v = ended(srv, accepted(submit(srv, "throws", b"no")))
    assert v["state"] == "failed" and v["attempts"] == 1 and v["result"]["error"] == "function_error", v
    assert "refused: no" in v["result"]["message"], v


def test_a_call_that_fails_once_succeeds_on_its_retry(srv, tmp_path):
    marker = tmp_path / "flaky-marker"
    v = ended(srv, accepted(submit(srv, "flaky", str(marker).encode())))
    assert v["state"] == "ok" and v["attempts"] == 2, v
    assert [e["error"] for e in v["errors"]] == ["worker_crashed"], v
    assert v["result"]["output"] == "second time lucky", v


def test_callbacks_receive_results_and_are_retried(srv, hook):
    Hook.got.clear()
    url = f"http://127.0.0.1:{hook}/done?tag=1"
    cid = accepted(submit(srv, "record", b"cb-1", {"X-Callback-Url": url}))
    assert wait_for(lambda: any(p.startswith("/done") for p, _, _ in Hook.got), 15), Hook.got
    path, headers, body = next(g for g in Hook.got if g[0].startswith("/done"))
    h = {k.lower(): v for k, v in headers.items()}
    assert path == "/done?tag=1" and body == b"done:cb-1", (path, body)
    assert h["x-call-id"] == cid and h["x-function-status"] == "200" and h["x-function-name"] == "record", h
    assert wait_for(lambda: srv.get(f"/system/calls/{cid}").json().get("callback_status", {}).get("state")
                    == "delivered", 10)
    # A failed call's callback carries the error as JSON.
    Hook.got.clear()
    cid = accepted(submit(srv, "throws", b"e", {"X-Callback-Url": url}))
    assert wait_for(lambda: Hook.got, 15)
    _, headers, body = Hook.got[0]
    assert {k.lower(): v for k, v in headers.items()}["x-function-status"] == "500", headers
    assert json.loads(body)["error"]["kind"] == "function_error", body
    # A callback that keeps failing is tried 4 times (1 s, 2 s, 4 s apart),
    # then recorded as failed.
    Hook.got.clear()
    cid = accepted(submit(srv, "record", b"cb-2", {"X-Callback-Url": f"http://127.0.0.1:{hook}/fail"}))
    assert wait_for(lambda: len(Hook.got) >= 4, 20), Hook.got
    assert wait_for(lambda: srv.get(f"/system/calls/{cid}").json().get("callback_status", {}).get("state")
                    == "failed", 10)
    cs = srv.get(f"/system/calls/{cid}").json()["callback_status"]
    assert cs["attempts"] == 4 and cs["status"] == 500, cs
    time.sleep(1.5)
    assert len(Hook.got) == 4, Hook.got


def test_hostile_and_bad_requests_get_precise_errors(srv, hook):
    check_error(submit(srv, "nope"), 404, "not_found", call_id=False)
    check_error(submit(srv, "Bad!name"), 404, "not_found", call_id=False)
    for chunked in (False, True):
        check_error(send_too_large(srv.port, "/async-function/record", chunked), 413, "payload_too_large", call_id=False)
    # Callbacks only to http URLs at public or allowed addresses, never
    # the gateway itself (it would call itself), never with a user name.
    for url, words in [("https://example.com/", "http://"),
                       ("http://10.0.0.1/x", "not a public address"),
                       ("http://169.254.169.254/latest/meta-data", "not a public address"),
                       ("http://[::1]:9/", "not a public address"),
                       (f"http://127.0.0.1:{srv.port}/function/record", "this gateway"),
                       ("http://user:pw@example.com/", "user name"),
                       ("http://exa mple.com/", "space")]:
        r = submit(srv, "record", b"x", {"X-Callback-Url": url})
        check_error(r, 400, "bad_request", in_message=words, call_id=False)
    # A function that needs an invoke key needs it for async calls too.
    r = submit(srv, "keyed", b"k")
    check_error(r, 401, "unauthorized", call_id=False)
    p = srv.cli("key", "create", "keyed")
    assert p.returncode == 0, p.stderr
    key = p.stdout.strip().split()[-1]
    v = ended(srv, accepted(submit(srv, "keyed", b"keyed-1", {"Authorization": f"Bearer {key}"})))
    assert v["state"] == "ok", v
    check_error(submit(srv, "keyed", b"k", {"Authorization": "Bearer stk_" + "0" * 64}), 401, "unauthorized",
                call_id=False)
    # Ids, filters and replays that make no sense.
    check_error(srv.get("/system/calls/../../etc"), 404, "not_found", call_id=False)
    check_error(srv.get("/system/calls/" + "0" * 32), 404, "not_found", call_id=False)
    check_error(srv.get("/system/calls?state=lost"), 400, "bad_request", call_id=False)
    check_error(srv.get("/system/calls?limit=0"), 400, "bad_request", call_id=False)
    ok = ended(srv, accepted(submit(srv, "record", b"ok-1")))
    r = request(srv.port, "POST", f"/system/calls/{ok['id']}/replay", headers=srv.auth())
    check_error(r, 409, "conflict", in_message="only a failed call", call_id=False)
    # The management routes need the token.
    assert request(srv.port, "GET", "/system/calls").status == 401


def test_a_full_queue_answers_429_and_sync_calls_are_not_starved(srv):
    # slow: two workers (forked: a sleeping handler blocks no other), an
    # async queue of 3, one async call at a time.
    ids = [accepted(submit(srv, "slow", b"1.0")) for _ in range(3)]
    r = submit(srv, "slow", b"1.0")
    check_error(r, 429, "too_many_requests", in_message="async.queue", call_id=False)
    assert r.headers.get("retry-after") == "1", r.headers
    # The async calls hold one worker; a synchronous call finds the other
    # at once, not after the 3 s of async work queued.
    t = time.monotonic()
    r = srv.invoke("slow", b"0.01", timeout=10)
    assert r.status == 200 and time.monotonic() - t < 2.0, r
    running = [srv.get(f"/system/calls/{i}").json()["state"] for i in ids]
    assert running.count("running") == 1 and running.count("ok") == 0, running
    for i in ids:
        assert ended(srv, i)["state"] == "ok"
    metrics = srv.get("/metrics").body.decode()
    assert 'staccato_async_finished_total{function="slow",outcome="ok"} 3' in metrics, metrics


def test_queued_calls_can_be_cancelled(srv):
    ids = [accepted(submit(srv, "slow", f"0.5{i}".encode())) for i in range(3)]
    last = ids[-1]
    r = request(srv.port, "DELETE", f"/system/calls/{last}", headers=srv.auth())
    assert r.status == 200, r
    check_error(srv.get(f"/system/calls/{last}"), 404, "not_found", call_id=False)
    # One running cannot be removed.
    assert wait_for(lambda: srv.get(f"/system/calls/{ids[0]}").json()["state"] == "running", 5)
    r = request(srv.port, "DELETE", f"/system/calls/{ids[0]}", headers=srv.auth())
    check_error(r, 409, "conflict", in_message="running", call_id=False)
    for i in ids[:-1]:
        assert ended(srv, i)["state"] == "ok"
    ran = srv.record_to.read_text()
    assert "slow:0.50\n" in ran and "slow:0.51\n" in ran and "slow:0.52" not in ran, ran


def _post_many(port, name, inputs, threads=16):
    """Posts each input as an async call; the ids accepted, in input order."""
    out = [None] * len(inputs)

    def worker(k):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in range(k, len(inputs), threads):
            c.request("POST", f"/async-function/{name}", body=inputs[i])
            r = c.getresponse()
            body = r.read()
            assert r.status == 202, (r.status, body)
            out[i] = json.loads(body)["call_id"]
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(out), "some calls were not accepted"
    return out


def _all_ended(srv, n, timeout):
    def done():
        v = srv.get("/system/calls?function=record&limit=1", timeout=30).json()["by_state"]
        return v["ok"] + v["failed"] >= n
    assert wait_for(done, timeout, interval=0.5), srv.get("/system/calls?limit=1").json()


@pytest.mark.parametrize("stop", ["TERM", "KILL"])
def test_calls_survive_a_restart_and_none_runs_twice(tmp_path, stop):
    """10,000 async calls (1,000 with SIGKILL), staccato restarted while
    they run: every call ends ok or as a dead letter. After SIGTERM none
    ran twice (the gateway waits for the attempts under way and stores
    their ends); after SIGKILL only those running or just ended may have
    run again."""
    import signal
    n = 10_000 if stop == "TERM" else 1_000
    record_to = tmp_path / "record.log"
    srv = own_server(tmp_path / "srv", extra=["--isolation", "process"])
    with srv as s:
        # 3 ms a call on 4 workers: the first half takes longer to run
        # (375 ms for SIGKILL's 500) than to post, so the stop comes while
        # calls still run.
        s.deploy(manifest(tmp_path, record_to, record_delay_ms=3))
        inputs = [f"c{i}".encode() for i in range(n)]
        first = _post_many(s.port, "record", inputs[: n // 2])
        # Stop while calls run.
        assert wait_for(lambda: record_to.exists() and record_to.read_text().count("\n") >= n // 10, 60,
                        interval=0.01)
        s.stop(getattr(signal, f"SIG{stop}"))
        ran_before = record_to.read_text().count("\n")
        assert ran_before < n // 2, "every call had run before the stop: it proves nothing"
        s.start(timeout=60)
        second = _post_many(s.port, "record", inputs[n // 2:])
        _all_ended(s, n, timeout=240)
        ids = first + second
        assert len(set(ids)) == n
        v = s.get("/system/calls?function=record&limit=1").json()
        assert v["by_state"]["ok"] + v["by_state"]["failed"] == n and v["total"] == n, v
        lines = record_to.read_text().splitlines()
        counts = {}
        for line in lines:
            counts[line] = counts.get(line, 0) + 1
        missing = [i for i in inputs if i.decode() not in counts]
        failed = v["by_state"]["failed"]
        assert len(missing) <= failed, (len(missing), failed)
        twice = [k for k, c in counts.items() if c > 1]
        if stop == "TERM":
            assert not twice, twice[:10]
            assert failed == 0 and not missing, (failed, missing[:10])
        else:
            # Only calls whose end was not yet written when the process
            # died: the 2 running (half record's 4 workers) and those that
            # had just ended, their records in the log's last batch.
            assert len(twice) <= 32, twice
        log = s.log_path.read_text()
        assert "resumed from the store" in log, s.log_tail()
