"""node/jwt.py: decoding, trust checks, user authentication, and a fuzz test
that garbage, truncated, wrongly signed and oversized JWTs only ever raise
JWTError."""

from __future__ import annotations

import base64
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import jwt
from tests import jwt_issuer as ji

NOW = 1_800_000_000


def _sig(key: ji.Key, nonce: bytes) -> str:
    return base64.urlsafe_b64encode(key.sign(nonce)).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def keys():
    op, acc, user = ji.operator_key(), ji.account_key(), ji.user_key()
    operator = jwt.decode_operator(ji.operator_jwt(op))
    account = jwt.decode_account(ji.account_jwt(acc, op))
    return op, acc, user, operator, account


def _auth(keys, token: str, sig: str | None, nonce: bytes = b"n0nce", now: float = NOW,
          ip: str | None = "127.0.0.1", kind: str = "STANDARD", account=None):
    _, _, _, operator, acct = keys
    acct = account or acct
    return jwt.authenticate_user(token, sig, nonce, operator=operator,
                                 lookup_account=lambda k: acct if k == acct.key else None,
                                 now=now, client_ip=ip, connection_type=kind)


def test_public_keys_are_checked_for_role_and_checksum(keys) -> None:
    op, acc, user, _, _ = keys
    assert jwt.is_public_key(acc.public, b"A") and not jwt.is_public_key(acc.public, b"U")
    assert jwt.is_public_key(user.public, b"U")
    flipped = user.public[:-1] + ("A" if user.public[-1] != "A" else "B")
    assert not jwt.is_public_key(flipped, b"U")
    assert not jwt.is_public_key("U" + "A" * 55, b"U")
    assert not jwt.is_public_key("", b"U")


def test_decoded_claims(keys) -> None:
    op, acc, user, operator, account = keys
    assert operator.key == op.public and operator.trusts(acc.public) is False
    assert operator.trusts(op.public)
    assert account.key == acc.public and account.limits.conn == -1
    token = ji.user_jwt(user, acc, pub={"allow": ["a"]}, sub={"deny": ["b"]},
                        resp={"max": 3, "ttl": 2_000_000_000}, src=["10.0.0.0/8"],
                        times=[{"start": "08:00:00", "end": "17:00:00"}], tags=["x"])
    u = jwt.decode_user(token)
    assert u.key == user.public and u.account_key == acc.public
    assert u.permissions.publish_allow == ["a"] and u.permissions.subscribe_deny == ["b"]
    assert u.permissions.allow_responses and u.response == jwt.ResponsePermission(3, 2.0)
    assert [str(n) for n in u.src] == ["10.0.0.0/8"] and u.tags == ("x",)


def test_authentication_succeeds_and_reports_the_identity(keys) -> None:
    _, acc, user, _, _ = keys
    token = ji.user_jwt(user, acc, exp=NOW + 60, pub={"allow": ["p.>"]})
    ident, account = _auth(keys, token, _sig(user, b"n0nce"))
    assert ident.user_key == user.public and ident.account_key == acc.public
    assert ident.permissions.publish_allow == ["p.>"] and ident.expires == NOW + 60
    assert account.key == acc.public


@pytest.mark.parametrize("case", [
    "expired", "not_yet_valid", "no_sig", "bad_sig", "other_nonce", "wrong_ip", "no_ip",
    "wrong_type", "outside_times", "revoked", "revoked_all", "unknown_account",
    "signed_by_operator", "bad_tz",
])
def test_authentication_failures(keys, case: str) -> None:
    op, acc, user, operator, account = keys
    kw: dict = {}
    sig: str | None = _sig(user, b"n0nce")
    ip, kind, acct = "127.0.0.1", "STANDARD", None
    signer = acc
    if case == "expired":
        kw["exp"] = NOW
    elif case == "not_yet_valid":
        token = ji.encode({"sub": user.public, "nbf": NOW + 10,
                           "nats": {"type": "user", "version": 2}}, acc)
    elif case == "no_sig":
        sig = None
    elif case == "bad_sig":
        sig = "A" * 86
    elif case == "other_nonce":
        sig = _sig(user, b"other")
    elif case in ("wrong_ip", "no_ip"):
        kw["src"] = ["10.0.0.0/8"]
        ip = "127.0.0.1" if case == "wrong_ip" else None
    elif case == "wrong_type":
        kw["allowed_connection_types"] = ["WEBSOCKET"]
    elif case == "outside_times":
        kw["times"] = [{"start": "01:00:00", "end": "02:00:00"}]
        kw["times_location"] = "UTC"
    elif case == "bad_tz":
        kw["times"] = [{"start": "00:00:00", "end": "23:59:59"}]
        kw["times_location"] = "Nowhere/Atlantis"
    elif case in ("revoked", "revoked_all"):
        who = user.public if case == "revoked" else "*"
        acct = jwt.decode_account(ji.account_jwt(acc, op, revocations={who: NOW}))
        kw["iat"] = NOW - 1
    elif case == "unknown_account":
        signer = ji.account_key()
    elif case == "signed_by_operator":
        signer = op
    if case != "not_yet_valid":
        token = ji.user_jwt(user, signer, **kw)
    with pytest.raises(jwt.JWTError):
        _auth(keys, token, sig, ip=ip, kind=kind, account=acct)


