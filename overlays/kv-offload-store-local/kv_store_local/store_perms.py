# SPDX-License-Identifier: Apache-2.0
"""Who may read and change the store (docs/DEPLOY.md, "Security").

A chunk is the KV of a user's prompt, and with restore on it is an input:
so the writer makes everything it creates private to the serving user
(folders 0700, files 0600), or readable by one group the operator names
(GLM53_KV_OFFLOAD_GROUP: folders 02750, files 0640), never by the world,
whatever the umask. Modes are set on the open descriptor (never by path,
which another user could swap), and what exists already is left as found.

At boot, like ssh's StrictModes, the store folder and every folder above
it must be changeable by nobody but root and the serving user: no symlink,
owned by root or this user, not group/world-writable (above the store, a
root-owned sticky folder such as /tmp is fine: others cannot rename or
remove what they do not own in it).
"""

import errno
import grp
import os
import stat
from dataclasses import dataclass

# The codec alone (not .deps, which needs the knob contract too): the
# restore imports this module where only the codec is beside it.
try:
    from .. import kv_store_format as fmt
except ImportError:  # loaded from the overlay folders
    import kv_store_format as fmt  # type: ignore[no-redef]

_DIR_PRIVATE = 0o700
_FILE_PRIVATE = 0o600
# setgid: what is created inside inherits the group (the C write path
# creates chunk files without knowing the gid).
_DIR_GROUP = 0o2750
_FILE_GROUP = 0o640


class UnsafeStore(Exception):
    """The store is changeable by others, or the group knob is unusable."""


@dataclass(frozen=True)
class Modes:
    gid: int | None = None  # the group that may read, or None: private

    @property
    def dir_mode(self) -> int:
        return _DIR_PRIVATE if self.gid is None else _DIR_GROUP

    @property
    def file_mode(self) -> int:
        return _FILE_PRIVATE if self.gid is None else _FILE_GROUP

    @property
    def group_read(self) -> bool:
        return self.gid is not None


_current = [Modes()]


def current() -> Modes:
    """The modes this process creates store entries with."""
    return _current[0]


def use(modes: Modes) -> None:
    """Set them for the process (the writer, at boot: one tier per process)."""
    _current[0] = modes


def modes_for_group(name: str) -> Modes:
    """Private for "", else the named group, which this process must be in
    (or files it creates could not be given to it); UnsafeStore if not."""
    if not name:
        return Modes()
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise UnsafeStore(f"group {name!r} does not exist") from None
    if gid != os.getegid() and gid not in os.getgroups():
        raise UnsafeStore(
            f"the serving user (uid {os.geteuid()}) is not in group {name!r}"
        )
    return Modes(gid)


def _fix(fd: int, mode: int, modes: Modes) -> None:
    # chown before chmod: a chown may clear setgid.
    if modes.gid is not None:
        os.fchown(fd, -1, modes.gid)
    os.fchmod(fd, mode)  # the umask only ever took bits away


def create_file(path: str, flags: int, modes: Modes | None = None) -> int:
    """A new file (O_EXCL, never through a symlink, neither the file nor a
    folder on its path) with the store's mode; returns its descriptor. On
    error nothing is left behind."""
    m = modes or current()
    fd = fmt.open_nofollow(path, flags | os.O_CREAT | os.O_EXCL, m.file_mode)
    try:
        _fix(fd, m.file_mode, m)
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    return fd


def open_or_create(path: str, flags: int, modes: Modes | None = None) -> int:
    """Create the file as create_file does, or open it as it is (its mode
    kept: never widened, never changed), never through a symlink."""
    try:
        return create_file(path, flags, modes)
    except FileExistsError:
        return fmt.open_nofollow(path, flags)


def open_lock(path: str) -> int:
    """The store lock (created like every store file); a lock another user
    owns (a root `kvstore gc --sweep` made it before issue 45) is named."""
    try:
        return open_or_create(path, os.O_RDWR)
    except PermissionError as e:
        try:
            owner = f"owned by uid {os.lstat(path).st_uid}, "
        except OSError:
            owner = ""
        raise OSError(
            e.errno,
            f"{e.strerror}: {owner}the serving user is uid {os.geteuid()} "
            "(give it the lock: chown it to that user)",
            path,
        ) from None


