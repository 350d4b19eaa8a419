"""The application's data: a deterministic synthetic social graph of
socfb-Reed98's size (the graph Nightcore's evaluation loads: 962 users,
18,812 edges), the loader that registers its users and follows through the
frontend's API, and seeded request generators for the workloads.
"""

import http.client
import json
import queue
import random
import string
import threading
import time
from urllib.parse import urlsplit

USERS = 962
EDGES = 18_812

MEDIA_TYPES = ["png", "jpg", "gif", "mp4"]


def username(i):
    return f"user_{i}"


def password(i):
    return f"password_{i}"


def social_graph(users=USERS, edges=EDGES, seed=1):
    """`edges` distinct follows (follower, followee) among users 1..users,
    no one following themselves. Degrees are heavy-tailed like a real
    social graph's (Chung-Lu: each end drawn with weight (rank+10)^-0.8),
    the same list for the same arguments on every machine."""
    if edges > users * (users - 1):
        raise ValueError(f"{users} users cannot have {edges} distinct follows")
    rng = random.Random(seed)
    ids = list(range(1, users + 1))
    rng.shuffle(ids)  # popularity is not the user number
    weights = [(rank + 10) ** -0.8 for rank in range(users)]
    seen = set()
    out = []
    while len(out) < edges:
        need = edges - len(out)
        a = rng.choices(ids, weights, k=need * 2)
        b = rng.choices(ids, weights, k=need * 2)
        for e in zip(a, b):
            if e[0] != e[1] and e not in seen:
                seen.add(e)
                out.append(e)
                if len(out) == edges:
                    break
    return out


def followers_of(graph):
    f = {}
    for follower, followee in graph:
        f.setdefault(followee, set()).add(follower)
    return f


# ------------------------------------------------------------ requests

def _words(rng, n):
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n))


def compose_request(rng, users=USERS):
    """A post as DeathStarBench's compose-post workload makes one: some
    text, 0-5 mentions, 0-5 URLs, 0-4 media."""
    author = rng.randint(1, users)
    parts = [_words(rng, rng.randint(5, 25))]
    for _ in range(rng.randint(0, 5)):
        parts.append("@" + username(rng.randint(1, users)))
    for _ in range(rng.randint(0, 5)):
        parts.append("http://" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=64)))
    rng.shuffle(parts)
    n_media = rng.randint(0, 4)
    return {
        "username": username(author), "user_id": author, "text": " ".join(parts),
        "media_ids": [rng.randint(1, 2**53) for _ in range(n_media)],
        "media_types": [rng.choice(MEDIA_TYPES) for _ in range(n_media)],
        "post_type": "POST",
    }


def read_request(rng, users=USERS, start_max=10):
    """A page of 10 posts of a random user's timeline."""
    start = rng.randint(0, start_max - 1)
    return {"user_id": rng.randint(1, users), "start": start, "stop": start + 10}


def write_bodies(path, make, n, seed, **kw):
    """n requests from `make` in JSON Lines, for a workload's bodies_file."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps(make(rng, **kw), separators=(",", ":")) + "\n")


# ------------------------------------------------------------ calling the API

class CallFailed(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status, self.body = status, body


class Api:
    """The frontend's API over HTTP/1.1 keep-alive: a gateway
    (/function/NAME) or the RPC variant's frontend server, which answers the
    same paths. One connection per thread."""

    def __init__(self, base_url, timeout=30.0):
        u = urlsplit(base_url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.local = threading.local()

    def call(self, name, body):
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request("POST", f"/function/{name}", body=data,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                out = r.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # Only a kept-alive connection the server closed while idle is
                # tried again; the request never reached a handler then.
                conn.close()
                self.local.conn = None
                if attempt or not getattr(conn, "_used", False):
                    raise
                continue
            conn._used = True
            if r.status != 200:
                raise CallFailed(r.status, out)
            return json.loads(out) if out else None
        raise AssertionError("unreachable")


def run_parallel(fn, items, threads=16, progress=None, what="calls"):
    """fn(item) for every item on `threads` threads; the first error is
    raised after all have finished."""
    q = queue.Queue()
    for it in items:
        q.put(it)
    errors = []
    done = [0]
    lock = threading.Lock()
    total = q.qsize()
    t0 = time.monotonic()

    def worker():
        while True:
            try:
                it = q.get_nowait()
            except queue.Empty:
                return
            try:
                fn(it)
            except Exception as e:  # collected, reported below
                with lock:
                    errors.append((it, e))
            with lock:
                done[0] += 1
                n = done[0]
            if progress and (n % 2000 == 0 or n == total):
                progress(f"    {n}/{total} {what} ({n / max(time.monotonic() - t0, 1e-6):.0f}/s)")

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        it, e = errors[0]
        raise RuntimeError(f"{len(errors)} of {total} {what} failed; first ({it!r}): {e}")


def load(api, users=USERS, edges=EDGES, posts_per_user=0, seed=1, threads=16, progress=print):
    """Registers the users, makes the follows, and composes some posts per
    user, all through the API. Returns the graph."""
    graph = social_graph(users, edges, seed)
    progress(f"  registering {users} users")
    run_parallel(lambda i: api.call("sn-user-register", {
        "user_id": i, "username": username(i), "password": password(i),
        "first_name": f"first_{i}", "last_name": f"last_{i}"}), range(1, users + 1), threads, progress, "registrations")
    progress(f"  {len(graph)} follows")
    run_parallel(lambda e: api.call("sn-user-follow", {"user_id": e[0], "followee_id": e[1]}),
                 graph, threads, progress, "follows")
    if posts_per_user:
        rng = random.Random(seed + 1)
        posts = []
        for _ in range(posts_per_user):
            for i in range(1, users + 1):
                p = compose_request(rng, users)
                p["user_id"], p["username"] = i, username(i)
                posts.append(p)
        progress(f"  {len(posts)} posts")
        run_parallel(lambda p: api.call("sn-post-compose", p), posts, threads, progress, "posts")
    return graph
