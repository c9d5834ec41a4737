"""The files of the on-disk compile cache: where the cache lives, entries written atomically with a
checksum and verified before use, and the removal of temporary files that a killed compile left behind.

A cache directory that cannot be used (a file in its place, not writable, a file where a subdirectory
should be) is replaced, for this process, by a private temporary directory, with one warning. A shared
object is installed with a checksum file next to it (``KEY.so.sum``: key, size, sha256); ``verified``
reads both before anything may ``dlopen`` the object. Temporary files are named ``.KEY.RANDOM.SUFFIX``
(KEY: 40 hex digits), so those left by a killed process can be recognised and removed once stale.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

CACHE_ENV = "LIGHTSPEED_CACHE_DIR"
STALE_TEMP_S = 3600.0  # a temporary file this old belongs to no running compile
_TEMP_NAME = re.compile(r"^\.[0-9a-f]{40}\.[A-Za-z0-9_]+\.(?:c|so|tmp|gch)$")


class CacheWarning(RuntimeWarning):
    """A cache entry or directory could not be used; the entry is rebuilt or a private directory is used."""


class CacheDirError(RuntimeError):
    """Neither the cache directory nor a private temporary directory can hold compiled files."""


def warn(message: str) -> None:
    """A CacheWarning (so it can be filtered or made an error), attributed to the first caller outside
    the package: the line of the caller's code that compiled, not a line of Lightspeed."""
    package = str(Path(__file__).resolve().parents[2]) + os.sep
    frame, level = inspect.currentframe(), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"lightspeed: {message}", CacheWarning, stacklevel=level)


def _configured() -> str:
    env = os.environ.get(CACHE_ENV)
    if env:
        return env
    try:
        return str(Path.home() / ".cache" / "lightspeed")
    except (RuntimeError, KeyError):  # no home directory: the fallback below takes over
        return ""


def _problem(d: Path) -> str | None:
    """Why ``d`` cannot hold cache files, or None when it can (it is created when missing)."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "a file is in its place"
    except OSError as e:
        return e.strerror or type(e).__name__
    if not d.is_dir():
        return "a file is in its place"
    try:  # a real write: access() says yes to root on read-only mounts and pseudo file systems
        fd, probe = tempfile.mkstemp(prefix=".lightspeed-probe.", dir=d)
    except OSError as e:
        return f"it is not writable ({e.strerror or type(e).__name__})"
    os.close(fd)
    os.unlink(probe)
    return None


@lru_cache(maxsize=None)
def _private_dir(configured: str, reason: str) -> Path:
    """A temporary directory standing in for ``configured`` in this process (made and announced once)."""
    try:
        d = Path(tempfile.mkdtemp(prefix="lightspeed-cache-"))
    except OSError as e:
        raise CacheDirError(f"the cache directory {configured or '(none)'} cannot be used ({reason}) and no "
                            f"private temporary directory could be made ({e.strerror}); set {CACHE_ENV} "
                            "to a writable directory") from None
    atexit.register(shutil.rmtree, d, True)
    warn(f"cache directory {configured or '(none)'} cannot be used ({reason}); compiling into {d} for this "
         f"process (set {CACHE_ENV} to a writable directory)")
    return d


def cache_dir() -> Path:
    """The cache directory: ``$LIGHTSPEED_CACHE_DIR`` or ``~/.cache/lightspeed``, or a private temporary
    directory when that cannot be used."""
    configured = _configured()
    problem = _problem(Path(configured)) if configured else "no home directory"
    return Path(configured) if problem is None else _private_dir(configured, problem)


def cache_subdir(name: str) -> Path:
    """``cache_dir() / name``, or a private temporary directory when that cannot be used."""
    d = cache_dir() / name
    problem = _problem(d)
    return d if problem is None else _private_dir(str(d), problem)


def remove_stale_temps(d: Path, max_age_s: float = STALE_TEMP_S) -> int:
    """Remove temporary files older than ``max_age_s`` that a killed compile left in ``d``; their number."""
    now, removed = time.time(), 0
    try:
        with os.scandir(d) as it:
            for e in it:
                if e.name.startswith(".") and _TEMP_NAME.match(e.name):
                    try:
                        if now - e.stat(follow_symlinks=False).st_mtime > max_age_s:
                            os.unlink(e.path)
                            removed += 1
                    except OSError:  # gone already, or not ours to remove
                        pass
    except OSError:
        pass
    return removed


def temp_file(d: Path, key: str, suffix: str) -> tuple[int, str]:
    """(fd, path) of a new temporary file in ``d`` named for ``key`` (see the module docstring)."""
    return tempfile.mkstemp(prefix=f".{key}.", suffix=suffix, dir=d)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, key: str, data: bytes) -> None:
    """Write ``data`` to ``path``: a temporary file, flushed to disk, then renamed into place, so readers
    see the old file, none, or the complete new one."""
    fd, tmp = temp_file(path.parent, key, ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sum")


def verified(path: Path, key: str) -> tuple[bool, str | None]:
    """(ok, problem): ok when ``path`` holds exactly the bytes its checksum file records for ``key``;
    otherwise problem says what is wrong, or is None when the entry is simply absent (or has no checksum
    file, as entries written before checksums did not)."""
    try:
        record = checksum_path(path).read_bytes()
    except FileNotFoundError:
        return False, None
    except OSError as e:
        return False, f"its checksum file cannot be read ({e.strerror})"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False, None
    except OSError as e:
        return False, f"it cannot be read ({e.strerror})"
    try:
        want = json.loads(record)
        size, digest, owner = int(want["size"]), str(want["sha256"]), str(want["key"])
    except (ValueError, KeyError, TypeError):
        return False, "its checksum file is corrupt"
    if owner != key:
        return False, f"its checksum file belongs to another entry ({owner})"
    if len(data) != size:
        return False, f"it has {len(data)} bytes, {size} were written (truncated or overwritten)"
    if hashlib.sha256(data).hexdigest() != digest:
        return False, "its checksum does not match (corrupted)"
    return True, None


@contextmanager
def _install_lock(d: Path) -> Iterator[None]:
    """Serialises installs in ``d`` across processes, so an object and its checksum file go in as a pair."""
    fd = os.open(d / "install.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install(tmp: str, path: Path, key: str) -> None:
    """Move the finished temporary file ``tmp`` to ``path`` with its checksum file. When another process
    installed a valid entry meanwhile, that one is kept (and ``tmp`` removed)."""
    _fsync(tmp)
    with open(tmp, "rb") as f:
        data = f.read()
    record = json.dumps({"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}).encode()
    with _install_lock(path.parent):
        if verified(path, key)[0]:
            os.unlink(tmp)
            return
        # checksum first: a reader that sees the new checksum with an old object rejects the pair
        write_atomic(checksum_path(path), key, record)
        os.replace(tmp, path)
