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

from harness import ok_body, own_server


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
    with own_server(tmp_path / "limits", extra=["--build-timeout-s", "3", "--build-memory", "128Mi"]) as s:
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
                assert "stopped after 3 s" in p.stderr, p.stderr
