"""Unit tests for node/auth.py: credential checks and permission matching.

Expected permission outcomes were observed on nats-server 2.15.1 with the same
configuration (see tests/integration/test_security.py for the live oracle)."""

from __future__ import annotations

import base64

import bcrypt
import nkeys
import pytest
from nacl.signing import SigningKey

from node import auth
from node.auth import Authenticator, CompiledPermissions, PermissionSet
from node.options import Options, Permissions, User


def perms(**kw) -> PermissionSet:
    return PermissionSet(CompiledPermissions.build(Permissions(**kw)))


def make_nkey() -> tuple[str, nkeys.KeyPair]:
    seed = nkeys.encode_seed(bytes(SigningKey.generate()), nkeys.PREFIX_BYTE_USER)
    kp = nkeys.from_seed(bytearray(seed))
    return kp.public_key.decode(), kp


# ----------------------------------------------------------------------- authentication


def test_no_auth_configured_accepts_anything():
    a = Authenticator(Options())
    assert not a.required
    assert a.new_nonce() is None
    ident = a.authenticate({"user": "x", "pass": "y"}, None)
    assert ident is not None and ident.permissions is None


def test_single_user_password():
    a = Authenticator(Options(user="a", password="b"))
    assert a.required
    assert a.authenticate({"user": "a", "pass": "b"}, None) is not None
    assert a.authenticate({"user": "a", "pass": "x"}, None) is None
    assert a.authenticate({"user": "z", "pass": "b"}, None) is None
    assert a.authenticate({}, None) is None
    assert a.authenticate({"user": "a", "pass": 5}, None) is None


def test_token_plain_and_bcrypt():
    a = Authenticator(Options(token="s3cr3t"))
    assert a.authenticate({"auth_token": "s3cr3t"}, None) is not None
    assert a.authenticate({"auth_token": "nope"}, None) is None
    assert a.authenticate({"user": "s3cr3t"}, None) is None
    hashed = bcrypt.hashpw(b"tok", bcrypt.gensalt(rounds=4)).decode()
    b = Authenticator(Options(token=hashed))
    assert b.authenticate({"auth_token": "tok"}, None) is not None
    assert b.authenticate({"auth_token": "tok2"}, None) is None


@pytest.mark.parametrize("prefix", ["$2a$", "$2b$"])
def test_users_bcrypt_passwords(prefix):
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    hashed = prefix + hashed[4:]
    a = Authenticator(Options(users=[User(user="u", password=hashed), User("v", "plain")]))
    for _ in range(2):  # the second success comes from the verified cache
        ident = a.authenticate({"user": "u", "pass": "pw"}, None)
        assert ident is not None and ident.name == "u"
    assert a.authenticate({"user": "u", "pass": "pw2"}, None) is None
    assert a.authenticate({"user": "u", "pass": hashed}, None) is None
    assert a.authenticate({"user": "v", "pass": "plain"}, None).name == "v"


def test_each_connection_gets_its_own_permission_set():
    p = Permissions(publish_allow=["a"])
    a = Authenticator(Options(users=[User("u", "p", permissions=p)]))
    one = a.authenticate({"user": "u", "pass": "p"}, None)
    two = a.authenticate({"user": "u", "pass": "p"}, None)
    assert one.permissions is not None and one.permissions is not two.permissions
    assert one.permissions.can_publish("a") and not one.permissions.can_publish("b")


def test_no_auth_user():
    users = [User("a", "b", permissions=Permissions(publish_allow=["x"])), User("c", "d")]
    a = Authenticator(Options(users=users, no_auth_user="a"))
    assert not a.required  # nats-server leaves auth_required out of INFO
    ident = a.authenticate({"verbose": False}, None)
    assert ident.name == "a" and not ident.permissions.can_publish("y")
    assert a.authenticate({"user": "c", "pass": "d"}, None).name == "c"
    # Credentials given but wrong: no fallback to the no-auth user.
    assert a.authenticate({"user": "a", "pass": "c"}, None) is None
    with pytest.raises(ValueError):
        Authenticator(Options(users=users, no_auth_user="ghost"))


