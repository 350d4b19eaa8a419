"""What operators graph (issue 16, metrics): `/metrics` has the engine's
split of each call (queue and execution time histograms), cold starts,
each engine's live state (up, τ, workers, queued, paused) and the async
queue; the Grafana dashboard in deploy/grafana uses exactly these names."""
import json
import re

import pytest

from harness import FUNCS, REPO, ok_body, own_server, request, wait_for

DASHBOARD = REPO / "deploy" / "grafana" / "staccato-dashboard.json"


def samples(text):
    """{metric name: [(labels, value)]} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$', line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    with own_server(root) as s:
        s.deploy(FUNCS / "staccato.yml")
        for i in range(5):
            assert ok_body(s.invoke("echo", b"m%d" % i)) == b"m%d" % i
        assert s.invoke("fail", b"x").status == 500
        r = request(s.port, "POST", "/async-function/echo", body=b"a")
        assert r.status == 202, r
        cid = r.json()["call_id"]
        assert wait_for(lambda: s.get(f"/system/calls/{cid}").json()["state"] == "ok", 20)
        r = request(s.port, "GET", "/metrics")
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
        yield samples(r.body.decode())


def value(page, name, **labels):
    for lab, v in page.get(name, []):
        if all(f'{k}="{val}"' in lab for k, val in labels.items()):
            return v
    raise AssertionError(f"no {name} with {labels}: {page.get(name)}")


def test_the_engine_split_and_live_state_are_there(page):
    # Five calls of echo, every one timed by the engine.
    assert value(page, "staccato_invocations_total", function="echo", outcome="ok") == 5
    assert value(page, "staccato_queue_seconds_count", function="echo") == 5
    assert value(page, "staccato_execution_seconds_count", function="echo") == 5
    assert value(page, "staccato_execution_seconds_bucket", function="echo", le="+Inf") == 5
    assert value(page, "staccato_execution_seconds_sum", function="echo") > 0
    assert value(page, "staccato_invocations_total", function="fail", outcome="function_error") == 1
    assert "staccato_cold_starts_total" in page
    assert value(page, "staccato_engine_up") == 1
    assert value(page, "staccato_tau", function="echo") >= 1
    assert value(page, "staccato_workers", function="echo") >= 1
    assert value(page, "staccato_workers_busy", function="echo") == 0
    assert value(page, "staccato_queued", function="echo") == 0
    assert "staccato_container_paused" in page and "staccato_worker_ready_seconds" in page
    # The engine's isolation pool (`staccato up` has containers here): the
    # functions deployed took containers from it, and it refilled.
    assert value(page, "staccato_pool_target") >= 1
    assert value(page, "staccato_pool_created_total") >= value(page, "staccato_pool_target")
    assert "staccato_pool_idle" in page and "staccato_pool_misses_total" in page
    assert "staccato_pool_reused_total" in page and "staccato_pool_destroyed_total" in page
    assert value(page, "staccato_async_finished_total", function="echo", outcome="ok") == 1
    assert value(page, "staccato_async_queued", function="echo") == 0


def test_every_dashboard_query_uses_metrics_that_exist(page):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 20, exprs
    used = set()
    for e in exprs:
        used |= set(re.findall(r"\bstaccato_[a-z0-9_]+", e))
    missing = sorted(m for m in used if m not in page)
    assert not missing, f"the dashboard queries metrics /metrics does not have: {missing}"
    # And it graphs every family /metrics has (no metric nobody can see).
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in page}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, sorted(families - shown)
