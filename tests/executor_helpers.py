"""A minimal worker ``serve`` for executor tests: answers each request with its payload."""

from __future__ import annotations

from typing import Any


def echo(conn: Any, job: dict[str, Any]) -> None:
    while True:
        command, payload = conn.recv()
        if command == "stop":
            conn.send(("ok", None))
            return
        conn.send(("ok", {"command": command, "payload": payload, "job": job.get("name")}))


def environ_and_progress(conn: Any, job: dict[str, Any]) -> None:
    """``env``: the values of the named variables here; ``count``: ``n`` progress messages, then the answer."""
    import os

    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        command, payload = conn.recv()
        if command == "env":
            conn.send(("ok", {name: os.environ.get(name) for name in payload}))
        elif command == "count":
            for done in range(payload["n"]):
                conn.send(("progress", {"done": done + 1, "total": payload["n"]}))
            conn.send(("ok", "counted"))
        else:
            conn.send(("ok", None))
            return


def sigint_state(conn: Any, job: dict[str, Any]) -> None:
    """``state``: how this process treats SIGINT (ignored? blocked?); anything else ends it."""
    import os
    import signal

    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        command, payload = conn.recv()
        if command == "state":
            conn.send(("ok", {"ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                              "blocked": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}))
        else:
            conn.send(("ok", None))
            return
