from __future__ import annotations

import pytest

from mixprec.device.settings import NumericSettings, did_you_mean, parse_bool


def test_round_trip():
    s = NumericSettings(matmul="medium", conv_tf32=False, fp16_reduced_precision_reduction=False)
    assert NumericSettings.from_dict(s.to_dict()) == s


def test_frozen_and_validated():
    s = NumericSettings()
    with pytest.raises(AttributeError):
        s.matmul = "high"  # type: ignore[misc]
    with pytest.raises(ValueError, match="valid values: highest, high, medium"):
        NumericSettings(matmul="low")
    with pytest.raises(ValueError, match="unknown NumericSettings key 'matmull' \\(did you mean 'matmul'\\?\\)"):
        NumericSettings.from_dict({"matmull": "high"})
    with pytest.raises(ValueError, match="unsupported NumericSettings version"):
        NumericSettings(version=2)


def test_parse_bool_rejects_integers_and_words():
    assert parse_bool(" Yes ") is True
    with pytest.raises(ValueError, match="true/false"):
        parse_bool(1)
    with pytest.raises(ValueError, match="'maybe'"):
        parse_bool("maybe")


def test_did_you_mean():
    assert did_you_mean("hihg", ("highest", "high", "medium")) == " (did you mean 'high'?)"
    assert did_you_mean("zzz", ("highest", "high")) == ""
