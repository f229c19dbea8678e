"""Where results go, checked before any work: a run's outputs are never lost at its end.

Every command that writes (train and reference --out, compare --out, bench --json, predict
--json/--plot/--out) hands its paths here before the first worker starts:

    prepare_out_dir(path, overwrite, resume)   a results folder: made if missing, writable, and
                                                not an earlier run's unless --overwrite (or
                                                --resume of that very folder)
    prepare_file(path)                          one file: its folder made and writable, the name
                                                free for a regular file
    claim_out_dir(path, overwrite, resume)      prepare_out_dir + a lock held for the whole
                                                command (a context manager; cli.py wraps every
                                                command that writes a run folder in one)

A path that cannot be used is an OutputError (a ConfigError: the CLI prints one line and exits
2). Why before the work: a run's results exist only in memory until its end, so an --out found
unusable then (a file, a path under a file, an unwritable folder) costs the whole run.

The lock. DIR/.pipesgd.lock holds the pid of the job using DIR, and that job holds an flock on
it: the kernel drops an flock when its holder dies, however it dies, so a lock left by a killed
job is stale by construction and is simply taken over (no pid guessing). Workers forked by the
job inherit the open lock, so a folder stays taken while any of them still runs.

Writes themselves stay atomic (a temporary file in the same folder, then os.replace):
`write_text_atomic` and `write_json` here, checkpoint.save, plots.save_figure. A write that
fails (a full disk) removes its temporary file and is one OutputError naming the file and the
space it needed; the temporary files a killed run left are removed by the next run that claims
the folder (`remove_leftovers`). Every file of a run has the mode 0666 less the user's umask.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipesgd_ref.errors import OutputError

LOCK_FILE = ".pipesgd.lock"
# Files whose presence makes a folder an earlier run's results (train and reference:
# summary.json, checkpoint.npz; compare: compare.json and one such folder per run, or
# INCOMPLETE while a comparison runs or after one was stopped).
RUN_MARKERS = ("summary.json", "checkpoint.npz", "compare.json", "INCOMPLETE")
# Every file a command writes at the top of its results folder: each must be free for a
# regular file (missing, or a file) before the work, or the results are lost at its end.
RESULT_FILES = ("summary.json", "checkpoint.npz", "compare.json", "trace.json", "study.json")
_SCAN_DEPTH = 2  # compare's folders: DIR/LABEL/summary.json, DIR/LABEL/repeat-K/summary.json
_TMP_EXTRA = 16  # characters an atomic write adds to a name: ".NAME.XXXXXXXX.tmp"
_SCAN_LIMIT = 1000  # entries looked at, at most: --out pointed at a big folder stays fast


def _shown(path: Path | str) -> str:
    return repr(str(path))


def _blocking_file(path: Path) -> Path | None:
    """The nearest existing ancestor-or-self of `path` when it is not a folder (a path "under
    a file"), else None."""
    for p in (path, *path.parents):
        try:
            os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError:  # a name too long, a loop of links: mkdir says which, next
            return None
        return None if p.is_dir() else p
    return None


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def _make_dir(path: Path, flag: str) -> list[Path]:
    """Create `path` (and missing parents) as a writable folder; the folders it created, the
    deepest last."""
    if str(path) == "":
        raise OutputError(f"{flag} is empty; give a folder name")
    blocker = _blocking_file(path)
    if blocker == path:
        raise OutputError(
            f"{flag} {_shown(path)} is a file, not a folder; give a folder name "
            f"(or remove the file)"
        )
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)][::-1]
    _writable_folder(path, flag, path)
    return missing


