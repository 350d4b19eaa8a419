"""The live dashboard (issue 16) in a real headless Chromium (Debian's
`chromium`, driven by Playwright): the page asks for the management
token, shows the deployed functions, their call counts rise while a load
runs, a failing call shows as an error, an internal call chain shows as
one tree; the data routes refuse a request without the token. The run
leaves a screenshot in its temporary directory (its path is printed)."""
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

from harness import FUNCS, own_server

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is installed by scripts/setup.sh")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="needs Debian's chromium (scripts/setup.sh installs it)")


def until(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_data_needs_the_token_and_the_page_holds_none(tmp_path):
    with own_server(tmp_path / "srv") as srv:
        for path in ("/system/dashboard", "/system/dashboard/stream"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(srv.gateway + path, timeout=10)
            assert e.value.code == 401, path
            assert json.loads(e.value.read())["error"]["kind"] == "unauthorized"
        # From another site's page: refused even with the token.
        req = urllib.request.Request(srv.gateway + "/system/dashboard/stream",
                                     headers={**srv.auth(), "Sec-Fetch-Site": "cross-site"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403
        # The page and its script: static, no data, no framing, own scripts only.
        with urllib.request.urlopen(srv.gateway + "/ui", timeout=10) as r:
            page = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/html")
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        assert srv.token not in page and "<script src=\"/ui/app.js\">" in page
        # With the token: a snapshot, then events of the stream.
        req = urllib.request.Request(srv.gateway + "/system/dashboard", headers=srv.auth())
        snap = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert set(snap) >= {"time_ms", "bounds_s", "functions", "engines", "recent"}, snap
        assert [e["state"] for e in snap["engines"]] == ["ready"], snap["engines"]
        req = urllib.request.Request(srv.gateway + "/system/dashboard/stream", headers=srv.auth())
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            times = []
            while len(times) < 2:
                line = r.readline().decode()
                if line.startswith("data: "):
                    times.append(json.loads(line[6:])["time_ms"])
            assert times[1] > times[0], times


def test_dashboard_in_chromium_shows_calls_live(tmp_path):
    with own_server(tmp_path / "srv") as srv:
        srv.deploy(FUNCS)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 950})
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                # Without the token the page asks for it and shows nothing.
                page.goto(f"{srv.gateway}/ui")
                page.wait_for_selector("#login-box:not([hidden])", timeout=15000)
                assert page.locator("#functions tbody tr").count() == 0
                # A wrong token is refused; the right one (as `staccato ui`
                # prints it, in the fragment) connects and leaves the URL.
                page.fill("#token", "not-the-token")
                page.click("#login button")
                page.wait_for_selector("text=That token was refused.", timeout=15000)
                link = srv.cli("ui").stdout.strip()
                assert link == f"{srv.gateway}/ui#token={srv.token}", link
                page.goto(link)
                page.wait_for_selector('#functions tr[data-function="echo"]', timeout=15000)
                assert "token" not in page.url
                assert page.text_content("#status") == "live"

                def calls(fn):
                    return int(page.text_content(f'tr[data-function="{fn}"] td.calls'))

                seen = []
                done = threading.Event()

                def load():
                    for i in range(300):
                        srv.invoke("echo", f"call {i}".encode())
                        time.sleep(0.01)
                    done.set()

                t = threading.Thread(target=load)
                t.start()
                # The count rises while the load runs, not only at its end.
                while not done.is_set():
                    seen.append(calls("echo"))
                    time.sleep(0.3)
                t.join()
                until("all 300 calls on the page", lambda: calls("echo") >= 300)
                rising = sorted(set(x for x in seen if 0 < x < 300))
                assert len(rising) >= 2, seen
                rate = float(page.text_content('tr[data-function="echo"] td.rate'))
                assert rate > 0, rate
                assert page.text_content('tr[data-function="echo"] td.p50') not in ("", "–")

                # A failing call: an error in its row, a red span among the calls.
                assert srv.invoke("fail", b"boom").status == 500
                until("fail's error on the page",
                      lambda: page.text_content('tr[data-function="fail"] td.errors') == "1")
                assert "some" in page.get_attribute('tr[data-function="fail"] td.errors', "class")
                page.wait_for_selector('#recent .span[data-function="fail"][data-outcome="function_error"]',
                                       timeout=15000)
                # An internal chain shows as one tree of three calls.
                assert srv.invoke("chain-a", b"x").status == 200
                tree = page.wait_for_selector('#recent .tree:has(.span[data-function="chain-c"])', timeout=15000)
                assert [s.get_attribute("data-function") for s in tree.query_selector_all(".span")] == \
                    ["chain-a", "chain-b", "chain-c"]
                assert page.text_content('#engines td.state') == "ready"
                # The engine's isolation pool (containers ready / kept ready).
                assert re.fullmatch(r"\d+ / [1-9]\d*", page.text_content('#engines td.pool')), \
                    page.text_content('#engines td.pool')
                shot = tmp_path / "dashboard.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
                print(f"dashboard screenshot: {shot}")
                assert not errors, errors
            finally:
                browser.close()
