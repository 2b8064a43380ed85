"""A library's deprecation notice logged for mixprec's call fails the test (tests/_library_logs.py)."""

from __future__ import annotations

import logging

from _library_logs import MixprecDeprecations

#: A library's function that logs a deprecation notice, as transformers' ``warning_once`` does (a
#: library of its own: the plugin's handler of the running test listens on transformers').
LIBRARY = '''
import logging

def old_api(message):
    logging.getLogger("fakelibrary.utils").warning(message)
'''


def _module(name: str, source: str, **names) -> dict:
    namespace = {"__name__": name, **names}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


def _notices(caller_module: str, message: str) -> list:
    library = _module("fakelibrary.api", LIBRARY)
    caller = _module(caller_module, "def run(message):\n    old_api(message)\n", old_api=library["old_api"])
    handler = MixprecDeprecations(loggers=("fakelibrary",))
    handler.attach()
    library_logger = logging.getLogger("fakelibrary")
    propagate = library_logger.propagate
    library_logger.propagate = False  # the notices stay off the test's own output
    try:
        caller["run"](message)
    finally:
        library_logger.propagate = propagate
        handler.detach()
    return handler.notices


def test_a_deprecation_logged_for_mixprecs_call_is_collected_with_its_frame():
    notices = _notices("mixprec.pipelines.fake", "`past_key_values` is deprecated. Use `cache` instead.")
    assert len(notices) == 1
    assert notices[0].caller[0] == "mixprec.pipelines.fake" and "past_key_values" in str(notices[0])


def test_an_apps_own_deprecated_call_and_other_notices_are_left_alone():
    assert _notices("chatterbox.models.t3", "`past_key_values` is deprecated.") == []
    assert _notices("mixprec.pipelines.fake", "some weights were not initialised") == []
