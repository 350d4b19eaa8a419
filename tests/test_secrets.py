"""Secrets (issue 15): made with `staccato secret`, sealed at rest, read by
a function that names them at /var/secrets/NAME and by nothing else, and
never shown in a listing, a log or an answer."""
import glob
import json

import pytest

from harness import FUNCS, own_server, request, ok_body

SECRETS = FUNCS / "secrets"
DB = "correct horse battery staple 9f2c1e"
TOKEN = "tok-77aa31d0c5e4b6a8"


def read(srv, fn, **req):
    return json.loads(ok_body(srv.invoke(fn, json.dumps(req).encode(), timeout=20)))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    with own_server(root, extra=["--isolation", "container", "--pool-size", "2", "--no-pause"]) as s:
        (root / "db.txt").write_text(DB)
        p = s.cli("secret", "create", "db-password", "--from-file", root / "db.txt")
        assert p.returncode == 0, p.stderr
        p = s.cli("secret", "create", "api-token", "--from-literal", TOKEN)
        assert p.returncode == 0, p.stderr
        s.deploy(SECRETS)
        s.root = root
        yield s


def test_a_function_reads_the_secrets_it_names_read_only(srv):
    out = read(srv, "reader", read=["db-password", "api-token"], write=True)
    assert out["dir"] == "/var/secrets", out
    assert out["listing"] == ["api-token", "db-password"], out
    assert out["db-password"] == DB and out["api-token"] == TOKEN, out
    assert out["write"].startswith("ERR"), out  # EROFS / EACCES


def test_another_function_cannot_reach_them(srv):
    host = glob.glob(str(srv.ipc_dir / ".secrets" / "reader.*" / "db-password"))
    assert len(host) == 1, host
    paths = ["/var/secrets/db-password", host[0], "/ipc/../.secrets", "/proc/1/root/var/secrets/db-password"]
    out = read(srv, "nosecrets", read=["db-password"], paths=paths)
    assert out["listing"] is None, out
    for p in ["db-password", *paths]:
        assert str(out[p]).startswith("ERR"), (p, out)
    # On the host: the secret files belong to the reader's container user
    # alone.
    import os
    import stat
    st = os.stat(host[0])
    assert stat.S_IMODE(st.st_mode) == 0o400 and st.st_uid >= 200000, st


def test_a_link_left_where_an_output_goes_is_not_followed(srv, tmp_path):
    """The engine reads a function's output file as root: a link the
    function left there (to a host file, another function's secret) must
    not be followed, nor its target's content or size told."""
    host = tmp_path / "host-secret"
    host.write_text("host-only 5e1f0c")
    host.chmod(0o600)
    peer = glob.glob(str(srv.ipc_dir / ".secrets" / "reader.*" / "db-password"))[0]
    for target, n in [(str(host), 16), (peer, len(DB))]:
        r = srv.invoke("exfil", json.dumps({"target": target, "len": n}).encode(), timeout=20)
        assert b"5e1f0c" not in r.body and DB.encode() not in r.body, r
        assert r.status != 200 or r.body == b"the runtime's own answer", r
    assert host.read_text() == "host-only 5e1f0c"
    # Nor can it swap its payload directory, or anything beside its
    # channels, for a link: the directory holding them is the engine's.
    out = json.loads(ok_body(srv.invoke("exfil", b'{"swap": true}', timeout=20)))
    assert all(v.startswith("ERR") for v in out.values()), out


def test_values_are_never_shown_nor_stored_in_the_clear(srv):
    read(srv, "reader", read=["db-password"])
    shown = [srv.cli("secret", "ls", "--json").stdout, srv.cli("ls", "--json").stdout,
             srv.get("/system/secrets").body.decode(), srv.get("/system/functions/reader").body.decode(),
             srv.log_path.read_text(errors="replace")]
    for text in shown:
        assert DB not in text and TOKEN not in text
    listed = json.loads(srv.cli("secret", "ls", "--json").stdout)
    row = next(r for r in listed if r["name"] == "db-password")
    assert row["used_by"] == ["reader"] and set(row) == {"name", "created_ms", "updated_ms", "used_by"}, row
    stored = b"".join(p.read_bytes() for p in srv.state_dir.rglob("*") if p.is_file())
    assert DB.encode() not in stored and TOKEN.encode() not in stored, "sealed at rest"
    assert (srv.state_dir / "secrets.key").stat().st_mode & 0o077 == 0, "the key is its owner's alone"


