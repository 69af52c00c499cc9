"""The console's keys and the tokens' fingerprints come from the server's secret, not from the
tokens alone; and repeated failed sign-ins from one address are slowed down."""

from __future__ import annotations

import hashlib

from rig_conductor import roles
from rig_conductor.console import session
from rig_conductor.operations.sessions import SignInThrottle

TOKEN = b"operator-token-0123"
A, B = b"a" * 32, b"b" * 32


def tokens(secret: bytes) -> roles.Tokens:
    return roles.Tokens(operator=[TOKEN], viewer=[b"viewer-token-01234"], secret=secret)


def test_fingerprints_are_keyed_by_the_secret() -> None:
    under_a, again_a, under_b = tokens(A), tokens(A), tokens(B)
    assert under_a.fingerprint(TOKEN) == again_a.fingerprint(TOKEN)  # replicas agree
    assert under_a.fingerprint(TOKEN) != under_b.fingerprint(TOKEN)
    # Not a hash of the token alone: a guessed token cannot be checked against an audit line.
    assert under_a.fingerprint(TOKEN) != hashlib.sha256(TOKEN).hexdigest()[:8]
    caller = under_a.caller(TOKEN)
    assert caller is not None and caller.who == f"operator:{under_a.fingerprint(TOKEN)}"
    assert under_a.token_for(caller.who) == TOKEN and under_b.token_for(caller.who) is None


def test_without_a_secret_each_process_makes_its_own() -> None:
    assert roles.Tokens(operator=[TOKEN]).secret != roles.Tokens(operator=[TOKEN]).secret


def test_a_session_holds_only_under_the_secret_it_was_signed_with() -> None:
    signed = session.sign_in(tokens(A), TOKEN.decode())
    assert signed is not None
    made, cookie = signed
    read = session.read(tokens(A), cookie)
    assert read is not None and read.caller == made.caller and read.csrf == made.csrf
    assert session.read(tokens(B), cookie) is None
    # The same token under another secret gives another key, so another CSRF token.
    other = session.sign_in(tokens(B), TOKEN.decode())
    assert other is not None and other[0].key != made.key


def test_the_sign_in_form_token_is_bound_to_its_cookie_and_the_secret() -> None:
    nonce = session.pre_session(None)
    assert session.pre_session(nonce) == nonce
    assert session.pre_session("<bad>") != "<bad>"
    csrf = session.sign_in_csrf(tokens(A), nonce)
    assert session.sign_in_csrf_ok(tokens(A), nonce, csrf)
    assert not session.sign_in_csrf_ok(tokens(B), nonce, csrf)
    assert not session.sign_in_csrf_ok(tokens(A), session.pre_session(None), csrf)
    assert not session.sign_in_csrf_ok(tokens(A), None, csrf)
    assert not session.sign_in_csrf_ok(tokens(A), nonce, None)


def test_failed_sign_ins_back_off_per_address() -> None:
    now = [1000.0]
    throttle = SignInThrottle(free=3, max_wait_s=60, forget_s=900, clock=lambda: now[0])
    for n in (1, 2, 3):
        assert throttle.wait_s("10.0.0.1") == 0
        assert throttle.failed("10.0.0.1") == n
    assert throttle.wait_s("10.0.0.1") == 1  # 2^0 s after the third failure
    assert throttle.wait_s("10.0.0.2") == 0  # another address is not slowed
    now[0] += 1
    assert throttle.wait_s("10.0.0.1") == 0
    waits = []
    for _ in range(10):
        throttle.failed("10.0.0.1")
        waits.append(throttle.wait_s("10.0.0.1"))
    assert waits[:4] == [2, 4, 8, 16] and max(waits) == 60  # doubling, capped
    throttle.succeeded("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0
    for _ in range(5):
        throttle.failed("10.0.0.3")
    now[0] += 900
    assert throttle.wait_s("10.0.0.3") == 0 and throttle.failed("10.0.0.3") == 1  # forgotten


def test_the_throttle_keeps_a_bounded_number_of_addresses() -> None:
    throttle = SignInThrottle(max_clients=100)
    for n in range(1000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(throttle._seen) == 100
