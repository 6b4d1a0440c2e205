#!/usr/bin/env python3
"""Build the embedded text stand-ins `lpdl_core/data/resources/{sentlen,topics}_standin.tsv`.

Source: English prose that ships with CPython itself -- the pydoc reference topics
(`pydoc_data.topics`: the Language Reference / Library Reference sections `help()` shows) and
the docstrings of a fixed list of standard-library modules (module docstring + docstrings of
the public classes/functions the module defines + public methods of those classes).

Extraction (deterministic, no randomness beyond a seeded hash order):
  1. split each text into paragraphs (blank-line separated, unindented lines only: indented
     blocks are code, grammar or tables; reST headers are dropped), join lines;
  2. split paragraphs into sentences after . ! ? followed by whitespace and a capital/quote;
  3. cleanup: typographic quotes/dashes -> ASCII, `*emphasis*` markers removed; drop sentences
     that are not ASCII, do not start with a capital letter or end in . ! ?, contain code or
     markup symbols ({}[]<>=_\\|`#~^@$%&*+/ "()" "::" "..." or a dotted name like os.path),
     are version notes ("New in version ...") or have fewer than 3 / more than 40 words;
  4. dedupe case-insensitively (first occurrence wins; sources are visited in sorted order).

Words are whitespace-separated tokens (`len(sentence.split())`), punctuation attached.

sentlen_standin.tsv -- a Sentlen-style probing task (SentEval's own file format
`<split>\\t<label>\\t<sentence>`, split in tr/te): every extracted sentence (pydoc topics +
all listed modules) is binned by word count into 6 contiguous bins whose edges maximize the
smallest bin (ties: the most even, then the lexicographically smallest edges); each bin is cut
to the same size (min(smallest bin, SENTLEN_PER_BIN)) and split 80/20 into tr/te.

topics_standin.tsv -- a 4-class topic classification task standing in for AG News: the label
is the topical family of the stdlib module whose docstrings the sentence comes from
(FAMILIES below). Sentences found in more than one family are dropped; families are cut to
the same size (min(smallest family, TOPICS_PER_CLASS)) and split 80/20 into tr/te.

Selection and splits use the order of sha256(f"{SEED}:{sentence}"), which does not depend on
the Python version. The *inputs* do (docstrings change between releases), so the committed
files are the reference; re-running this script reproduces them byte for byte only on the
Python that built them (recorded in standin_text_meta.json).

Usage: python scripts/extract_standin_text.py [--out DIR]   (default: lpdl_core/data/resources)
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import inspect
import io
import itertools
import json
import re
import sys
import warnings
from pathlib import Path

SEED = 20210000
MIN_WORDS, MAX_WORDS = 3, 40
NUM_BINS = 6
SENTLEN_PER_BIN = 460      # cap per bin (size budget: ~250 kB)
TOPICS_PER_CLASS = 420     # cap per class (size budget: ~130 kB)
TEST_FRACTION = 0.2

# Topical families for the AG-News stand-in (label order = class index).
FAMILIES: dict[str, tuple[str, ...]] = {
    "networking/internet": (
        "socket", "ssl", "select", "selectors", "socketserver", "ipaddress",
        "http", "http.client", "http.server", "http.cookies", "http.cookiejar",
        "urllib", "urllib.request", "urllib.parse", "urllib.error", "urllib.robotparser",
        "email", "email.message", "email.parser", "email.generator", "email.header",
        "email.utils", "email.policy", "email.headerregistry", "email.mime.text",
        "email.mime.multipart", "email.contentmanager", "email.feedparser", "email.charset",
        "email.errors", "email.iterators", "email.encoders",
        "smtplib", "imaplib", "poplib", "ftplib", "nntplib", "telnetlib", "mailbox",
        "mimetypes", "webbrowser", "xmlrpc.client", "xmlrpc.server", "wsgiref.simple_server",
        "wsgiref.handlers", "wsgiref.headers", "wsgiref.util", "wsgiref.validate",
        "smtpd", "asynchat", "asyncore", "cgi", "uuid",
    ),
    "text/data formats": (
        "json", "json.decoder", "json.encoder", "csv", "xml.dom.minidom", "xml.dom.pulldom",
        "xml.etree.ElementTree", "xml.sax", "xml.sax.handler", "xml.sax.saxutils",
        "xml.sax.xmlreader", "xml.parsers.expat", "html", "html.parser", "string", "re",
        "textwrap", "difflib", "codecs", "base64", "binascii", "configparser", "plistlib",
        "pickle", "pickletools", "tomllib", "unicodedata", "quopri", "uu", "struct", "shlex",
        "gettext", "locale", "stringprep", "encodings", "netrc", "marshal", "copyreg",
        "reprlib", "pprint",
    ),
    "math/numbers": (
        "math", "cmath", "decimal", "fractions", "statistics", "random", "numbers",
        "operator", "array", "bisect", "heapq",
    ),
    "system/files": (
        "os", "os.path", "posixpath", "sys", "pathlib", "shutil", "subprocess", "io", "tempfile",
        "glob", "fnmatch", "stat", "filecmp", "fileinput", "platform", "signal", "resource",
        "tarfile", "zipfile", "gzip", "bz2", "lzma", "zlib", "mmap", "fcntl", "pwd", "grp",
        "pty", "tty", "termios", "errno", "sysconfig", "getpass", "shelve", "dbm", "sqlite3",
    ),
}

# Further modules whose docstrings feed the Sentlen stand-in only (general-purpose prose).
GENERAL_MODULES: tuple[str, ...] = (
    "builtins", "abc", "argparse", "ast", "asyncio", "atexit", "bdb", "calendar", "cmd", "code",
    "codeop", "collections", "collections.abc", "concurrent.futures", "contextlib",
    "contextvars", "copy", "dataclasses", "datetime", "dis", "doctest", "enum", "functools",
    "gc", "getopt", "graphlib", "hashlib", "hmac", "importlib", "importlib.metadata",
    "importlib.resources", "inspect", "itertools", "keyword", "linecache", "logging",
    "logging.handlers", "multiprocessing", "optparse", "pdb", "pkgutil", "profile", "pstats",
    "py_compile", "pyclbr", "pydoc", "queue", "runpy", "sched", "secrets", "site", "symtable",
    "threading", "time", "timeit", "token", "tokenize", "trace", "traceback", "tracemalloc",
    "types", "typing", "unittest", "unittest.mock", "venv", "warnings", "weakref", "zipimport",
    "zoneinfo",
)

_TRANS = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"',
                        "\u2013": "-", "\u2014": "-", "\u00a0": " ", "\u2026": "..."})
_EMPH = re.compile(r"\*{1,2}([A-Za-z][\w' -]*?)\*{1,2}")
_BAD = re.compile(r"[{}\[\]<>=_\\|`#~^@$%&*+/]|\(\)|::|\.\.\.|[A-Za-z]\.[A-Za-z]")
_ABBREV = re.compile(r"\b(e\.g\.|i\.e\.|etc\.|vs\.)", re.IGNORECASE)
_VERSION_NOTE = re.compile(r"^(New|Changed|Deprecated|Added)\b.*\b(version|since)\b", re.IGNORECASE)
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
_RULE = re.compile(r"[*=\-~^#+]{3,}")


def paragraphs(text: str):
    """Unindented prose paragraphs of a pydoc topic or cleaned docstring, lines joined."""
    lines = text.translate(_TRANS).splitlines()
    para: list[str] = []
    for i, line in enumerate(lines):
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        breaks = (not line.strip() or line[:1].isspace() or _RULE.fullmatch(line.strip())
                  or _RULE.fullmatch(nxt))  # blank, indented (code/grammar), header or its rule
        if breaks:
            if para:
                yield " ".join(para)
            para = []
            continue
        para.append(line.strip())
    if para:
        yield " ".join(para)


def clean_sentence(s: str) -> str | None:
    """The sentence normalized, or None if it fails the filters."""
    s = " ".join(_EMPH.sub(r"\1", s).split())
    if not s or not s[0].isupper() or s[-1] not in ".!?" or not s.isascii():
        return None
    if _BAD.search(_ABBREV.sub("", s)) or _VERSION_NOTE.match(s):
        return None
    if not MIN_WORDS <= len(s.split()) <= MAX_WORDS:
        return None
    return s


def sentences(text: str):
    for para in paragraphs(text):
        for raw in _SPLIT.split(para):
            s = clean_sentence(raw)
            if s is not None:
                yield s


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def module_docs(name: str) -> list[str]:
    """Docstrings of module `name`: its own, then (sorted by name) those of the public classes
    and functions it defines, each class followed by its public methods/properties."""
    try:
        with _quiet():
            mod = importlib.import_module(name)
    except Exception:  # platform-specific or removed in this Python: skip
        return []
    docs = [inspect.getdoc(mod) or ""]
    modname = mod.__name__
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) not in (modname, name):
            continue  # imported from elsewhere (os.path functions live in posixpath: listed)
        d = inspect.getdoc(obj) if inspect.isclass(obj) else obj.__doc__
        if isinstance(d, str):
            docs.append(inspect.cleandoc(d))
        if inspect.isclass(obj):
            for a2, o2 in sorted(vars(obj).items()):
                if a2.startswith("_"):
                    continue
                d2 = getattr(o2, "__doc__", None)
                if isinstance(d2, str) and (inspect.isroutine(o2) or isinstance(
                        o2, (property, classmethod, staticmethod))):
                    docs.append(inspect.cleandoc(d2))
    return docs


def _hash_order(items, tag: str):
    return sorted(items, key=lambda s: hashlib.sha256(f"{SEED}:{tag}:{s}".encode()).hexdigest())


def _unique(seq):
    seen, out = set(), []
    for s in seq:
        if s.lower() not in seen:
            seen.add(s.lower())
            out.append(s)
    return out


def collect() -> tuple[list[str], dict[str, list[str]]]:
    """All sentences (for Sentlen) and the sentences of each topical family."""
    import pydoc_data.topics as topics

    pool: list[str] = []
    for key in sorted(topics.topics):
        pool.extend(sentences(topics.topics[key]))
    family_sents: dict[str, list[str]] = {}
    for fam, mods in FAMILIES.items():
        fs: list[str] = []
        for m in mods:
            for d in module_docs(m):
                fs.extend(sentences(d))
        family_sents[fam] = _unique(fs)
        pool.extend(family_sents[fam])
    for m in GENERAL_MODULES:
        for d in module_docs(m):
            pool.extend(sentences(d))
    # a sentence in two families has no single label
    owners: dict[str, set[str]] = {}
    for fam, fs in family_sents.items():
        for s in fs:
            owners.setdefault(s.lower(), set()).add(fam)
    family_sents = {fam: [s for s in fs if len(owners[s.lower()]) == 1]
                    for fam, fs in family_sents.items()}
    return _unique(pool), family_sents


def choose_edges(counts: dict[int, int], nbins: int = NUM_BINS) -> list[tuple[int, int]]:
    """Contiguous inclusive word-count bins covering [MIN_WORDS, MAX_WORDS] that maximize the
    smallest bin count (ties: smallest largest bin, then lexicographically smallest cuts)."""
    lengths = list(range(MIN_WORDS, MAX_WORDS + 1))
    cum = [0]
    for n in lengths:
        cum.append(cum[-1] + counts.get(n, 0))
    best = None
    for cuts in itertools.combinations(range(1, len(lengths)), nbins - 1):
        idx = (0,) + cuts + (len(lengths),)
        sizes = [cum[idx[i + 1]] - cum[idx[i]] for i in range(nbins)]
        key = (-min(sizes), max(sizes), cuts)
        if best is None or key < best[0]:
            best = (key, idx)
    idx = best[1]
    return [(lengths[idx[i]], lengths[idx[i + 1] - 1]) for i in range(nbins)]


def _split_rows(groups: list[list[str]], per_group: int, tag: str) -> list[tuple[str, int, str]]:
    n_test = round(per_group * TEST_FRACTION)
    tr, te = [], []
    for label, group in enumerate(groups):
        chosen = _hash_order(group, tag)[:per_group]
        te += [("te", label, s) for s in chosen[:n_test]]
        tr += [("tr", label, s) for s in chosen[n_test:]]
    key = lambda r: hashlib.sha256(f"{SEED}:{tag}-order:{r[2]}".encode()).hexdigest()
    return sorted(tr, key=key) + sorted(te, key=key)


def _write_tsv(path: Path, rows) -> None:
    text = "".join(f"{split}\t{label}\t{s}\n" for split, label, s in rows)
    path.write_bytes(text.encode("ascii"))


def build(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    pool, family_sents = collect()

    counts: dict[int, int] = {}
    for s in pool:
        counts[len(s.split())] = counts.get(len(s.split()), 0) + 1
    edges = choose_edges(counts)
    bins = [[s for s in pool if lo <= len(s.split()) <= hi] for lo, hi in edges]
    per_bin = min(min(len(b) for b in bins), SENTLEN_PER_BIN)
    _write_tsv(out / "sentlen_standin.tsv", _split_rows(bins, per_bin, "sentlen"))

    fams = list(FAMILIES)
    per_class = min(min(len(family_sents[f]) for f in fams), TOPICS_PER_CLASS)
    _write_tsv(out / "topics_standin.tsv",
               _split_rows([family_sents[f] for f in fams], per_class, "topics"))

    meta = {
        "built_with_python": sys.version.split()[0],
        "seed": SEED,
        "word_count": "len(sentence.split()) (whitespace tokens)",
        "sentlen": {
            "bin_edges": [list(e) for e in edges],
            "available_per_bin": [len(b) for b in bins],
            "per_bin": per_bin,
            "pool_size": len(pool),
        },
        "topics": {
            "class_names": fams,
            "modules": {f: list(m) for f, m in FAMILIES.items()},
            "available_per_class": [len(family_sents[f]) for f in fams],
            "per_class": per_class,
        },
        "test_fraction": TEST_FRACTION,
    }
    (out / "standin_text_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "lpdl_core" / "data" / "resources"
    ap.add_argument("--out", type=Path, default=default)
    args = ap.parse_args(argv)
    meta = build(args.out)
    print(json.dumps(meta["sentlen"]), json.dumps(meta["topics"]["available_per_class"]))
    for f in ("sentlen_standin.tsv", "topics_standin.tsv", "standin_text_meta.json"):
        print(f, (args.out / f).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
