"""Compile the protocol parser with mypyc: `python -m node.protocol.build_native`.

The source stays node/protocol/parser.py. A copy named parser_c.py, with the digest
of the source appended, is compiled in a scratch directory, and the extension modules
land next to parser.py; node/protocol/native.py loads them only while the digest still
matches. Needs mypy (the `native` extra) and a C compiler.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from node.protocol.native import SOURCE, source_digest

HERE = SOURCE.parent


def build() -> list[Path]:
    for old in HERE.glob("parser_c*.so"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="jetraft-mypyc-") as tmp:
        pkg = Path(tmp, "node", "protocol")
        pkg.mkdir(parents=True)
        Path(tmp, "node", "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        for name in ("events.py", "errors.py"):  # what the compiled module imports
            shutil.copy(HERE / name, pkg / name)
        text = SOURCE.read_text()
        (pkg / "parser_c.py").write_text(text + f'\n\nSOURCE_SHA256 = "{source_digest()}"\n')
        subprocess.run([sys.executable, "-m", "mypyc", "node/protocol/parser_c.py"],
                       cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        built = [p for p in Path(tmp).rglob("parser_c*.so") if "build" not in p.parts]
        if not built:
            raise SystemExit("mypyc produced no extension module")
        out = []
        for so in built:
            shutil.copy(so, HERE / so.name)
            out.append(HERE / so.name)
    return out


if __name__ == "__main__":
    for path in build():
        print(path)
