"""The web UI's API: the names scripts call its endpoints by, kept stable across releases.

Every event of the UI that does work a script may want is an endpoint with a name of
:data:`ENDPOINTS` (``Client(url).predict(..., api_name="/run_benchmark")`` with
``gradio_client``); the events that only keep the page in step (relabelling on a
language change, locking selectors, enabling Cancel) are internal: they are not in
the API (:data:`INTERNAL`).

A start endpoint (``run_benchmark``, ``run_tune``) returns, as its last output, the id
of the run it started (empty when it started nothing); its cancel endpoint takes that
id and stops that run from any session. Without an id the cancel endpoint stops the
run of the caller's own session, which is what the page's Cancel button does.

Examples:
    >>> from gradio_client import Client
    >>> client = Client("http://127.0.0.1:7860/")  # doctest: +SKIP
    >>> started = client.submit("en", "minilm", "test", ["fp32", "fast"], 40, 1, "cpu", "",
    ...                         api_name="/run_benchmark")  # doctest: +SKIP
    >>> run_id = started.outputs()[-1][-1]  # once the run has started  # doctest: +SKIP
    >>> Client("http://127.0.0.1:7860/").predict("en", run_id, api_name="/cancel_benchmark")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENDPOINTS", "INTERNAL", "endpoint"]

#: Endpoint name -> what it does. Renaming one breaks the scripts that call it.
ENDPOINTS: dict[str, str] = {
    "initialize_service": "Apply the matmul precision and check the preset (Run tab, Initialize service).",
    "run_comparison": "Run a pipeline in fp32 and under the chosen precision; outputs, latency, weights, quality.",
    "diagnose": "Profile a pipeline under a preset: summary, per-module table, suggested rules as TOML.",
    "run_benchmark": "Start a benchmark and stream its progress, then its table and plot; the last output is the run id.",
    "cancel_benchmark": "Stop a benchmark after its current step: the run with the given id, else this session's.",
    "list_runs": "The runs of a benchmark store, as a table and the choices of the run dropdown.",
    "show_run": "The HTML report of one stored benchmark run.",
    "run_tune": "Start a search for a quality bound and stream it, then the result; the last output is the run id.",
    "cancel_tune": "Stop a search before its next measurement: the run with the given id, else this session's.",
}

#: Options of an event that only keeps the page in step: hidden from the API and from the client libraries.
INTERNAL: dict[str, Any] = {"api_visibility": "private"}


def endpoint(name: str) -> dict[str, Any]:
    """The options giving an event the endpoint ``name`` (one of :data:`ENDPOINTS`).

    Raises:
        ValueError: for a name that is not in :data:`ENDPOINTS`.
    """
    if name not in ENDPOINTS:
        raise ValueError(f"unknown endpoint name {name!r}; the endpoints are: {', '.join(ENDPOINTS)}")
    return {"api_name": name, "api_description": ENDPOINTS[name]}
