"""Orphans of `make airflow`'s process tree come to the watching process, which ends them.

A scheduler that dies leaves its executor workers, task processes and log server running.
Looking at its descendants now and then misses those born after the last look, and those
already re-parented to init by the time it looks (issue 47: 8 LocalExecutor workers outlived
a killed scheduler on a loaded machine). As a child subreaper (Linux prctl) the watcher is
where every orphan of its descendants goes, whatever the timing; it then kills each one with
its descendants and reaps them, so that none is left and no zombie stays.
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Iterator

import psutil

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37
REAP_TIMEOUT_S = 5.0


def _prctl(option: int, arg: object) -> bool:  # arg: an int, or a pointer (byref)
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, arg, 0, 0, 0) == 0


def is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    return _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and flag.value == 1


@contextlib.contextmanager
def adopting_orphans() -> Iterator[bool]:
    """This process is a child subreaper for the block (yields whether it could be: Linux
    only). Orphans still alive at its end are left to end_orphans of the caller."""
    adopting = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield adopting
    finally:
        if adopting:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)


def own_children() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def end_orphans(keep: set[int]) -> list[int]:
    """SIGKILL this process's children that are not in `keep` (those it started itself), with
    all their descendants, and reap them. Returns the pids of the adopted orphans."""
    ended: list[int] = []
    # Killed descendants come here as orphans in turn (zombies or dying): passes until none.
    for _ in range(4):
        strays = [child for child in psutil.Process().children() if child.pid not in keep]
        if not strays:
            break
        victims = list(strays)
        for stray in strays:
            with contextlib.suppress(psutil.Error):
                victims.extend(stray.children(recursive=True))
        for victim in victims:
            with contextlib.suppress(psutil.Error):
                victim.kill()
        psutil.wait_procs(strays, timeout=REAP_TIMEOUT_S)  # reaps: they are our children
        ended.extend(stray.pid for stray in strays if stray.pid not in ended)
    return ended
