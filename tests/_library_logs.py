"""pytest plugin: a library's deprecation notice logged because of mixprec's code fails the test.

transformers and diffusers announce many deprecations through their loggers, not through
Python's warnings (transformers 5.24: "`past_key_values`/`cache_params` are deprecated. Use
`cache` instead.", once per process), so pyproject.toml's ``filterwarnings``, which fails a
test on a deprecation attributed to mixprec, never sees them. This plugin listens on those
libraries' loggers during each test; a record that speaks of a deprecation, logged while the
nearest caller outside the libraries is a module of mixprec, fails the test at teardown with
the message and that frame. A notice about an app's or a model package's own calls (the
nearest caller is theirs) is left to the library's own handler.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass

import pytest

#: The loggers listened on (their children included).
LOGGERS = ("transformers", "diffusers", "huggingface_hub")
#: Modules a caller is looked for beyond: the libraries, and the machinery between them and their caller.
_PASSED = ("logging", "transformers", "diffusers", "huggingface_hub", "accelerate", "torch", "functools", "contextlib",
           "typing", "_library_logs")
#: What a deprecation notice says.
DEPRECATION = re.compile(r"deprecat", re.IGNORECASE)


def _caller(frame, passed: tuple[str, ...] = _PASSED) -> tuple[str, str, int] | None:
    """The nearest frame outside the top-level packages ``passed``: (module, file, line)."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.split(".", 1)[0] not in passed:
            return module, frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


@dataclass(frozen=True)
class Notice:
    logger: str
    message: str
    caller: tuple[str, str, int]

    def __str__(self) -> str:
        module, path, line = self.caller
        return f"[{self.logger}] {self.message} (logged for mixprec's {module}, {path}:{line})"


class MixprecDeprecations(logging.Handler):
    """Collects the deprecation notices whose nearest caller outside the libraries is mixprec's.

    Args:
        loggers: the libraries' loggers listened on (their top-level packages are looked beyond too).
    """

    def __init__(self, loggers: tuple[str, ...] = LOGGERS) -> None:
        super().__init__(level=logging.WARNING)
        self.loggers = loggers
        self.passed = _PASSED + loggers
        self.notices: list[Notice] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not DEPRECATION.search(message):
            return
        caller = _caller(sys._getframe(1), self.passed)
        if caller is not None and caller[0].split(".", 1)[0] == "mixprec":
            self.notices.append(Notice(record.name, message, caller))

    def attach(self) -> None:
        for name in self.loggers:
            logging.getLogger(name).addHandler(self)

    def detach(self) -> None:
        for name in self.loggers:
            logging.getLogger(name).removeHandler(self)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    handler = MixprecDeprecations()
    item.stash[_KEY] = handler
    handler.attach()
    try:
        yield
    finally:
        handler.detach()


_KEY = pytest.StashKey[MixprecDeprecations]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    handler = item.stash.get(_KEY, None)
    if call.when != "teardown" or handler is None or not handler.notices or not report.passed:
        return
    report.outcome = "failed"
    report.longrepr = ("a library logged a deprecation for mixprec's own call (pass the current form where it exists):\n"
                       + "\n".join(f"  {notice}" for notice in handler.notices))