def test_times_window_spanning_midnight(keys) -> None:
    _, acc, user, _, _ = keys
    token = ji.user_jwt(user, acc, times=[{"start": "22:00:00", "end": "02:00:00"}],
                        times_location="UTC")
    day = NOW - NOW % 86400
    _auth(keys, token, _sig(user, b"n0nce"), now=day + 23 * 3600)
    _auth(keys, token, _sig(user, b"n0nce"), now=day + 1 * 3600)
    with pytest.raises(jwt.AuthError):
        _auth(keys, token, _sig(user, b"n0nce"), now=day + 12 * 3600)


def test_revocation_covers_its_own_second_and_spares_jwts_issued_later(keys) -> None:
    op, acc, user, _, _ = keys
    acct = jwt.decode_account(ji.account_jwt(acc, op, revocations={user.public: NOW}))
    later = ji.user_jwt(user, acc, iat=NOW + 1)
    _auth(keys, later, _sig(user, b"n0nce"), account=acct)
    with pytest.raises(jwt.AuthError, match="revoked"):
        _auth(keys, ji.user_jwt(user, acc, iat=NOW), _sig(user, b"n0nce"), account=acct)


def test_nonce_signature_accepts_standard_base64_too(keys) -> None:
    _, _, user, _, _ = keys
    raw = user.sign(b"abc")
    assert jwt.verify_nonce(user.public, b"abc", base64.b64encode(raw).decode())
    assert jwt.verify_nonce(user.public, b"abc", _sig(user, b"abc"))
    assert not jwt.verify_nonce(user.public, b"abd", _sig(user, b"abc"))
    assert not jwt.verify_nonce(user.public, b"abc", "")
    assert not jwt.verify_nonce(user.public, b"abc", "!!!" * 30)


def test_default_permissions_apply_when_the_user_has_none(keys) -> None:
    op, acc, user, _, _ = keys
    acct = jwt.decode_account(ji.account_jwt(acc, op, default_permissions={
        "pub": {"allow": ["d.>"]}}))
    ident, _ = _auth(keys, ji.user_jwt(user, acc), _sig(user, b"n0nce"), account=acct)
    assert ident.permissions.publish_allow == ["d.>"]


def test_strict_signing_key_usage_rejects_identity_signed_accounts() -> None:
    op, sk, acc = ji.operator_key(), ji.operator_key(), ji.account_key()
    operator = jwt.decode_operator(ji.operator_jwt(op, signing_keys=[sk.public],
                                                   strict_signing_key_usage=True))
    account = jwt.decode_account(ji.account_jwt(acc, op))
    with pytest.raises(jwt.AuthError):
        jwt.check_account(account, operator, NOW)
    jwt.check_account(jwt.decode_account(ji.account_jwt(acc, sk)), operator, NOW)


# ---- malformed input: only JWTError, never anything else


def _valid_token() -> str:
    acc, user = ji.account_key(), ji.user_key()
    return ji.user_jwt(user, acc, pub={"allow": ["a"]}, src=["1.2.3.0/24"])


VALID = _valid_token()


def _only_jwt_errors(token: object) -> None:
    for decoder in (jwt.decode, jwt.decode_user, jwt.decode_account, jwt.decode_operator):
        try:
            decoder(token)  # type: ignore[arg-type]
        except jwt.JWTError:
            pass


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_garbage_text(text: str) -> None:
    _only_jwt_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID)))
def test_fuzz_truncated(n: int) -> None:
    _only_jwt_errors(VALID[:n])


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID) - 1), st.characters())
def test_fuzz_one_character_changed(i: int, c: str) -> None:
    token = VALID[:i] + c + VALID[i + 1:]
    try:
        claims = jwt.decode(token)
    except jwt.JWTError:
        return
    # Only a change that decodes to the same bytes (a base64 padding bit) survives.
    original = jwt.decode(VALID)
    assert (claims.subject, claims.issuer, claims.nats) == (
        original.subject, original.issuer, original.nats)


def _json_values() -> st.SearchStrategy[object]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    return st.recursive(scalars, lambda c: st.lists(c, max_size=4)
                        | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["pub", "sub", "resp", "src", "times", "times_location",
                                        "subs", "issuer_account", "bearer_token", "tags",
                                        "allowed_connection_types", "limits", "signing_keys",
                                        "revocations", "imports", "exports", "type",
                                        "version", "default_permissions", "mappings"]),
                       _json_values(), max_size=6))
