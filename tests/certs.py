"""Test PKI made at test time with the `openssl` CLI: a CA, a server cert for
127.0.0.1/localhost and a client cert. Nothing here is committed to git."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing we use: for "untrusted" checks


def available() -> bool:
    return shutil.which("openssl") is not None


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(d: Path, name: str) -> None:
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN=Jetraft {name}", cwd=d)


def _make_leaf(d: Path, name: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
         "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
         "-extfile", f"{name}.ext", cwd=d)


def make_pki(directory: Path) -> Pki:
    """Create the PKI under `directory` (a pytest tmp dir)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _make_ca(d, "ca")
    _make_ca(d, "other")
    _make_leaf(d, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
               "extendedKeyUsage=serverAuth\n")
    _make_leaf(d, "client", "extendedKeyUsage=clientAuth\n")
    return Pki(ca=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key",
               client_cert=d / "client.pem", client_key=d / "client.key",
               other_ca=d / "other.pem")
