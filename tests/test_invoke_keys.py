"""Per-function invoke keys (issue 15): `auth: key` in a manifest, keys
made, listed, rotated and revoked with `staccato key`, checked by the
gateway whichever front door takes the call, never needed for internal
calls, and never the same thing as the management token."""
import json
import re

import pytest

from harness import FUNCS, own_server, request, check_error, wait_for

KEYS = FUNCS / "keys"
KEY = re.compile(r"stk_[0-9a-f]{64}")


@pytest.fixture(scope="module", params=["engine", "gateway"])
def srv(request, tmp_path_factory):
    """One server per front door: the engine's hands calls that need a key
    to the gateway, which checks them."""
    with own_server(tmp_path_factory.mktemp(f"keys-{request.param}"),
                    extra=["--isolation", "process", "--front-door", request.param]) as s:
        s.deploy(KEYS)
        yield s


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def make_key(srv, fn="locked"):
    p = srv.cli("key", "create", fn)
    assert p.returncode == 0, p.stderr
    key = p.stdout.strip()
    assert KEY.fullmatch(key), p.stdout
    return key


def key_ids(srv, fn="locked"):
    r = srv.get(f"/system/keys/{fn}")
    assert r.status == 200, r
    return [k["id"] for k in r.json()["keys"]]


def unauthorized(r, in_message):
    assert r.status == 401, r
    assert r.headers.get("www-authenticate") == "Bearer", r.headers
    err = r.json()["error"]
    assert err["kind"] == "unauthorized" and in_message in err["message"], err


def test_a_call_without_a_key_or_with_the_management_token_is_refused(srv):
    unauthorized(srv.invoke("locked", b"x"), "staccato key create locked")
    # The management token is not an invoke key.
    unauthorized(srv.invoke("locked", b"x", headers=srv.auth()), "not an invoke key")
    unauthorized(srv.invoke("locked", b"x", headers=bearer("stk_" + "0" * 64)), "not an invoke key")
    unauthorized(srv.invoke("locked", b"x", headers={"Authorization": "Basic Zm9vOmJhcg=="}), "needs an invoke key")
    # Other functions take calls without one.
    r = srv.invoke("caller", b"y")
    assert r.status == 200 and r.body == b"via-caller:locked:y", r


def test_a_key_of_the_function_lets_the_call_through(srv):
    key = make_key(srv)
    r = srv.invoke("locked", b"hi", headers=bearer(key))
    assert r.status == 200 and r.body == b"locked:hi", r
    # One character off.
    unauthorized(srv.invoke("locked", b"x", headers=bearer(key[:-1] + ("0" if key[-1] != "0" else "1"))),
                 "not an invoke key")
    # A key of another function is not a key of this one.
    other = make_key(srv, "caller")
    unauthorized(srv.invoke("locked", b"x", headers=bearer(other)), "not an invoke key")
    (other_id,) = key_ids(srv, "caller")
    assert srv.cli("key", "rm", "caller", other_id).returncode == 0
    # The CLI sends the key, never the management token, with a call.
    p = srv.cli("invoke", "locked", "-d", "cli", "--key", key)
    assert p.returncode == 0 and p.stdout.strip() == "locked:cli", p
    p = srv.cli("invoke", "locked", "-d", "cli")
    assert p.returncode != 0 and "needs an invoke key" in p.stderr, p


def test_one_keep_alive_connection_is_checked_call_by_call(srv):
    """The engine's front door serves the first call (a function that needs
    no key) itself; the second, on the same connection, needs a key and
    has none: it must not ride on the first's connection."""
    import socket
    key = make_key(srv)

    def req(path, auth=None):
        h = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\n"
        if auth:
            h += f"Authorization: Bearer {auth}\r\n"
        return (h + "\r\nx").encode()

    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(req("/function/caller") + req("/function/locked") + req("/function/locked", key)
                  + req("/function/caller"))
        f = s.makefile("rb")
        answers = []
        for _ in range(4):
            status = int(f.readline().split()[1])
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            answers.append((status, f.read(length)))
    assert [a[0] for a in answers] == [200, 401, 200, 200], answers
    assert answers[2][1] == b"locked:x" and answers[3][1] == b"via-caller:locked:x", answers


def test_an_invoke_key_manages_nothing(srv):
    key = make_key(srv)
    r = request(srv.port, "GET", "/system/functions", headers=bearer(key))
    assert r.status == 401, r
    r = request(srv.port, "POST", "/system/keys/locked", headers=bearer(key))
    assert r.status == 401, r


