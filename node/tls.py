"""TLS for client connections: SSL contexts and the in-place upgrade.

nats-server sends INFO (with `tls_required`) in plain text and only then runs
the TLS handshake on the same socket; with `handshake_first` the handshake
comes first and INFO travels inside TLS. The first mode is an in-place
upgrade of an existing asyncio transport (`start_upgrade`); the second is a
listener created with `ssl=` (`listener_ssl`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from node.options import TLSOptions

log = logging.getLogger(__name__)

UpgradeDone = Callable[[asyncio.BaseTransport | None], None]


def server_context(tls: TLSOptions) -> ssl.SSLContext:
    """A server context: our cert/key, TLS 1.2+, and when `verify` a client
    certificate signed by `ca_file` is required."""
    if not tls.cert_file or not tls.key_file:
        raise ValueError("tls needs cert_file and key_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.min_version == "1.3":
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.ca_file:
        ctx.load_verify_locations(cafile=tls.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.verify else ssl.CERT_NONE
    return ctx


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context trusting `ca_file` (system roots if None), presenting
    `cert_file`/`key_file` when given. Used by tests and tools."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def info_fields(tls: TLSOptions | None) -> dict[str, Any]:
    """The INFO keys nats-server adds for a TLS listener."""
    if tls is None:
        return {}
    fields: dict[str, Any] = {"tls_required": True}
    if tls.verify:
        fields["tls_verify"] = True
    return fields


def listener_ssl(tls: TLSOptions | None) -> ssl.SSLContext | None:
    """The `ssl=` argument for `loop.create_server`: only for handshake_first,
    where asyncio completes the handshake before `connection_made`."""
    if tls is None or not tls.handshake_first:
        return None
    return server_context(tls)


def start_upgrade(
    transport: asyncio.BaseTransport,
    protocol: asyncio.BaseProtocol,
    ctx: ssl.SSLContext,
    timeout: float,
    done: UpgradeDone,
) -> asyncio.Task[None]:
    """Upgrade `transport` to TLS (server side) after INFO was written.

    Call it right after writing INFO, without an `await` in between: reading is
    paused here, synchronously, so the client's ClientHello cannot reach
    `protocol.data_received` as NATS bytes. When the handshake ends, `done` is
    called with the new TLS transport (replace the old one with it), or with
    None if it failed (the connection is already closed then).
    """
    pause = getattr(transport, "pause_reading", None)
    if pause is not None:
        pause()
    return asyncio.ensure_future(_upgrade(transport, protocol, ctx, timeout, done))


async def _upgrade(
    transport: asyncio.BaseTransport,
    protocol: asyncio.BaseProtocol,
    ctx: ssl.SSLContext,
    timeout: float,
    done: UpgradeDone,
) -> None:
    loop = asyncio.get_running_loop()
    try:
        new = await loop.start_tls(
            transport,  # type: ignore[arg-type]
            protocol,
            ctx,
            server_side=True,
            ssl_handshake_timeout=timeout,
        )
    except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as exc:
        log.debug("TLS handshake failed: %s", exc)
        transport.close()
        done(None)
        return
    done(new)


def _der_item(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER item at `at`."""
    tag, first = der[at], der[at + 1]
    at += 2
    if first < 0x80:
        return tag, at, at + first
    n = first & 0x7F
    if not 1 <= n <= 4:
        raise ValueError("unsupported DER length")
    length = int.from_bytes(der[at:at + n], "big")
    return tag, at + n, at + n + length


def spki_sha256(cert_der: bytes) -> str:
    """Hex SHA-256 of a certificate's SubjectPublicKeyInfo, what `pinned_certs`
    lists: Certificate -> tbsCertificate -> [version], serial, signature,
    issuer, validity, subject, subjectPublicKeyInfo."""
    _, tbs_at, _ = _der_item(cert_der, 0)
    tag, start, end = _der_item(cert_der, tbs_at)
    at = start
    tag, _, item_end = _der_item(cert_der, at)
    if tag == 0xA0:  # explicit version
        at = item_end
    for _ in range(5):  # serial, signature, issuer, validity, subject
        _, _, at = _der_item(cert_der, at)
    tag, _, spki_end = _der_item(cert_der, at)
    if tag != 0x30 or spki_end > end:
        raise ValueError("no SubjectPublicKeyInfo")
    return hashlib.sha256(cert_der[at:spki_end]).hexdigest()


def pinned_ok(transport: asyncio.BaseTransport, pins: list[str]) -> bool:
    """True when no pins are set, or the client's certificate key is pinned."""
    if not pins:
        return True
    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return False
    try:
        return spki_sha256(der) in pins
    except (ValueError, IndexError):
        return False


def peer_cert(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The verified client certificate (as `ssl.getpeercert()` gives it)."""
    cert = transport.get_extra_info("peercert")
    return cert or None
