"""Correctness of one deployment, checked end to end through its API: a
post composed by a user reaches the author's timeline and every
follower's and mentioned user's home timeline, with its mentions and
shortened URLs; logging in works and a wrong password is refused."""

import random

from . import data

SHORT_PREFIX = "http://short-url.local/"


class CheckFailed(AssertionError):
    pass


def _expect(cond, what):
    if not cond:
        raise CheckFailed(what)


def find_post(posts, post_id):
    return next((p for p in posts if p.get("post_id") == post_id), None)


def compose_and_verify(api, graph, seed=7, users=data.USERS):
    """Composes one post and checks where it must appear. Returns its id."""
    rng = random.Random(seed)
    followers = data.followers_of(graph)
    candidates = sorted(a for a, fs in followers.items() if fs)
    author = rng.choice(candidates)
    mentioned = rng.choice([u for u in range(1, users + 1) if u != author and u not in followers[author]])
    follower = rng.choice(sorted(followers[author]))
    urls = [f"http://example.com/{rng.randrange(10**9)}", "https://example.org/a/b?c=d&e=f"]
    text = f"check @{data.username(mentioned)} reads {urls[0]} and {urls[1]} @nobody_{rng.randrange(10**6)}"
    out = api.call("sn-post-compose", {
        "username": data.username(author), "user_id": author, "text": text,
        "media_ids": [11, 12], "media_types": ["png", "mp4"], "post_type": "POST"})
    post_id = out["post_id"]
    _expect(isinstance(post_id, int) and post_id > 0, f"compose-post answered {out!r}")

    mine = api.call("sn-user-timeline-read", {"user_id": author, "start": 0, "stop": 10})
    post = find_post(mine, post_id)
    _expect(post is not None, f"post {post_id} is not on its author {author}'s user timeline: {mine!r}"[:500])
    _expect(post["creator"] == {"user_id": author, "username": data.username(author)}, f"creator: {post!r}")
    _expect([m["user_id"] for m in post["user_mentions"]] == [mentioned],
            f"mentions: want [{mentioned}] (the unknown user left out), got {post['user_mentions']!r}")
    got_urls = post["urls"]
    _expect([u["expanded_url"] for u in got_urls] == urls, f"urls: {got_urls!r}")
    _expect(all(u["shortened_url"].startswith(SHORT_PREFIX) for u in got_urls), f"urls: {got_urls!r}")
    _expect(all(u not in post["text"] for u in urls), f"text keeps a long URL: {post['text']!r}")
    _expect(all(u["shortened_url"] in post["text"] for u in got_urls), f"text lacks a short URL: {post['text']!r}")
    _expect([m["media_id"] for m in post["media"]] == [11, 12], f"media: {post['media']!r}")

    for who, why in ((follower, "follower"), (mentioned, "mentioned user")):
        home = api.call("sn-home-timeline-read", {"user_id": who, "start": 0, "stop": 10})
        _expect(find_post(home, post_id) is not None,
                f"post {post_id} by {author} is not on {why} {who}'s home timeline")
    return post_id


def login_checks(api):
    tok = api.call("sn-user-login", {"username": data.username(1), "password": data.password(1)})
    _expect(isinstance(tok.get("token"), str) and "." in tok["token"], f"login answered {tok!r}")
    try:
        api.call("sn-user-login", {"username": data.username(1), "password": "wrong"})
    except data.CallFailed as e:
        _expect(e.status == 500 and b"wrong password" in e.body, f"a wrong password gave {e}")
    else:
        raise CheckFailed("a wrong password logged in")


def check(api, graph, users=data.USERS, seed=7):
    compose_and_verify(api, graph, seed=seed, users=users)
    login_checks(api)
