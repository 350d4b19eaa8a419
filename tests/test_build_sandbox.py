"""Deploy-time code runs in the build sandbox (issue 9, item 1).

A deployer controls code that runs while a function is built: a PEP 517
build backend named by requirements.txt, npm install scripts (here through
the project's own .npmrc), C compiler input (`.incbin`), and cgo in a Go
build. Each attack below tries to read a host secret and /etc/shadow, write
a file on the host, and reach a loopback service; each must fail, and what
ran must have run as an unprivileged user.
"""
import json
import re
import socket
import threading
import urllib.parse
from pathlib import Path

import pytest

from harness import ok_body, own_server, wait_for


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with own_server(tmp_path_factory.mktemp("build")) as s:
        yield s


@pytest.fixture
def host(tmp_path):
    """A secret on the host, where a write would land, and a loopback
    listener that records any connection."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-7d41\n")
    marker = tmp_path / "written-by-build"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    hits = []

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            hits.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield {"secret": secret, "marker": marker, "port": listener.getsockname()[1], "hits": hits}
    listener.close()


PY_ATTACK = r'''
import os, socket, sys

def attempt(f):
    try:
        return "OK:" + str(f())[:40]
    except Exception as e:
        return type(e).__name__

def via_proxy():
    proxy = os.environ.get("HTTPS_PROXY", "")
    hp = proxy.split("//")[-1]
    h, p = hp.rsplit(":", 1)
    s = socket.create_connection((h, int(p)), timeout=3)
    s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % PORT)
    return s.recv(200).split(b"\r\n")[0].decode().replace(" ", "_")

results = {
    "uid": os.getuid(),
    "shadow": attempt(lambda: open("/etc/shadow").read()),
    "secret": attempt(lambda: open(SECRET).read()),
    "write": attempt(lambda: open(MARKER, "w").write("x")),
    "net": attempt(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3)),
    "proxy": attempt(via_proxy),
}
print("ATTACK " + " ".join(f"{k}={v}" for k, v in results.items()), file=sys.stderr, flush=True)
raise SystemExit(1)
'''


def _attack_results(text):
    m = re.search(r"ATTACK (uid=.*)", text)
    assert m, f"the attack did not run (or its output was lost):\n{text}"
    print(m.group(0))
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def _check_contained(results, host, output):
    assert results["uid"] not in ("0", ""), results
    assert not results["shadow"].startswith("OK"), results
    assert not results["secret"].startswith("OK"), results
    assert not results["write"].startswith("OK"), results
    assert not results["net"].startswith("OK"), results
    assert "403" in results["proxy"] or not results["proxy"].startswith("OK"), results
    assert not host["marker"].exists()
    assert host["hits"] == [], "a build reached a loopback service"
    assert "HOST-SECRET-7d41" not in output


def _deploy_attack(srv, tmp_path, host, name, runtime):
    """Deploys tmp_path/fn, whose build runs the attack: the deploy fails,
    and the attack's report shows it was contained."""
    p = _deploy(srv, tmp_path, name, runtime, "fn")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    _check_contained(_attack_results(out), host, out)


def _not_found(text):
    return "No such file" in text or "file not found" in text


def _deploy(srv, tmp_path, name, runtime, source, handler=None):
    extra = f"    handler: {handler}\n" if handler else ""
    manifest = tmp_path / "staccato.yml"
    manifest.write_text(f"functions:\n  {name}:\n    runtime: {runtime}\n    source: {source}\n{extra}")
    return srv.cli("deploy", manifest, timeout=300)


def test_a_pep517_build_backend_runs_contained(srv, tmp_path, host):
    src = tmp_path / "fn"
    pkg = src / "evilpkg"
    pkg.mkdir(parents=True)
    (src / "handler.py").write_text("def handle(ctx, data):\n    return data\n")
    (src / "requirements.txt").write_text("./evilpkg\n")
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "evilpkg"\nversion = "0.1"\n')
    attack = PY_ATTACK.replace("SECRET", repr(str(host["secret"]))).replace(
        "MARKER", repr(str(host["marker"]))).replace("PORT", str(host["port"]))
    (pkg / "backend.py").write_text(attack)
    _deploy_attack(srv, tmp_path, host, "evil-pep517", "python")


