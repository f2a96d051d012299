"""plan_reload: which option changes a reload applies, which it refuses (pure)."""

from __future__ import annotations

import pytest

from node.config import apply_config
from node.options import Options
from node.reload import Plan, ReloadError, go_duration, plan_reload


def _opts(d: dict) -> Options:
    return apply_config(d)


def test_nothing_changed_is_an_empty_plan() -> None:
    assert plan_reload(_opts({"port": 4222}), _opts({"port": 4222})) == Plan()


@pytest.mark.parametrize("key, old, new, label", [
    ("port", 4222, 4223, "Port: old=4222, new=4223"),
    ("server_name", None, "foo", "ServerName: old=, new=foo"),
    ("http_port", 0, 8222, "HTTPPort: old=0, new=8222"),
    ("host", "0.0.0.0", "127.0.0.1", "Host: old=0.0.0.0, new=127.0.0.1"),
])
def test_options_nats_server_cannot_reload_are_refused(key: str, old: object, new: object,
                                                       label: str) -> None:
    before = {key: old} if old is not None else {}
    with pytest.raises(ReloadError) as err:
        plan_reload(_opts(before), _opts({key: new}))
    assert str(err.value) == f"config reload not supported for {label}"


def test_reloadable_options_are_listed_as_nats_server_logs_them() -> None:
    plan = plan_reload(_opts({}), _opts({"debug": True, "max_payload": 2000,
                                         "ping_interval": "1m", "write_deadline": "3s"}))
    assert plan.changes == ["Reloaded: debug = true", "Reloaded: max_payload = 2000",
                            "Reloaded: ping_interval = 1m0s", "Reloaded: write_deadline = 3s"]
    assert not plan.auth


def test_users_and_accounts_mean_every_client_is_checked_again() -> None:
    users = {"authorization": {"users": [{"user": "a", "password": "a"}]}}
    plan = plan_reload(_opts(users), _opts(users))
    assert plan.auth and "Reloaded: authorization users" in plan.changes
    accounts = {"accounts": {"A": {"users": [{"user": "a", "password": "a"}]}}}
    plan = plan_reload(_opts({}), _opts(accounts))
    assert plan.auth and plan.accounts
    # Removing every user is a change too: the old users must go.
    assert plan_reload(_opts(users), _opts({})).auth


def test_unenforced_security_settings_refuse_the_reload() -> None:
    new = _opts({})
    new.unenforced.append("trusted_keys")
    with pytest.raises(ReloadError, match="not enforced"):
        plan_reload(_opts({}), new)


def test_go_duration() -> None:
    assert [go_duration(s) for s in (0.5, 3, 60, 120, 3725)] == \
        ["500ms", "3s", "1m0s", "2m0s", "1h2m5s"]


def test_the_system_account_cannot_move() -> None:
    with pytest.raises(ReloadError) as err:
        plan_reload(_opts({}), _opts({"system_account": "SYS2",
                                      "accounts": {"SYS2": {"users": [{"user": "s"}]}}}))
    assert str(err.value) == "config reload not supported for SystemAccount: old=$SYS, new=SYS2"


def test_a_client_on_hold_may_do_nothing() -> None:
    """While its bcrypt re-check runs, a client holds these permissions."""
    from node.auth import PermissionSet
    from node.reload import _DENY_ALL

    held = PermissionSet(_DENY_ALL)
    for subject in ("foo", "a.b.c", "_INBOX.x", "$SYS.REQ.SERVER.PING"):
        assert not held.can_publish(subject, 0.0)
        assert not held.can_subscribe(subject)
        assert not held.can_deliver(subject)