def test_nkey_signature():
    public, kp = make_nkey()
    other_public, other_kp = make_nkey()
    a = Authenticator(Options(users=[User(nkey=public), User("a", "b")]))
    nonce = a.new_nonce()
    assert nonce and nonce != a.new_nonce() and len(nonce) == 15
    std = base64.b64encode(kp.sign(nonce.encode())).decode()  # nats-py
    raw_url = base64.urlsafe_b64encode(kp.sign(nonce.encode())).rstrip(b"=").decode()  # nats.go
    for sig in (std, raw_url):
        ident = a.authenticate({"nkey": public, "sig": sig}, nonce)
        assert ident is not None and ident.name == public
    # Wrong signer, wrong nonce, unknown key, missing sig or nonce.
    bad = base64.b64encode(other_kp.sign(nonce.encode())).decode()
    assert a.authenticate({"nkey": public, "sig": bad}, nonce) is None
    assert a.authenticate({"nkey": public, "sig": std}, a.new_nonce()) is None
    assert a.authenticate({"nkey": other_public, "sig": bad}, nonce) is None
    assert a.authenticate({"nkey": public}, nonce) is None
    assert a.authenticate({"nkey": public, "sig": std}, None) is None
    assert a.authenticate({"nkey": public, "sig": "!!!"}, nonce) is None
    # Password users still work alongside nkey users.
    assert a.authenticate({"user": "a", "pass": "b"}, nonce) is not None


def test_verify_nkey_rejects_corrupted_keys():
    public, kp = make_nkey()
    sig = base64.b64encode(kp.sign(b"n")).decode()
    assert auth.verify_nkey(public, "n", sig)
    flipped = public[:-1] + ("A" if public[-1] != "A" else "B")  # breaks the CRC
    assert not auth.verify_nkey(flipped, "n", sig)
    assert not auth.verify_nkey("N" + public[1:], "n", sig)
    assert not auth.verify_nkey("garbage", "n", sig)


# ----------------------------------------------------------------------- permissions


def test_error_texts_match_nats_server():
    assert auth.AUTH_VIOLATION == "Authorization Violation"
    assert auth.AUTH_TIMEOUT == "Authentication Timeout"
    assert auth.pub_violation("baz") == 'Permissions Violation for Publish to "baz"'
    assert auth.sub_violation("q.a") == 'Permissions Violation for Subscription to "q.a"'
    assert (
        auth.sub_violation("q.a", "other")
        == 'Permissions Violation for Subscription to "q.a" using queue "other"'
    )


def test_publish_allow_then_deny():
    p = perms(publish_allow=["foo.*", "bar.>"], publish_deny=["foo.secret", "bar.x.>"])
    assert p.can_publish("foo.a")
    assert not p.can_publish("foo.secret")
    assert not p.can_publish("foo")
    assert not p.can_publish("foo.a.b")
    assert p.can_publish("bar.a.b")
    assert not p.can_publish("bar")
    assert p.can_publish("bar.x")
    assert not p.can_publish("bar.x.y")
    # Cached answers stay correct.
    assert p.can_publish("foo.a") and not p.can_publish("foo.secret")


def test_publish_deny_only():
    p = perms(publish_deny=[">"])
    assert not p.can_publish("anything")
    q = perms(publish_deny=["$JS.>"])
    assert q.can_publish("foo") and not q.can_publish("$JS.API.INFO")


