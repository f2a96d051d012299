"""The bcrypt check queue (node/authqueue.py): bounds, order, who gives way."""

from node import authqueue as q
from node.authqueue import AuthThrottle


def fail_one(t: AuthThrottle, now: float) -> None:
    host, _ = t.ready(now)[0]
    t.done(host, False, now)


def test_bounds_per_host_and_overall():
    t: AuthThrottle[str] = AuthThrottle(workers=2)
    assert all(t.submit("h1", "j", 0.0).admitted for _ in range(q.SLOW_CHECKS_PER_HOST_MAX))
    assert not t.submit("h1", "j", 0.0).admitted
    for i in range(q.SLOW_CHECKS_MAX - q.SLOW_CHECKS_PER_HOST_MAX):
        assert t.submit(f"other{i}", "j", 0.0).admitted
    assert t.in_flight == q.SLOW_CHECKS_MAX
    # A clean newcomer takes the place of h1's newest (h1 has four queued) ...
    admission = t.submit("late", "late-job", 0.0)
    assert admission.admitted and len(admission.evicted) == 1
    assert t.in_flight == q.SLOW_CHECKS_MAX
    # ... but once every address has one check, a newcomer is refused.
    t.submit("late2", "j", 0.0)
    t.submit("late3", "j", 0.0)
    assert t.submit("late4", "j", 0.0) == q.Admission(False)


def test_a_host_over_its_failure_budget_is_refused_until_the_window_passes():
    t: AuthThrottle[str] = AuthThrottle(workers=1)
    for i in range(q.FAILURES_PER_HOST_MAX):
        assert t.submit("h", "j", float(i)).admitted
        fail_one(t, float(i))
    assert not t.submit("h", "j", 10.0).admitted
    assert t.submit("elsewhere", "j", 10.0).admitted
    assert t.submit("h", "j", q.FAILURE_WINDOW + 0.5).admitted  # the first failure left


def test_a_clean_address_goes_before_addresses_that_guessed_wrong():
    t: AuthThrottle[str] = AuthThrottle(workers=1)
    for i in range(8):
        t.submit(f"bad{i}", f"guess{i}", 0.0)
    for _ in range(8):  # every bad address has failed once
        fail_one(t, 0.0)
    for i in range(8):
        t.submit(f"bad{i}", f"again{i}", 1.0)
    t.submit("good", "login", 1.0)
    assert t.ready(1.0) == [("good", "login")]


def test_equal_records_take_turns_then_oldest_first():
    t: AuthThrottle[str] = AuthThrottle(workers=2)
    for j in ("a1", "a2", "a3"):
        t.submit("a", j, 0.0)
    t.submit("b", "b1", 0.0)
    assert t.ready(0.0) == [("a", "a1"), ("b", "b1")]  # not a1, a2: b has none running


def test_a_full_queue_drops_the_worst_waiting_check_for_a_better_record():
    t: AuthThrottle[str] = AuthThrottle(workers=2)
    hosts = [f"bad{i}" for i in range(q.SLOW_CHECKS_MAX // q.SLOW_CHECKS_PER_HOST_MAX)]
    for h in hosts:
        t.submit(h, f"{h}-first", 0.0)
    while t.in_flight:  # every storm address fails once
        for host, _ in t.ready(0.0):
            t.done(host, False, 0.0)
    for h in hosts:
        for k in range(q.SLOW_CHECKS_PER_HOST_MAX):
            assert t.submit(h, f"{h}-{k}", 1.0).admitted
    assert t.in_flight == q.SLOW_CHECKS_MAX
    admission = t.submit("good", "login", 1.0)
    assert admission.admitted and len(admission.evicted) == 1
    assert admission.evicted[0].endswith(f"-{q.SLOW_CHECKS_PER_HOST_MAX - 1}")  # the newest
    assert t.in_flight == q.SLOW_CHECKS_MAX
    assert t.ready(1.0)[0] == ("good", "login")


def test_a_check_not_run_counts_neither_way():
    t: AuthThrottle[str] = AuthThrottle(workers=1)
    for _ in range(q.FAILURES_PER_HOST_MAX + 2):
        assert t.submit("h", "j", 0.0).admitted
        host, _ = t.ready(0.0)[0]
        t.done(host, None, 0.0)
    assert t.in_flight == 0
    assert t.submit("h", "j", 0.0).admitted


def test_a_flood_of_wrong_guesses_does_not_forget_a_remembered_match():
    import bcrypt

    from node import auth
    from node.auth import Identity, _SecretChecker

    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()
    checker = _SecretChecker()
    grants = Identity(user="u")
    first = checker.check(hashed, "right", grants)
    assert isinstance(first, auth.SlowCheck)
    checker.remember(first, first.run())
    for i in range(auth._BCRYPT_CACHE_MAX + 1):  # distinct misses fill their cache
        miss = checker.check(hashed, f"guess{i}", grants)
        checker.remember(miss, False)
    assert checker.check(hashed, "right", grants) is grants  # no hashing needed


def test_the_source_of_an_address_is_its_ipv4_or_its_ipv6_slash_64():
    assert q.source_of("127.0.0.12") == "127.0.0.12"
    assert q.source_of("2001:db8:1:2:aaaa::1") == q.source_of("2001:db8:1:2:bbbb::9") \
        == "2001:db8:1:2::/64"
    assert q.source_of("2001:db8:1:3::1") != q.source_of("2001:db8:1:2::1")
    assert q.source_of("::ffff:10.0.0.1") == "10.0.0.1"
    assert q.source_of("fe80::1%eth0") == "fe80::/64"
    assert q.source_of("") == "" and q.source_of("not-an-ip") == "not-an-ip"