def _writable_folder(folder: Path, flag: str, named: Path) -> None:
    """Create `folder` (and missing parents) and check that it is writable; `named` is the
    path the user gave under `flag` (the folder itself, or a file in it), for the errors."""
    blocker = _blocking_file(folder)
    if blocker is not None:
        raise OutputError(
            f"{flag} {_shown(named)} is under {_shown(blocker)}, which is a "
            f"file, not a folder; choose another path"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        what = "the folder" if named == folder else f"its folder {_shown(folder)}"
        raise OutputError(
            f"{flag} {_shown(named)}: cannot create {what} ({_why(e)}); choose a writable path"
        ) from None
    _probe_writable(folder, flag)


def _probe_writable(folder: Path, flag: str) -> None:
    """Create and remove a file in `folder`: the one test of writability that also holds for
    read-only mounts, full disks' directory entries and ACLs (os.access does not)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".pipesgd-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(
            f"{flag} {_shown(folder)}: cannot write there ({_why(e)}); choose a writable folder"
        ) from None


def earlier_run(folder: Path) -> Path | None:
    """A file that makes `folder` an earlier run's results (RUN_MARKERS, in the folder or up to
    _SCAN_DEPTH levels below it), or None."""
    seen = 0
    level = [folder]
    for _ in range(_SCAN_DEPTH + 1):
        below = []
        for d in level:
            for name in RUN_MARKERS:
                if (d / name).exists():
                    return d / name
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > _SCAN_LIMIT:
                    return None
                if entry.is_dir(follow_symlinks=False):
                    below.append(Path(entry.path))
        level = below
    return None


def _same_folder(a: str | Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _refuse_earlier_run(
    folder: Path, overwrite: bool, resume: str | Path | None, flag: str
) -> None:
    """`resume`: the command's --resume ("" when not given), None for a command that cannot
    resume, whose error then suggests no --resume."""
    if overwrite or (resume and _same_folder(resume, folder)):
        return
    found = earlier_run(folder)
    if found is not None:
        to_resume = "" if resume is None else f"--resume={folder} to continue that run, "
        raise OutputError(
            f"{flag} {_shown(folder)} already holds an earlier run's results "
            f"({found.relative_to(folder)}); pass --overwrite to replace them, "
            f"{to_resume}or choose another {flag}"
        )


# The temporary files of writes cut short by a SIGKILL: checkpoint.save's, write_text_atomic's
# (and mkstemp's before it), plots.save_figure's, the writability probe's.
_LEFTOVER = re.compile(
    r"checkpoint\.npz\.tmp|\.[^/]+\.(json|npz|png|pdf|svg)(\.[A-Za-z0-9_]{8})?\.tmp"
    r"|\.pipesgd-probe-[A-Za-z0-9_]{8}"
)


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove what a run killed in the middle of a write left in `folder` and its run folders
    (_SCAN_DEPTH levels, compare's): temporary files (_LEFTOVER) that no live job can be
    writing, since the caller holds the folder's lock. The paths removed (logged)."""
    removed: list[Path] = []
    level = [folder]
    for _ in range(_SCAN_DEPTH + 1):
        below = []
        for d in level:
            try:
                entries = list(os.scandir(d))[:_SCAN_LIMIT]
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    below.append(Path(entry.path))
                elif _LEFTOVER.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                        removed.append(Path(entry.path))
        level = below
    if removed:
        logging.getLogger("pipesgd.outputs").warning(
            "removed %d temporary file(s) an earlier run left when it was killed: %s",
            len(removed),
            ", ".join(str(p) for p in removed[:5]),
        )
    return removed


def _refuse_odd_names(folder: Path, flag: str) -> None:
    """A folder (or a pipe, a device) where the run writes one of RESULT_FILES: refused now,
    not after the run, whatever --overwrite says (it replaces files, never folders)."""
    for name in RESULT_FILES:
        try:
            mode = os.stat(folder / name).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OutputError(
                f"{flag} {_shown(folder)}: {name} there is {kind}, and the run writes its "
                f"{name} file there; remove it, or choose another {flag}"
            )


def prepare_out_dir(
    path: str | Path,
    overwrite: bool = False,
    resume: str | Path | None = None,
    flag: str = "--out",
) -> Path:
    """Check and create the results folder `path` (OutputError when unusable); refuse a
    folder with an earlier run's results unless `overwrite`, or `resume` names it (None: the
    command cannot resume)."""
    folder = Path(path)
    _make_dir(folder, flag)
    _refuse_odd_names(folder, flag)
    _refuse_earlier_run(folder, overwrite, resume, flag)
    return folder


def prepare_file(path: str | Path, flag: str = "--json") -> Path:
    """Check that `path` can be written (atomically: its folder writable, the name free or a
    regular file) and create its folder; OutputError when not."""
    target = Path(path)
    if str(path) == "":
        raise OutputError(f"{flag} is empty; give a file name")
    try:
        mode = os.stat(target).st_mode
    except OSError:  # missing (the usual case), or a name the mkdir below will explain
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError(
            f"{flag} {_shown(target)} is a folder; give a file name, e.g. {target / 'results.json'}"
        )
    if mode is not None and not stat.S_ISREG(mode):
        # A device or a pipe: os.replace would put a regular file in its place.
        raise OutputError(f"{flag} {_shown(target)} is not a regular file; give a file name")
    parent = target.parent
    _writable_folder(parent, flag, target)
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    # The atomic write's temporary name is the file's plus a few characters (_TMP_EXTRA).
    if len(os.fsencode(target.name)) + _TMP_EXTRA > name_max:
        raise OutputError(
            f"{flag}: the file name {target.name[:40]!r}... is too long for its "
            f"folder ({name_max} bytes at most, {_TMP_EXTRA} kept for the "
            f"temporary file); choose a shorter name"
        )
    return target