def test_npm_install_scripts_run_contained(srv, tmp_path, host):
    src = tmp_path / "fn"
    src.mkdir()
    (src / "handler.mjs").write_text("export function handle(ctx, data) { return data; }\n")
    # core-js has a postinstall script that runs node; the project's own
    # .npmrc puts the attack into every node a script starts.
    (src / "package.json").write_text(json.dumps({"name": "evil", "version": "1.0.0",
                                                  "dependencies": {"core-js": "3.38.1"}}))
    js = f"""
import fs from 'node:fs'; import net from 'node:net';
const attempt = (f) => {{ try {{ const v = f(); return 'OK:' + String(v).slice(0, 40); }} catch (e) {{ return e.code || e.name; }} }};
const connect = (host, port, send) => new Promise((resolve) => {{
  const s = net.connect({{host, port}}, () => {{ if (!send) {{ s.destroy(); resolve('OK'); }} else s.write(send); }});
  s.on('data', (d) => {{ s.destroy(); resolve(d.toString().split('\\r\\n')[0].replace(/ /g, '_')); }});
  s.on('error', (e) => resolve(e.code)); s.setTimeout(3000, () => {{ s.destroy(); resolve('TIMEOUT'); }});
}});
const proxy = new URL(process.env.HTTPS_PROXY);
const r = {{
  uid: process.getuid(),
  shadow: attempt(() => fs.readFileSync('/etc/shadow', 'utf8')),
  secret: attempt(() => fs.readFileSync({json.dumps(str(host["secret"]))}, 'utf8')),
  write: attempt(() => fs.writeFileSync({json.dumps(str(host["marker"]))}, 'x')),
  net: await connect('127.0.0.1', {host["port"]}),
  proxy: await connect(proxy.hostname, Number(proxy.port), 'CONNECT 127.0.0.1:{host["port"]} HTTP/1.1\\r\\n\\r\\n'),
}};
console.error('ATTACK ' + Object.entries(r).map(([k, v]) => k + '=' + v).join(' '));
process.exit(3);
"""
    (src / ".npmrc").write_text("node-options=--import=data:text/javascript," + urllib.parse.quote(js) + "\n")
    _deploy_attack(srv, tmp_path, host, "evil-npm", "node")


def test_install_scripts_may_run_what_they_unpack(srv, tmp_path):
    """Packages with native tools run the binary they just unpacked (here
    esbuild's postinstall checks its own binary's version): the build's
    output must be executable inside its sandbox, which runs nothing the
    build could not run anyway."""
    src = tmp_path / "fn"
    src.mkdir()
    (src / "package.json").write_text(json.dumps({"name": "uses-esbuild", "version": "1.0.0",
                                                  "dependencies": {"esbuild": "0.23.1"}}))
    (src / "handler.mjs").write_text("import { transformSync } from 'esbuild';\n"
                                     "export function handle(ctx, data) {\n"
                                     "  return transformSync(data.toString(), { loader: 'ts' }).code;\n}\n")
    p = _deploy(srv, tmp_path, "uses-esbuild", "node", "fn")
    assert p.returncode == 0, p.stdout + p.stderr
    assert ok_body(srv.invoke("uses-esbuild", b"let x: number = 1")) == b"let x = 1;\n"


def test_c_incbin_cannot_read_host_files(srv, tmp_path, host):
    src = tmp_path / "fn"
    src.mkdir()
    (src / "evil.c").write_text(
        '#include "staccato.h"\n'
        f'__asm__(".section .rodata\\n.global stolen\\nstolen:\\n.incbin \\"{host["secret"]}\\"\\n.byte 0\\n.text");\n'
        'extern const char stolen[];\n'
        'int staccato_handle(staccato_ctx *ctx, const uint8_t *in, size_t in_len) {\n'
        '    (void)in; (void)in_len;\n'
        '    return staccato_set_output(ctx, (const uint8_t *)stolen, 16);\n}\n')
    p = _deploy(srv, tmp_path, "evil-c", "c", "fn", handler="evil.c")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert str(host["secret"]) in out and _not_found(out), out
    assert "HOST-SECRET-7d41" not in out
    shadow = src / "shadow.c"
    shadow.write_text('__asm__(".incbin \\"/etc/shadow\\"");\n')
    p = _deploy(srv, tmp_path, "evil-c", "c", "fn", handler="shadow.c")
    assert p.returncode != 0 and "/etc/shadow" in p.stderr and _not_found(p.stderr), p.stderr


