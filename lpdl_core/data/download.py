"""Safe downloads and archive extraction for the real dataset loaders.

`fetch` never leaves a partial or corrupt file at its destination: it downloads to
`<dest>.part-<pid>` in the same directory, checks the md5 and only then renames into place
(atomic on one filesystem). Any failure, Ctrl-C included, deletes the temporary file. A network
failure becomes `DatasetMissing` whose message says exactly which file to put where.
"""
from __future__ import annotations

import hashlib
import logging
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from ..atomic import replacing
from .base import ChecksumError, DatasetMissing

TIMEOUT_S = 30.0
_CHUNK = 1 << 20


def md5sum(path: str | os.PathLike, chunk: int = _CHUNK) -> str:
    """Hex md5 of a file, read in chunks."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


log = logging.getLogger("lpdl.data")


class _NetworkError(Exception):
    pass


def fetch(url: str, dest: str | os.PathLike, *, md5: str, what: str, fix_hint: str = "",
          timeout: float = TIMEOUT_S) -> Path:
    """Make sure `dest` holds the file at `url` with the given md5; return `dest`.

    An existing `dest` is only verified (ChecksumError if it does not match). Otherwise the file is
    downloaded to a temporary sibling, verified, and renamed into place.
    """
    dest = Path(dest)
    if dest.exists():
        actual = md5sum(dest)
        if actual != md5:
            raise ChecksumError(
                f"{what}: {dest} is corrupt or incomplete (md5 {actual}, expected {md5}). "
                f"Delete it and run again to re-download it from {url}, or replace it with a good copy.")
        return dest

    h = hashlib.md5()
    try:
        log.info("downloading %s from %s -> %s", what, url, dest)
        # lpdl's one atomic writer: the file appears only whole and verified; on any failure the
        # temporary sibling is removed
        with replacing(dest) as out:
            try:
                req = urllib.request.Request(url, headers={"User-Agent": "lpdl"})
                resp = urllib.request.urlopen(req, timeout=timeout)
            except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                raise _NetworkError(e) from e
            with resp:
                while True:
                    try:
                        block = resp.read(_CHUNK)
                    except (http.client.HTTPException, OSError) as e:
                        raise _NetworkError(e) from e
                    if not block:
                        break
                    out.write(block)
                    h.update(block)
            actual = h.hexdigest()
            if actual != md5:  # raised inside the block: nothing is put in place
                raise ChecksumError(
                    f"{what}: the download from {url} has md5 {actual}, expected {md5}; it was deleted. "
                    f"Try again, or download it by hand to {dest}.")
    except _NetworkError as e:
        cause = e.args[0]
        msg = (f"{what} is not on disk and could not be downloaded ({type(cause).__name__}: {cause}). "
               f"Put the file {dest.name} at {dest} (from {url}, md5 {md5}).")
        raise DatasetMissing(msg + (f" {fix_hint}" if fix_hint else "")) from cause
    return dest


def _check_member(m: tarfile.TarInfo, archive: Path) -> None:
    def bad(why: str) -> ValueError:
        return ValueError(f"refusing to extract {archive}: member {m.name!r} {why}")

    for name, role in ((m.name, "path"), (m.linkname if (m.issym() or m.islnk()) else None, "link target")):
        if name is None:
            continue
        p = PurePosixPath(name.replace("\\", "/"))
        if p.is_absolute() or (len(name) > 1 and name[0].isalpha() and name[1] == ":"):
            raise bad(f"has an absolute {role}")
        if ".." in p.parts:
            raise bad(f"has '..' in its {role}")
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        raise bad("is not a regular file, directory or link")


def extract_tar(archive: str | os.PathLike, dest_dir: str | os.PathLike, *,
                overwrite: bool = False) -> list[Path]:
    """Extract a (possibly compressed) tar into `dest_dir`; return the top-level paths created.

    Everything is first extracted into a temporary directory inside `dest_dir` and each top-level
    entry is then renamed into place, so an interrupted extraction leaves nothing half-written.
    Members with absolute paths or '..' components (and device files) are rejected. An existing
    top-level entry is replaced only with `overwrite=True`, else FileExistsError.
    """
    archive, dest_dir = Path(archive), Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".extract-{os.getpid()}-", dir=dest_dir))
    placed: list[Path] = []
    try:
        with tarfile.open(archive) as tf:
            members = tf.getmembers()
            for m in members:
                _check_member(m, archive)
            if hasattr(tarfile, "data_filter"):
                tf.extractall(tmp, members, filter="data")
            else:  # pragma: no cover - old Pythons without extraction filters
                tf.extractall(tmp, members)
        for top in sorted(tmp.iterdir()):
            target = dest_dir / top.name
            if target.exists() or target.is_symlink():
                if not overwrite:
                    raise FileExistsError(f"{target} already exists; not overwriting it with {archive}")
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            os.replace(top, target)
            placed.append(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return placed
