"""Real text that ships in packages, as document lists (no network at run time beyond PyPI).

* **code** — the CPython standard library this interpreter runs on: every ``.py`` file under
  ``sysconfig.get_paths()["stdlib"]`` (site-packages excluded) is one document.
* **web** — the English Wikipedia articles that the ``gensim`` wheel ships as test data
  (``gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``:
  the raw wikitext of 206 articles, markup included, as a crawler would see it). The wheel is read
  as a zip file, never installed; :func:`gensim_wheel` downloads it with ``pip download`` into a
  cache folder when no path is given.
"""

from __future__ import annotations

import bz2
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

GENSIM_VERSION = "4.4.0"
ENWIKI = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
CACHE = Path.home() / ".cache" / "hexiscale" / "corpora"


def stdlib_documents() -> tuple[list[str], str]:
    """(documents, description) of the standard library's Python sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            docs.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return docs, f"CPython {sys.version.split()[0]} standard library, {len(docs)} .py files under {root}"


def gensim_wheel(path: str | None = None) -> Path:
    """The gensim wheel: ``path`` if given, else the cached download (``pip download``)."""
    if path:
        return Path(path)
    found = sorted(CACHE.glob(f"gensim-{GENSIM_VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(CACHE),
                    f"gensim=={GENSIM_VERSION}"], check=True, capture_output=True)
    found = sorted(CACHE.glob(f"gensim-{GENSIM_VERSION}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip downloaded no gensim {GENSIM_VERSION} wheel into {CACHE}")
    return found[0]


def wikipedia_documents(wheel: Path) -> tuple[list[str], str]:
    """(articles, description) from the gensim wheel's Wikipedia dump (wikitext of each page)."""
    with zipfile.ZipFile(wheel) as z:
        xml = bz2.decompress(z.read(ENWIKI)).decode("utf-8", errors="replace")
    docs = [t for t in re.findall(r"<text[^>]*>(.*?)</text>", xml, re.S) if t.strip()]
    return docs, f"English Wikipedia, {len(docs)} articles (wikitext) from {wheel.name}:{ENWIKI.rsplit('/', 1)[1]}"