SUB_CASES = [
    # (allow, deny, subject, queue, expected) - observed on nats-server 2.15.1
    (["foo.*", "bar.>"], ["foo.x"], "foo.>", None, True),  # '*' matches a '>' token
    (["foo.*", "bar.>"], ["foo.x"], "foo.*", None, True),  # overlaps deny: delivery filter
    (["foo.*", "bar.>"], ["foo.x"], "bar.*", None, True),
    (["foo.*", "bar.>"], ["foo.x"], "*", None, False),
    (["foo.*", "bar.>"], ["foo.x"], "foo.x", None, False),
    (["foo.*", "bar.>"], ["foo.x"], ">", None, False),
    (["foo.*", "bar.>"], ["foo.x"], "bar.>", None, True),
    (["bar", "q.> workers"], ["bar.x"], "q.a", None, False),
    (["bar", "q.> workers"], ["bar.x"], "q.a", "other", False),
    (["bar", "q.> workers"], ["bar.x"], "q.a", "workers", True),
    (["bar", "q.> workers"], ["bar.x"], "bar", "any", True),
    (["q v1.*"], None, "q", "v1.a", True),
    (["q v1.*"], None, "q", "v1.*", True),
    (["q v1.*"], None, "q", "v1.>", False),
    (["q v1.*"], None, "q", "v2.a", False),
    (None, ["q bad"], "q", "bad", False),
    (None, ["q bad"], "q", "good", True),
    (None, ["q bad"], "q", None, True),
    (None, ["q", "q bad"], "q", "good", False),  # a plain deny covers every queue
    (None, ["q"], "q", "good", False),
    ([], ["x"], "anything", None, True),  # empty subscribe allow means no restriction
    (["q", "q a"], None, "q", "b", False),
    (["q", "q a"], None, "q", None, True),
    (["q a"], None, "q", None, False),
    (["q.* a.>"], None, "q.x", "a", False),
    (["q.* a.>"], None, "q.x", "a.b.c", True),
    (["q.* a.>"], None, "q.x", "a.*", True),
    (["q.* a.>"], None, "q.>", "a.b", True),
    ([">"], ["> z"], "q", "z", False),
    ([">"], ["> z"], "q", "y", True),
    ([">"], ["foo.> z.*"], "foo.bar", "z.1", False),
    ([">"], ["foo.> z.*"], "foo.bar", "z.*", False),
    ([">"], ["foo.> z.*"], "foo.bar", "z", True),
]


@pytest.mark.parametrize("allow,deny,subject,queue,expected", SUB_CASES)
def test_subscribe(allow, deny, subject, queue, expected):
    p = perms(subscribe_allow=allow, subscribe_deny=deny)
    assert p.can_subscribe(subject, queue) is expected


def test_delivery_filter_for_wildcard_subscriptions():
    p = perms(subscribe_allow=[">"], subscribe_deny=["foo.x", "q.* grp"])
    assert p.can_subscribe("foo.*", None)
    assert not p.can_deliver("foo.x")
    assert p.can_deliver("foo.y")
    assert p.can_deliver("q.a")  # queue entries do not filter delivery
    assert perms(publish_allow=["a"]).can_deliver("anything")


def test_bad_subscribe_entry_rejected():
    with pytest.raises(ValueError):
        perms(subscribe_allow=["a b c"])


def test_allow_responses_once_then_denied():
    p = perms(subscribe_allow=["req"], allow_responses=True)
    assert p.tracks_replies
    assert not p.can_publish("x")  # allow_responses turns off the blanket publish allow
    assert not p.can_publish("_INBOX.1")
    p.note_reply("_INBOX.1", now=10.0)
    assert p.can_publish("_INBOX.1", now=11.0)
    assert not p.can_publish("_INBOX.1", now=11.0)
    p.note_reply("_INBOX.2", now=10.0)
    assert not p.can_publish("_INBOX.2", now=10.0 + auth.RESPONSE_EXPIRES + 1)


def test_allow_responses_keeps_explicit_publish_allow():
    p = perms(publish_allow=["svc.>"], allow_responses=True)
    assert p.can_publish("svc.a") and p.can_publish("svc.a")
    p.note_reply("r", now=0.0)
    assert p.can_publish("r", now=0.0) and not p.can_publish("r", now=0.0)


