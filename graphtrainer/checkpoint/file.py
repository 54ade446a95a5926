"""Checkpoint files on disk: atomic, verifiable writes and safe, verified reads.

Every file written here ends with a SHA-256 digest of its bytes in the zip comment (which
torch's reader ignores): one flipped byte is found before anything loads. Files without it
get the zip's CRC check of every member.

A file is written to ``.<name>.tmp-<host>-<pid>`` and renamed over the target when complete,
so a crash or full disk leaves the earlier file intact. The partial file is removed on
exceptions and, in ranks, on SIGINT; one left by a killed writer by the next fit
(:func:`graphtrainer.checkpoint.run_files.remove_dead_partials`) or save into that folder.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import socket
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

import torch

from ..process import pids

_MARK = b"graphtrainer-sha256:"
_TRAILER_LEN = len(_MARK) + 64  # the zip comment: mark + hex digest
_EOCD = b"PK\x05\x06"  # zip end-of-central-directory record: 22 bytes + comment
_EOCD_LEN = 22
_CHUNK = 1 << 20
#: How far from the end a moved trailer is looked for: a zip reader finds its end record that far back.
_TAIL_SEARCH = 1 << 17
#: The trailer's start, with the comment length before it (found even with its digest cut off).
_MARK_SEARCH = struct.pack("<H", _TRAILER_LEN) + _MARK

#: Partial files this process is writing now (removed by the signal handlers).
_IN_PROGRESS: Set[Path] = set()


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, read, verified, or that does not fit the model."""


class _HashingWriter:
    """The file object handed to ``torch.save``: hashes what passes and keeps the I/O error."""

    def __init__(self, fh: Any):
        self.fh, self.digest, self.size, self.tail = fh, hashlib.sha256(), 0, b""
        self.os_error: Optional[OSError] = None

    def write(self, data: Any) -> int:
        data = bytes(data)
        try:
            self.fh.write(data)
        except OSError as err:
            self.os_error = err
            raise
        self.digest.update(data)
        self.size += len(data)
        self.tail = (self.tail + data)[-_EOCD_LEN:]
        return len(data)

    def flush(self) -> None:
        self.fh.flush()


def write_verified(obj: Dict[str, Any], fh: Any, name: str) -> None:
    """``torch.save(obj)`` into the open binary file ``fh``, then its digest trailer; I/O
    errors as :class:`CheckpointError` naming the cause and ``name``."""
    writer = _HashingWriter(fh)
    try:
        torch.save(obj, writer)
        if not writer.tail.startswith(_EOCD) or writer.tail[-2:] != b"\0\0":
            raise CheckpointError(f"torch.save wrote no plain zip archive to {name}: cannot add a digest")
        # The comment length (the record's last 2 bytes) becomes the trailer's; the
        # digest covers the file as torch wrote it, with that length still 0.
        fh.seek(writer.size - 2)
        fh.write(struct.pack("<H", _TRAILER_LEN) + _MARK + writer.digest.hexdigest().encode())
        fh.flush()
        os.fsync(fh.fileno())
    except Exception as err:
        cause = writer.os_error or (err if isinstance(err, OSError) else None)
        if cause is None:
            raise
        raise CheckpointError(_io_message(cause, name)) from cause


def _io_message(err: OSError, name: str) -> str:
    if err.errno == errno.ENOSPC:
        what = "No space left on device"
    elif err.errno == errno.EFBIG:
        what = "File too large (a file size limit is set, e.g. ulimit -f)"
    elif err.errno == errno.EDQUOT:
        what = "Disk quota exceeded"
    else:
        what = err.strerror or str(err)
    return f"{what} while writing {name}; earlier checkpoints are intact"