def test_go_builds_cannot_read_host_files(srv, tmp_path, host):
    src = tmp_path / "fn"
    src.mkdir()
    (src / "evil.go").write_text(
        'package evil\n\n'
        f'// __asm__(".section .rodata\\n.incbin \\"{host["secret"]}\\"\\n.text");\n'
        'import "C"\n\nimport "staccato.local/go/staccato"\n\n'
        'func Handle(ctx *staccato.Context, in []byte) ([]byte, error) { return in, nil }\n')
    p = _deploy(srv, tmp_path, "evil-go", "go", "fn")
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert str(host["secret"]) in out and _not_found(out), out
    assert "HOST-SECRET-7d41" not in out


def test_a_plain_go_build_still_works_after_the_attacks(srv, tmp_path):
    """The seed cache each Go build starts from is a copy: an attack's
    build leaves nothing for the next one."""
    src = tmp_path / "fn"
    src.mkdir()
    (src / "ok.go").write_text('package ok\n\nimport "staccato.local/go/staccato"\n\n'
                               'func Handle(ctx *staccato.Context, in []byte) ([]byte, error) {\n'
                               '\treturn append([]byte("go:"), in...), nil\n}\n')
    p = _deploy(srv, tmp_path, "ok-go", "go", "fn")
    assert p.returncode == 0, p.stderr
    assert ok_body(srv.invoke("ok-go", b"x")) == b"go:x"