def test_note_reply_ignored_without_allow_responses():
    p = perms(publish_allow=["a"])
    assert not p.tracks_replies
    p.note_reply("r", now=0.0)
    assert not p.can_publish("r", now=0.0)


def test_reply_table_is_bounded():
    p = perms(allow_responses=True)
    for i in range(auth._REPLIES_MAX + 10):
        p.note_reply(f"r.{i}", now=float(i))
    assert len(p._replies) <= auth._REPLIES_MAX
    assert p.can_publish(f"r.{auth._REPLIES_MAX + 9}", now=float(auth._REPLIES_MAX + 9))
    assert not p.can_publish("r.0", now=float(auth._REPLIES_MAX + 9))


# ----------------------------------------------------------------------- issue 7 additions


def test_bcrypt_is_a_slow_check_whose_outcome_is_remembered():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    a = Authenticator(Options(users=[User("u", hashed)]))
    for given, expected in (("pw", True), ("bad", False)):
        check = a.begin({"user": "u", "pass": given}, None)
        assert isinstance(check, auth.SlowCheck)  # never hashed on the caller's thread
        ident = a.finish(check, check.run())
        assert (ident is not None) == expected
        again = a.begin({"user": "u", "pass": given}, None)  # answered from memory
        assert not isinstance(again, auth.SlowCheck) and (again is not None) == expected


def test_a_password_past_72_bytes_is_compared_by_its_first_72_as_nats_server():
    """bcrypt reads 72 bytes: nats-server (Go) lets in an 80-byte password whose first 72
    match (and one with another tail); this bcrypt package raised, counted as a failure."""
    given = "p" * 80
    hashed = bcrypt.hashpw(given[:72].encode(), bcrypt.gensalt(rounds=4)).decode()
    a = Authenticator(Options(users=[User("u", hashed)]))
    for password, expected in ((given, True), (given[:72] + "zz", True), ("p" * 71, False)):
        check = a.begin({"user": "u", "pass": password}, None)
        assert isinstance(check, auth.SlowCheck)
        assert (a.finish(check, check.run()) is not None) == expected, password


def test_default_permissions_go_to_listed_users_without_their_own():
    own = Permissions(subscribe_allow=["a"])
    opts = Options(users=[User("u", "p"), User("v", "p", permissions=own)],
                   default_permissions=Permissions(publish_allow=["a"]))
    a = Authenticator(opts)
    u = a.authenticate({"user": "u", "pass": "p"}, None).permissions
    v = a.authenticate({"user": "v", "pass": "p"}, None).permissions
    assert u.can_publish("a") and not u.can_publish("b") and u.can_subscribe("b")
    assert v.can_publish("b") and not v.can_subscribe("b")
    single = Authenticator(Options(user="s", password="p",
                                   default_permissions=Permissions(publish_allow=["a"])))
    assert single.authenticate({"user": "s", "pass": "p"}, None).permissions is None


def test_allowed_connection_types():
    users = [User("w", "p", allowed_connection_types=["WEBSOCKET"]), User("any", "p")]
    a = Authenticator(Options(users=users, no_auth_user="w"))
    assert a.authenticate({"user": "w", "pass": "p"}, None, conn_type="STANDARD") is None
    assert a.authenticate({"user": "w", "pass": "p"}, None, conn_type="WEBSOCKET") is not None
    assert a.authenticate({"user": "any", "pass": "p"}, None, conn_type="WEBSOCKET") is not None
    assert a.no_auth_identity("STANDARD") is None
    assert a.no_auth_identity("WEBSOCKET").user == "w"


def test_identity_lives_in_the_global_account():
    a = Authenticator(Options(users=[User("u", "p")]))
    assert a.authenticate({"user": "u", "pass": "p"}, None).account == "$G"