def atomic_save(obj: Dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``obj`` to ``path`` so that a crash or full disk leaves the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{_host()}-{os.getpid()}")
    _IN_PROGRESS.add(tmp)
    try:
        try:
            with open(tmp, "wb") as fh:
                write_verified(obj, fh, str(path))
        except OSError as err:  # opening or closing the file
            raise CheckpointError(_io_message(err, str(path))) from err
        os.replace(tmp, path)
    finally:
        _IN_PROGRESS.discard(tmp)
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def link_or_copy(target: str | os.PathLike, link: str | os.PathLike) -> bool:
    """Make ``link`` a relative symbolic link to ``target`` (a file beside it), replacing what is there
    in one rename; where symbolic links cannot be made, an atomic copy. Returns whether it linked."""
    target, link = Path(target), Path(link)
    tmp = link.with_name(f".{link.name}.tmp-{_host()}-{os.getpid()}")
    _IN_PROGRESS.add(tmp)
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.symlink(os.path.relpath(target, link.parent), tmp)
            linked = True
        except OSError:  # a file system or OS without symbolic links for this user
            shutil.copyfile(target, tmp)
            linked = False
        os.replace(tmp, link)
    finally:
        _IN_PROGRESS.discard(tmp)
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
    return linked


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def remove_stale_partials(folder: Path) -> List[str]:
    """Remove partial files in ``folder`` left by writers on this host that no longer run;
    return their paths."""
    prefix = f"-{_host()}-"
    removed: List[str] = []
    for tmp in folder.glob(".*.tmp-*"):
        tail = tmp.name.rsplit(".tmp", 1)[-1]
        if not tail.startswith(prefix):
            continue
        try:
            pid = int(tail[len(prefix):])
        except ValueError:
            continue
        if pid != os.getpid() and not pids.alive(pid):
            tmp.unlink(missing_ok=True)
            removed.append(str(tmp))
    return removed


def remove_partials_on_signals() -> None:
    """In a rank: on SIGTERM or SIGINT, remove the partial file being written, then act as
    before (end the process, or raise ``KeyboardInterrupt``). Call from the main thread."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        signal.signal(signum, _make_handler(signum, previous))


def _make_handler(signum: int, previous: Any) -> Callable[[int, Any], None]:
    def handler(sig: int, frame: Any) -> None:
        for tmp in list(_IN_PROGRESS):
            try:
                tmp.unlink()
            except OSError:
                pass
        if callable(previous):
            previous(sig, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    return handler


def verify(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path``'s bytes are intact."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        if size >= _EOCD_LEN + _TRAILER_LEN:
            fh.seek(size - _TRAILER_LEN - _EOCD_LEN)
            end = fh.read()
            comment_len = struct.unpack("<H", end[_EOCD_LEN - 2:_EOCD_LEN])[0]
            has_mark = end[_EOCD_LEN:].startswith(_MARK)
            if not has_mark and _MARK_SEARCH in _tail(fh, size):  # written here, then cut short or extended
                raise CheckpointError(_damaged(path, "its digest trailer is not where it was written: the file "
                                                     "was cut short or had bytes added"))
            if has_mark or (end.startswith(_EOCD) and comment_len == _TRAILER_LEN):  # written here
                if not (has_mark and end.startswith(_EOCD) and comment_len == _TRAILER_LEN
                        and _digest_matches(fh, size, end)):
                    raise CheckpointError(_damaged(path, "its bytes do not match the SHA-256 digest "
                                                         "written with it"))
                return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise CheckpointError(_damaged(path, f"it is not a readable zip archive ({err})")) from err
    if bad is not None:
        raise CheckpointError(_damaged(path, f"member {bad!r} fails its CRC check"))


def _tail(fh: Any, size: int) -> bytes:
    """The file's last bytes: as far back as a zip reader looks for its end record."""
    fh.seek(max(0, size - _TAIL_SEARCH))
    return fh.read()


def _digest_matches(fh: Any, size: int, end: bytes) -> bool:
    digest = hashlib.sha256()
    body = size - _TRAILER_LEN - 2  # everything torch wrote except the comment length
    fh.seek(0)
    left = body
    while left > 0:
        chunk = fh.read(min(_CHUNK, left))
        if not chunk:
            return False
        digest.update(chunk)
        left -= len(chunk)
    digest.update(b"\0\0")
    return digest.hexdigest().encode() == end[_EOCD_LEN + len(_MARK):]


def _damaged(path: Path, why: str) -> str:
    return (f"checkpoint {path} is damaged: {why}. Its weights cannot be trusted; resume from "
            "another checkpoint (an earlier epoch's file, or last.ckpt)")


def check_checkpoint_path(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` when it is a file; else ``IsADirectoryError`` (naming the checkpoints
    in it) or ``FileNotFoundError``, each saying what to pass instead."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.ckpt"))
        hint = f" (it holds {', '.join(found[:5])})" if found else ""
        raise IsADirectoryError(f"checkpoint path {path} is a directory{hint}: pass one checkpoint file "
                                "inside it, or ckpt_path='last' / 'best'")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist: pass an existing file, or "
                                "ckpt_path='last' / 'best' (a ModelCheckpoint's files)")
    return path


def read_verified(path: str | os.PathLike) -> Dict[str, Any]:
    """Verify ``path``, then load it on CPU without running code from it (``weights_only``)."""
    path = check_checkpoint_path(path)
    verify(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises many types for bad files
        if "weights_only" in str(err) or "Weights only" in str(err):
            why = ("it holds Python objects other than tensors and plain values, which graphtrainer "
                   "checkpoints never do, so the safe loader refused it")
        else:
            why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        raise CheckpointError(f"checkpoint {path} cannot be read: {why}. It is damaged or not a "
                              "graphtrainer checkpoint") from None