def test_builds_are_stopped_at_their_time_and_memory_limits(tmp_path):
    # The time limit leaves pip room to start on a loaded CI machine (3 s was
    # once not enough for the hog to reach its memory limit first).
    with own_server(tmp_path / "limits", extra=["--build-timeout-s", "10", "--build-memory", "128Mi"]) as s:
        for name, body in [("hog", "b = bytearray(1 << 30)\nb[::4096] = b'x' * (len(b) // 4096)\n"),
                           ("sleeper", "import time\ntime.sleep(3600)\n")]:
            src = tmp_path / name
            pkg = src / "pkg"
            pkg.mkdir(parents=True)
            (src / "handler.py").write_text("def handle(ctx, data):\n    return data\n")
            (src / "requirements.txt").write_text("./pkg\n")
            (pkg / "pyproject.toml").write_text(
                '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
            (pkg / "backend.py").write_text(body)
            manifest = tmp_path / f"{name}.yml"
            manifest.write_text(f"functions:\n  {name}:\n    runtime: python\n    source: {name}\n")
            p = s.cli("deploy", manifest, timeout=120)
            assert p.returncode != 0, p.stdout
            if name == "hog":
                assert "ran out of memory (limit 128 MiB" in p.stderr, p.stderr
            else:
                assert "was stopped" in p.stderr and "may take 10 s" in p.stderr, p.stderr


SLOW_BACKEND = '''
"""A PEP 517 backend that works, slowly: preparing its metadata sleeps,
which pip does once to resolve it and once again to install it."""
import base64, hashlib, os, time, zipfile

NAME, VERSION = "slowpkg", "0.1"
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
PAUSE = float(os.environ.get("SLOW_PAUSE", "PAUSE_S"))


def _metadata():
    return f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    time.sleep(PAUSE)
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    files = {
        f"{NAME}.py": "VALUE = 42\\n",
        f"{DIST_INFO}/METADATA": _metadata(),
        f"{DIST_INFO}/WHEEL": "Wheel-Version: 1.0\\nGenerator: slow\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{DIST_INFO}/RECORD,,")
        z.writestr(f"{DIST_INFO}/RECORD", "\\n".join(record) + "\\n")
    return name
'''


def _slow_function(tmp_path, name, pause_s):
    """A Python function whose requirements name a local sdist with a slow
    build backend: resolving it and installing it each take `pause_s`."""
    import tarfile
    src = tmp_path / name
    pkg = tmp_path / f"{name}-pkg" / "slowpkg-0.1"
    pkg.mkdir(parents=True)
    src.mkdir()
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "slowpkg"\nversion = "0.1"\n')
    (pkg / "backend.py").write_text(SLOW_BACKEND.replace("PAUSE_S", str(pause_s)))
    (pkg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: slowpkg\nVersion: 0.1\n")
    with tarfile.open(src / "slowpkg-0.1.tar.gz", "w:gz") as t:
        t.add(pkg, arcname="slowpkg-0.1")
    (src / "requirements.txt").write_text("./slowpkg-0.1.tar.gz\n")
    (src / "handler.py").write_text("import slowpkg\n\ndef handle(ctx, data):\n    return str(slowpkg.VALUE).encode()\n")
    manifest = tmp_path / f"{name}.yml"
    manifest.write_text(f"functions:\n  {name}:\n    runtime: python\n    source: {name}\n")
    return manifest


def _echo_function(tmp_path, name):
    src = tmp_path / name
    src.mkdir()
    (src / "handler.py").write_text("def handle(ctx, data):\n    return data\n")
    manifest = tmp_path / f"{name}.yml"
    manifest.write_text(f"functions:\n  {name}:\n    runtime: python\n    source: {name}\n")
    return manifest


def test_a_long_build_holds_up_no_other_deploy_or_request(srv, tmp_path):
    """While one deploy builds for seconds, another deploys and is called,
    and the management API answers; the slow one then lands too."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    slow = _slow_function(tmp_path, "slow-build", 4)
    with ThreadPoolExecutor(1) as ex:
        started = time.monotonic()
        pending = ex.submit(srv.cli, "deploy", slow, timeout=300)
        # Until the slow build has started (its deploy reached the engine).
        assert wait_for(lambda: "slow-build: resolving" in srv.log_path.read_text(), timeout=30), srv.log_tail()
        t = time.monotonic()
        srv.deploy(_echo_function(tmp_path, "quick"))
        assert ok_body(srv.invoke("quick", b"hi")) == b"hi"
        assert srv.get("/system/functions").status == 200
        quick_s = time.monotonic() - t
        p = pending.result()
        slow_s = time.monotonic() - started
    assert p.returncode == 0, p.stdout + p.stderr
    assert ok_body(srv.invoke("slow-build", b"")) == b"42"
    # The slow build sleeps 4 s in each of its two steps (resolve, install);
    # the quick deploy took what a plain deploy takes, not the 7 s or so
    # left of the slow one.
    assert slow_s >= 8, slow_s
    assert quick_s < 6, f"the quick deploy waited {quick_s:.1f} s"


def test_the_build_timeout_bounds_the_whole_deploy(tmp_path):
    """Two build steps of about 3.5 s each (3 s of sleep), with
    --build-timeout-s 5: each is under the limit, so with a limit per step
    the deploy would succeed; together they are over it: it is stopped, in
    its second step."""
    with own_server(tmp_path / "deadline", extra=["--build-timeout-s", "5"]) as s:
        p = s.cli("deploy", _slow_function(tmp_path, "slow-twice", 3), timeout=120)
        assert p.returncode != 0, p.stdout
        assert "its builds together may take 5 s" in p.stderr, p.stderr
        assert "installing slowpkg" in p.stderr, p.stderr
        m = re.search(r"stopped ([0-9.]+) s into the deploy", p.stderr)
        assert m and 5 <= float(m[1]) < 6, p.stderr


def test_a_removal_during_a_deploy_cancels_it(srv, tmp_path):
    """`rm` while the function builds: the removal is answered at once, the
    deploy is answered 409 superseded when its build ends, and nothing of
    it runs or is listed afterwards."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    slow = _slow_function(tmp_path, "cancelled", 2)
    with ThreadPoolExecutor(1) as ex:
        pending = ex.submit(srv.cli, "deploy", slow, timeout=300)
        wait_until = time.monotonic() + 30
        while "cancelled: resolving" not in srv.log_path.read_text() and time.monotonic() < wait_until:
            time.sleep(0.05)
        t = time.monotonic()
        r = srv.cli("rm", "cancelled")
        assert r.returncode == 0, r.stdout + r.stderr
        assert time.monotonic() - t < 3
        p = pending.result()
    assert p.returncode != 0, p.stdout
    assert "superseded" in p.stderr and "409" in p.stderr, p.stderr
    assert srv.get("/system/functions/cancelled").status == 404
    assert srv.invoke("cancelled").status == 404