def space_needed(path: Path, needed: int, e: OSError) -> str:
    """Why `path` could not be written, for one line: a full disk (or quota) says how much
    space the write needed and how much was free there; any other error says its reason."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return _why(e)
    try:
        st = os.statvfs(path.parent)
        free = f", {_size(st.f_bavail * st.f_frsize)} free"
    except OSError:
        free = ""
    what = "the disk is full" if e.errno == errno.ENOSPC else "the disk quota is used up"
    return f"{what}: it needs {_size(needed)}{free}"


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} GiB"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder and os.replace: a
    reader (or a crash) sees the old file or the new one, never half of one. A write that
    fails (a full disk, a folder where the file goes) removes its temporary file and is an
    OutputError naming `path` and, for a full disk, the space it needed."""
    path = Path(path)
    data = text.encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(
                f"cannot write {_shown(path)} ({space_needed(path, len(data), e)}); {_advice(e)}"
            ) from None
        raise
    return path


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new file `.NAME.XXXXXXXX.tmp` beside `path`, open for writing, with the mode any file
    the user creates gets (0666 less the umask, as checkpoint.npz and the figures have;
    tempfile.mkstemp would make it 0600): every result of a run follows one rule."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue


def _advice(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space there, or write the results elsewhere"
    if e.errno == errno.EISDIR:
        return "a folder has that name: remove it, or write the results elsewhere"
    return "check the path, or write the results elsewhere"


# --- the lock ------------------------------------------------------------------------------


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text().strip()
    except OSError:
        return "another pipesgd job"
    return f"another pipesgd job (pid {pid})" if pid.isdigit() else "another pipesgd job"


def _write_pid(fd: int, lock: Path, folder: str | Path, flag: str) -> None:
    """This job's pid into its lock (for the message of a job that finds the folder taken); an
    OutputError when the disk cannot take even that: the run's results would not fit."""
    pid = f"{os.getpid()}\n".encode()
    try:
        os.ftruncate(fd, 0)
        os.write(fd, pid)
    except OSError as e:
        raise OutputError(
            f"{flag} {_shown(folder)}: cannot write {LOCK_FILE} "
            f"({space_needed(lock, len(pid), e)}); {_advice(e)}"
        ) from None


@contextlib.contextmanager
def lock_out_dir(folder: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Hold DIR/.pipesgd.lock (an flock, with this pid inside) for the duration; OutputError
    at once when another live job holds it. The file is removed on release."""
    lock = Path(folder) / LOCK_FILE
    while True:
        try:
            # 0666 less the umask, as every file of a run (_create_temporary)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as e:
            raise OutputError(
                f"{flag} {_shown(folder)}: cannot create {LOCK_FILE} ({_why(e)})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(
                    f"{flag} {_shown(folder)}: cannot lock {LOCK_FILE} ({_why(e)})"
                ) from None
            raise OutputError(
                f"{flag} {_shown(folder)} is in use by {_holder(lock)}; wait for it to end, "
                f"or choose another {flag}"
            ) from None
        # The holder before us may have removed the file between our open and our flock: then
        # we locked a file nobody else will ever open. Lock the one at the path, or try again.
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        _write_pid(fd, lock, folder, flag)
        yield Path(folder)
    finally:
        # Unlink before unlocking: a job that opens the path from now on gets a new file.
        with contextlib.suppress(OSError):
            os.unlink(lock)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def claim_out_dir(
    path: str | Path,
    overwrite: bool = False,
    resume: str | Path | None = None,
    flag: str = "--out",
) -> Iterator[Path]:
    """The results folder of one command, from before its first worker to its end: checked
    and created (prepare_out_dir), locked (lock_out_dir), released on every exit. Folders it
    created that are still empty at the end (a command that failed before writing) are
    removed again, so a refused run leaves nothing behind."""
    folder = Path(path)
    created = _make_dir(folder, flag)
    try:
        with lock_out_dir(folder, flag):
            remove_leftovers(folder)
            _refuse_odd_names(folder, flag)
            _refuse_earlier_run(folder, overwrite, resume, flag)
            yield folder
    finally:
        for d in reversed(created):
            try:
                d.rmdir()  # only when empty
            except OSError:
                break


__all__ = [
    "LOCK_FILE",
    "RESULT_FILES",
    "RUN_MARKERS",
    "claim_out_dir",
    "earlier_run",
    "lock_out_dir",
    "prepare_file",
    "prepare_out_dir",
    "remove_leftovers",
    "space_needed",
    "write_json",
    "write_text_atomic",
]


def write_json(path: str | Path, payload: dict) -> None:
    """`payload` as indented JSON, written atomically (`write_text_atomic`): summary.json,
    trace.json, compare.json, predict's --json."""
    write_text_atomic(path, json.dumps(payload, indent=2) + "\n")
