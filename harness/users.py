"""Running code as another user: a forked child with that user's credentials, so permission checks are the
kernel's (and the file system's) real ones."""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    groups: tuple[int, ...]


def as_user(user: User, fn: Callable, *args, **kwargs):
    """Runs fn(*args, **kwargs) in a forked child with `user`'s credentials (setgroups, setresgid, setresuid)
    and returns its (picklable) value. An OSError in the child is re-raised here with the same errno and
    message; any other exception becomes an AssertionError carrying the child's traceback. The child never
    returns into the caller (os._exit)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setgroups(list(user.groups))
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)
            try:
                out = ("ok", fn(*args, **kwargs))
            except OSError as e:
                out = ("oserror", e.errno, str(e))
            except BaseException:  # noqa: B902 -- everything must reach the parent
                out = ("exception", traceback.format_exc())
            data = pickle.dumps(out)
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"as_user child for {user} failed to report"
    out = pickle.loads(data)
    if out[0] == "ok":
        return out[1]
    if out[0] == "oserror":
        raise OSError(out[1], f"as uid {user.uid}: {out[2]}")
    raise AssertionError(f"as uid {user.uid}: {out[1]}")


def errno_as_user(user: User, fn: Callable, *args, **kwargs):
    """as_user, but an OSError in the child comes back as the value ("errno", n) instead of being raised."""
    try:
        return as_user(user, fn, *args, **kwargs)
    except OSError as e:
        return ("errno", e.errno)