def test_keys_are_listed_without_their_secret_rotated_and_revoked(srv):
    key = make_key(srv)
    p = srv.cli("key", "ls", "locked", "--json")
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    assert listed["auth"] == "key" and listed["keys"], listed
    assert "stk_" not in p.stdout and key[4:] not in p.stdout, "a listing shows no key"
    assert all(set(k) == {"id", "created_ms"} for k in listed["keys"]), listed
    p = srv.cli("key", "rotate", "locked")
    assert p.returncode == 0, p.stderr
    new = p.stdout.strip()
    assert KEY.fullmatch(new) and new != key, p.stdout
    assert len(key_ids(srv)) == 1, "rotate revokes every older key"
    unauthorized(srv.invoke("locked", b"x", headers=bearer(key)), "not an invoke key")
    assert srv.invoke("locked", b"x", headers=bearer(new)).status == 200
    (only,) = key_ids(srv)
    p = srv.cli("key", "rm", "locked", only)
    assert p.returncode == 0, p.stderr
    unauthorized(srv.invoke("locked", b"x", headers=bearer(new)), "not an invoke key")
    p = srv.cli("key", "rm", "locked", only)
    assert p.returncode != 0 and "no invoke key" in p.stderr, p


def test_key_requests_that_name_nothing_get_precise_errors(srv):
    h = srv.auth()
    r = request(srv.port, "POST", "/system/keys/nosuch", headers=h)
    assert r.status == 404 and r.json()["error"]["kind"] == "not_found", r
    r = request(srv.port, "GET", "/system/keys/nosuch", headers=h)
    assert r.status == 404, r
    for bad in ["zzzzzzzz", "0123", "..%2F..%2Fx", "ABCDEF01"]:
        r = request(srv.port, "DELETE", f"/system/keys/locked/{bad}", headers=h)
        assert r.status == 404, (bad, r)
    # A key for a function that needs none: made, with a note saying so.
    r = request(srv.port, "POST", "/system/keys/caller", headers=h)
    assert r.status == 201 and "auth: none" in r.json()["note"], r
    assert request(srv.port, "DELETE", f"/system/keys/caller/{r.json()['id']}", headers=h).status == 200


def test_a_function_has_at_most_sixteen_keys(srv):
    h = srv.auth()
    for i in key_ids(srv):
        assert request(srv.port, "DELETE", f"/system/keys/locked/{i}", headers=h).status == 200
    made = [request(srv.port, "POST", "/system/keys/locked", headers=h) for _ in range(16)]
    assert all(r.status == 201 for r in made), made
    r = request(srv.port, "POST", "/system/keys/locked", headers=h)
    assert r.status == 409 and "remove one first" in r.json()["error"]["message"], r
    assert srv.invoke("locked", b"x", headers=bearer(made[-1].json()["key"])).status == 200
    for i in key_ids(srv):
        assert request(srv.port, "DELETE", f"/system/keys/locked/{i}", headers=h).status == 200


def test_no_key_is_written_anywhere_but_the_answer_that_made_it(srv):
    key = make_key(srv)
    assert srv.invoke("locked", b"x", headers=bearer(key)).status == 200
    srv.invoke("locked", b"x", headers=bearer(key + "0"))
    assert key not in srv.log_path.read_text(errors="replace")
    assert key[4:] not in srv.cli("ls", "--json").stdout
    stored = b"".join(p.read_bytes() for p in srv.state_dir.rglob("*") if p.is_file())
    assert key.encode() not in stored and key[4:].encode() not in stored, "only a digest is stored"


def test_keys_follow_redeploys_and_go_with_their_function(tmp_path):
    with own_server(tmp_path, extra=["--isolation", "process"]) as srv:
        srv.deploy(KEYS)
        key = make_key(srv)
        # Redeployed without auth: open to all; with it again: the same key.
        srv.deploy(KEYS / "open.yml")
        assert srv.invoke("locked", b"x").status == 200
        srv.deploy(KEYS)
        unauthorized(srv.invoke("locked", b"x"), "needs an invoke key")
        assert srv.invoke("locked", b"x", headers=bearer(key)).status == 200
        # Kept across a restart (the store has its digest).
        srv.stop()
        srv.start()
        assert wait_for(lambda: srv.invoke("locked", b"x", headers=bearer(key)).status == 200, timeout=20)
        unauthorized(srv.invoke("locked", b"x"), "needs an invoke key")
        # Removed: its keys go too; a new function of the name has none.
        assert srv.cli("rm", "locked").returncode == 0
        srv.deploy(KEYS)
        assert key_ids(srv) == []
        unauthorized(srv.invoke("locked", b"x", headers=bearer(key)), "not an invoke key")
