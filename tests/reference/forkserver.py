#!/usr/bin/python3
"""Runs the tests' reference scripts in processes forked from this one, which imported torch once:
`import torch` is 2-3 s of CPU on 2 cores, most of a small reference run (tests/cli/ref_lib.sh).

  forkserver.py REQUESTS RESPONSES    (two FIFOs, or any files read and written line by line)

A request is one line: the path of a file holding the run's arguments, one per line: the working
directory, the log file (standard output and error), the timeout in seconds, the script, then its
arguments. The child runs the script as `python3 SCRIPT ARGS...` would (runpy, __name__ == "__main__")
with standard input from /dev/null; the response is one line, its exit status (124 after the timeout,
when it is killed). The server runs no torch operation itself, so that every child starts as a fresh
interpreter would after the import (no thread pool to inherit). It ends at the end of its requests.
"""
import os
import runpy
import signal
import sys
import time
import traceback

import numpy  # noqa: F401  (imported once, for the children)
import torch  # noqa: F401
import yaml  # noqa: F401


def child(cwd, log, script, args):
    try:
        os.chdir(cwd)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.argv = [script] + args
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        rc = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def run(request):
    with open(request) as f:
        lines = f.read().split("\n")
    cwd, log, timeout, script, args = lines[0], lines[1], float(lines[2]), lines[3], lines[4:]
    if args and args[-1] == "":
        args.pop()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(cwd, log, script, args)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            return 128 - rc if rc < 0 else rc  # a signal as the shell says it
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.01)


def main():
    requests, responses = sys.argv[1], sys.argv[2]
    with open(requests) as rq, open(responses, "w") as rs:
        for line in rq:
            line = line.strip()
            if not line:
                continue
            try:
                rc = run(line)
            except Exception:
                traceback.print_exc()
                rc = 1
            rs.write(f"{rc}\n")
            rs.flush()


if __name__ == "__main__":
    main()