def test_fuzz_wrongly_typed_claims_are_signed_but_still_clean_errors(nats: dict) -> None:
    signer = ji.account_key()
    claims = {"sub": ji.user_key().public, "nats": {"type": "user", "version": 2, **nats}}
    _only_jwt_errors(ji.encode(claims, signer))
    claims["sub"] = ji.account_key().public
    claims["nats"]["type"] = "account"
    _only_jwt_errors(ji.encode(claims, ji.operator_key()))


def test_wrong_signature_oversized_and_odd_headers() -> None:
    head, payload, sig = VALID.split(".")
    other = _valid_token().split(".")[2]
    for token in (f"{head}.{payload}.{other}", f"{head}.{payload}.", f"{head}.{payload}",
                  "a.b.c.d", VALID + "." * 3, VALID.replace(".", "..", 1)):
        with pytest.raises(jwt.JWTError):
            jwt.decode(token)
    with pytest.raises(jwt.JWTError, match="larger than"):
        jwt.decode("e" * (jwt.MAX_JWT_BYTES + 1))
    with pytest.raises(jwt.JWTError, match="larger than"):
        jwt.decode_user(VALID, max_bytes=100)
    for header in ({"typ": "JWT", "alg": "none"}, {"typ": "JWT", "alg": "ed25519"}, {}):
        with pytest.raises(jwt.JWTError):
            jwt.decode(ji.encode({"sub": "x", "nats": {"type": "user", "version": 2}},
                                 ji.account_key(), header))
    deep = base64.urlsafe_b64encode(b"[" * 100_000).rstrip(b"=").decode()
    with pytest.raises(jwt.JWTError):
        jwt.decode(f"{head}.{deep}.{sig}")
    rnd = random.Random(5)
    for _ in range(200):
        blob = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 200)))
        _only_jwt_errors(base64.urlsafe_b64encode(blob).decode() + "." + payload + "." + sig)
    assert json.loads(base64.urlsafe_b64decode(head + "==")) == {"typ": "JWT",
                                                                "alg": "ed25519-nkey"}


def test_a_resolver_returning_the_wrong_account_does_not_let_a_user_in(keys) -> None:
    # Defence in depth: even a lookup that ignores the key it was given must
    # not admit a user into an account that did not issue it.
    op, acc, user, operator, account = keys
    other, signing = ji.account_key(), ji.account_key()
    wrong = jwt.decode_account(ji.account_jwt(other, op, signing_keys=[signing.public]))
    for token in (ji.user_jwt(user, acc),
                  ji.user_jwt(user, signing, issuer_account=acc.public),
                  ji.user_jwt(user, signing)):
        with pytest.raises(jwt.AuthError):
            jwt.authenticate_user(token, _sig(user, b"n"), b"n", operator=operator,
                                  lookup_account=lambda _key: wrong, now=NOW,
                                  client_ip="127.0.0.1")
    # The same tokens are fine when the lookup answers with the right account.
    right = jwt.decode_account(ji.account_jwt(acc, op, signing_keys=[signing.public]))
    jwt.authenticate_user(ji.user_jwt(user, signing, issuer_account=acc.public),
                          _sig(user, b"n"), b"n", operator=operator,
                          lookup_account=lambda _key: right, now=NOW, client_ip="127.0.0.1")


def test_operator_trust_is_its_subject_and_signing_keys_whoever_signed_it() -> None:
    # nats-server starts with an operator JWT signed by any operator key (the
    # config file is the trust anchor): the signer gains no trust from it.
    op, sk, stranger = ji.operator_key(), ji.operator_key(), ji.operator_key()
    assert jwt.decode_operator(ji.operator_jwt(op)).key == op.public
    by_sk = jwt.decode_operator(ji.operator_jwt(op, signer=sk, signing_keys=[sk.public]))
    assert by_sk.key == op.public and by_sk.trusts(sk.public)
    odd = jwt.decode_operator(ji.operator_jwt(op, signer=stranger))
    assert odd.trusts(op.public) and not odd.trusts(stranger.public)
    with pytest.raises(jwt.JWTError):
        jwt.decode_operator(ji.operator_jwt(op, signer=ji.account_key()))


def test_response_permission_turns_off_the_blanket_publish_allow(keys) -> None:
    # nats-server refuses PUB foo from a user whose JWT has only `resp`
    # (checked against nats-server 2.15 by hand: "Permissions Violation").
    _, acc, user, _, _ = keys
    u = jwt.decode_user(ji.user_jwt(user, acc, resp={"max": 1, "ttl": 0}))
    assert u.permissions.publish_allow == [] and u.permissions.allow_responses
    u = jwt.decode_user(ji.user_jwt(user, acc, resp={"max": 1}, pub={"allow": ["bar"]}))
    assert u.permissions.publish_allow == ["bar"]
