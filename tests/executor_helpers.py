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
