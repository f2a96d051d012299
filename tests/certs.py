"""Test PKI made at test time with the `openssl` CLI: CAs and certificates for the
client TLS tests (`make_pki`) and the Raft transport's mutual TLS (`make_ca`,
`make_leaf`). Nothing here is committed to git."""

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


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def make_ca(d: Path, name: str) -> None:
    """A self-signed CA: `name`.pem and `name`.key in `d`."""
    _run("req", "-x509", *_EC_KEY, "-days", "2", "-keyout", f"{name}.key",
         "-out", f"{name}.pem", "-subj", f"/CN=Jetraft {name}", cwd=d)


def make_leaf(d: Path, name: str, ext: str, ca: str = "ca") -> None:
    """A certificate `name`.pem/.key signed by CA `ca`, with extensions `ext`
    (openssl extfile lines, e.g. subjectAltName=...)."""
    (d / f"{name}.ext").write_text(ext)
    _run("req", *_EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={name}", cwd=d)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
         "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
         "-extfile", f"{name}.ext", cwd=d)


def make_pki(directory: Path) -> Pki:
    """Create the PKI under `directory` (a pytest tmp dir)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    make_ca(d, "ca")
    make_ca(d, "other")
    make_leaf(d, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
               "extendedKeyUsage=serverAuth\n")
    make_leaf(d, "client", "extendedKeyUsage=clientAuth\n")
    return Pki(ca=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key",
               client_cert=d / "client.pem", client_key=d / "client.key",
               other_ca=d / "other.pem")
