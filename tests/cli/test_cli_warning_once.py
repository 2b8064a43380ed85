"""A warning a command meets many times (a model's deprecation on every call) is printed once."""

from __future__ import annotations

import warnings

import mixprec.cli as cli


def test_the_same_warning_is_printed_once_per_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_SAID", set())

    def command(**_):
        for _ in range(3):
            with warnings.catch_warnings():  # what re-arms Python's own once-per-location registry
                warnings.simplefilter("default")
                warnings.warn("sdp_kernel() is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("another fact", UserWarning, stacklevel=1)

    monkeypatch.setattr(cli, "app", command)
    cli.main([])
    err = capsys.readouterr().err
    assert err.count("sdp_kernel() is deprecated") == 1 and err.count("another fact") == 1