def test_bad_secret_requests_get_precise_errors(srv):
    h = {**srv.auth(), "Content-Type": "application/json"}

    def post(body, path="/system/secrets", method="POST", headers=h):
        return request(srv.port, method, path, body=json.dumps(body).encode(), headers=headers)
    r = post({"name": "db-password", "value": "eA=="})
    assert r.status == 409 and "exists" in r.json()["error"]["message"], r
    r = post({"name": "../etc", "value": "eA=="})
    assert r.status == 400 and "invalid secret name" in r.json()["error"]["message"], r
    r = post({"name": "x", "value": "not base64!"})
    assert r.status == 400, r
    import base64
    r = post({"name": "big", "value": base64.b64encode(b"x" * (64 << 10) + b"x").decode()})
    assert r.status == 413, r
    r = post({"value": "eA=="}, path="/system/secrets/nosuch", method="PUT")
    assert r.status == 404, r
    r = post({"name": "y", "value": "eA=="}, headers={**srv.auth(), "Content-Type": "text/plain"})
    assert r.status == 415, r
    r = request(srv.port, "POST", "/system/secrets", body=b"{}", headers={"Content-Type": "application/json"})
    assert r.status == 401, r
    r = request(srv.port, "DELETE", "/system/secrets/nosuch", headers=srv.auth())
    assert r.status == 404, r
    # Named by a deployed function: not removed.
    r = request(srv.port, "DELETE", "/system/secrets/db-password", headers=srv.auth())
    assert r.status == 409 and "reader" in r.json()["error"]["message"], r
    # A deploy that names a secret nobody made.
    p = srv.cli("deploy", SECRETS / "missing.yml")
    assert p.returncode != 0 and "no-such-secret does not exist" in p.stderr, p


def test_a_new_value_reaches_the_function_at_its_next_deploy_and_after_a_restart(srv):
    p = srv.cli("secret", "update", "api-token", "--from-literal", TOKEN + "-v2")
    assert p.returncode == 0 and "reader" in p.stderr, p
    assert read(srv, "reader", read=["api-token"])["api-token"] == TOKEN, "not before a deploy"
    srv.deploy(SECRETS)
    assert read(srv, "reader", read=["api-token"])["api-token"] == TOKEN + "-v2"
    # A restart: the gateway registers the function again, with its
    # secrets opened from the store.
    srv.stop()
    srv.start()
    from harness import wait_for
    assert wait_for(lambda: srv.invoke("reader", b"{}").status == 200, timeout=30)
    assert read(srv, "reader", read=["db-password", "api-token"]) == {
        "dir": "/var/secrets", "listing": ["api-token", "db-password"], "db-password": DB, "api-token": TOKEN + "-v2"}


def test_process_isolation_gets_them_at_STACCATO_SECRETS_DIR(tmp_path):
    with own_server(tmp_path, extra=["--isolation", "process"]) as s:
        assert s.cli("secret", "create", "db-password", "--from-literal", DB).returncode == 0
        assert s.cli("secret", "create", "api-token", "--from-literal", TOKEN).returncode == 0
        s.deploy(SECRETS)
        out = read(s, "reader", read=["db-password", "api-token"])
        assert out["dir"] != "/var/secrets" and out["db-password"] == DB and out["api-token"] == TOKEN, out
        assert read(s, "nosecrets")["dir"] == "/var/secrets", "no directory for a function without secrets"
        assert s.cli("rm", "reader").returncode == 0
        assert not glob.glob(str(s.ipc_dir / ".secrets" / "reader.*")), "removed with the function"