def make_dir(path: str, modes: Modes | None = None) -> bool:
    """mkdir with the store's mode, in a parent opened without following a
    link; False when it was there (left as is). A symlink there is refused
    (ELOOP), never taken for the folder."""
    m = modes or current()
    parent, name = os.path.split(os.path.abspath(path))
    pfd = fmt.open_nofollow(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            os.mkdir(name, m.dir_mode & 0o777, dir_fd=pfd)
        except FileExistsError:
            if stat.S_ISLNK(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode):
                raise _symlink(path) from None
            return False
        fd = os.open(
            name,
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
            dir_fd=pfd,
        )
    finally:
        os.close(pfd)
    try:
        _fix(fd, m.dir_mode, m)
    finally:
        os.close(fd)
    return True


def make_dirs(path: str, modes: Modes | None = None) -> list[str]:
    """Every missing folder down to path, each as make_dir makes it;
    returns the ones made, outermost first. A symlink on the way is refused
    (ELOOP), never followed."""
    missing = []
    d = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            missing.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
            continue
        if stat.S_ISLNK(st.st_mode):
            raise _symlink(d)
        break
    made = []
    for d in reversed(missing):
        if make_dir(d, modes):
            made.append(d)
    return made


def _symlink(path: str) -> OSError:
    return OSError(errno.ELOOP, "is a symlink (the store follows none)", path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# -- refusing a store others can change -----------------------------------


def folder_problem(path: str, st: os.stat_result, is_store: bool) -> str | None:
    """Why others could change what is in this folder, or None."""
    mode = stat.S_IMODE(st.st_mode)
    shown = f"{path} (mode {mode:04o}, uid {st.st_uid})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return f"{shown} is not a folder"
    if st.st_uid not in (0, os.geteuid()):
        return f"{shown} is owned by another user"
    if mode & 0o022:
        sticky_root = st.st_uid == 0 and mode & stat.S_ISVTX
        if is_store or not sticky_root:
            who = (
                "group- and world"
                if mode & 0o022 == 0o022
                else ("group" if mode & 0o020 else "world")
            )
            return f"{shown} is {who}-writable"
    return None


def store_problem(root: str) -> str | None:
    """The first folder, from the store folder up to /, that others could
    change (one line naming it and its mode), or None. A store folder not
    made yet is checked from the nearest folder above it that exists."""
    path = os.path.normpath(os.path.abspath(root))
    is_store = True
    while True:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            return f"{path}: cannot check ({e.strerror})"
        if st is not None:
            problem = folder_problem(path, st, is_store)
            if problem is not None:
                return problem
        is_store = False
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def check_store(root: str) -> None:
    """UnsafeStore naming the folder, if others could change the store."""
    problem = store_problem(root)
    if problem is not None:
        raise UnsafeStore(f"store folder not safe: {problem}")


# -- every folder below the store folder (issue 45) ------------------------


def rank_problem(layout: fmt.StoreLayout) -> str | None:
    """The store folder's problem (``store_problem``), else the first of the
    rank base, ``manifests/`` and ``pending/`` that is a symlink, not a
    folder, owned by another user or group- or world-writable (one line),
    else None. A folder not made yet passes: the writer makes it private."""
    problem = store_problem(layout.root)
    if problem is not None:
        return problem
    for path in (layout.base, layout.manifest_dir, layout.pending_dir):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{path}: cannot check ({e.strerror})"
        problem = folder_problem(path, st, is_store=True)
        if problem is not None:
            return problem
    return None


def check_rank(layout: fmt.StoreLayout) -> None:
    """UnsafeStore naming the folder, if others could change the rank base."""
    problem = rank_problem(layout)
    if problem is not None:
        raise UnsafeStore(f"store folder not safe: {problem}")


class Folders:
    """The chunk folders (``<hhh>/``, ``<hh>_g<g>/``) of one rank base found
    safe this boot. Each is looked at once, at its first use by the writer
    or the restore, as the store folder is at boot: a symlink, another
    owner or a group- or world-writable mode is refused (the rank base
    above it was checked at boot, so nobody else can swap it after)."""

    _MAX = 1 << 18  # folders remembered; past it, looked at again

    def __init__(self, base: str):
        self.base = os.path.abspath(base)
        self._safe: set[str] = set()

    def problem(self, folder: str) -> str | None:
        """Why ``folder`` (or one between it and the base) is not safe, in
        one line; None when it is, or when it is not made yet."""
        if folder in self._safe:
            return None
        rel = os.path.relpath(folder, self.base)
        if rel == ".":
            return None  # the base itself: checked at boot (rank_problem)
        if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
            return f"{folder} is not below the rank base {self.base}"
        if len(self._safe) >= self._MAX:
            self._safe.clear()
        path = self.base
        for part in rel.split("/"):
            path = f"{path}/{part}"
            if path in self._safe:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return None
            except OSError as e:
                return f"{path}: cannot check ({e.strerror})"
            problem = folder_problem(path, st, is_store=True)
            if problem is not None:
                return problem
            self._safe.add(path)
        return None
