"""Every message that repeats a user's input stays short, whatever was typed: each parser of
the library, the CLI and the web UI, fed a value of 2,000,000 characters, answers with a
clear error of bounded length that says how long the value was."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from typer.testing import CliRunner

N = 2_000_000
#: The longest message any of them may give (the valid choices and grammar included).
LIMIT = 2_000

HUGE = {
    "digits": "sqnr>=" + "9" * (N - 6),
    "letters": "x" * N,
    "non-ASCII": "h\u0456gh" * (N // 4),
    "control characters": "\x1b[2J" * (N // 4),
}


def _library() -> dict[str, Callable[[str], Any]]:
    import mixprec
    from mixprec.bench import gate, plan
    from mixprec.bench.configs import parse_configs
    from mixprec.cli._common import as_float, as_int, int_list
    from mixprec.config.options import parse_policy_file, parse_preset
    from mixprec.device.hardware import resolve_device
    from mixprec.device.settings import parse_bool, parse_matmul
    from mixprec import pipelines
    from mixprec.ui.i18n import check_language
    from mixprec.ui.stores import resolve_store

    return {
        "parse_bound": mixprec.parse_bound,
        "parse_percent": lambda v: gate.parse_percent(v, "--max-quality-drop"),
        "parse_db": lambda v: gate.parse_db(v, "--min-quality"),
        "parse_bytes": lambda v: gate.parse_bytes(v, "--memory-noise-floor"),
        "parse_budget": plan.parse_budget,
        "parse_configs": lambda v: parse_configs(v, None),
        "as_int": lambda v: as_int(v, "--seed"),
        "as_float": lambda v: as_float(v, "--margin"),
        "int_list": lambda v: int_list(v, "--batch"),
        "parse_matmul": parse_matmul,
        "parse_bool": parse_bool,
        "parse_preset": parse_preset,
        "parse_policy_file": parse_policy_file,
        "preset": mixprec.preset,
        "init matmul": lambda v: mixprec.init(environ={"MIXPREC_FLOAT32_MATMUL_PRECISION": v}, search_dir="/nonexistent",
                                              apply=False),
        "init preset": lambda v: mixprec.init(environ={"MIXPREC_PRESET": v}, search_dir="/nonexistent", apply=False),
        "pipelines.get": pipelines.get,
        "pipeline size": lambda v: pipelines.get("minilm", size=v),
        "resolve_device": resolve_device,
        "Rule storage": lambda v: mixprec.Rule.from_dict({"match": "a", "storage": v}),
        "Rule role": lambda v: mixprec.Rule("role:" + v, storage="bf16"),
        "Rule storage of a long match": lambda v: mixprec.Rule(v, storage="bf17"),
        "Rule key": lambda v: mixprec.Rule.from_dict({"match": "a", v: "bf16"}),
        "compile mode": lambda v: mixprec.Policy.from_dict({"compile": {"mode": v}}),
        "UI language": check_language,
        "UI store box": lambda v: _confined(resolve_store, v),
        "Policy rules": lambda v: mixprec.Policy.from_dict({"rules": [{"module": v, "storage": "bf17"}]}),
        "Policy.from_toml": lambda v: mixprec.Policy.from_toml(f'name = "x"\nbogus = "{v}"\n'),
    }


LIBRARY = sorted(_library())


def _confined(resolve, value):
    import tempfile
    from pathlib import Path

    from mixprec.ui.stores import stores_confined_to

    with tempfile.TemporaryDirectory() as root, stores_confined_to(root):
        return resolve(value, Path(root) / "bench.sqlite")

CLI = {
    "tune --bound": lambda v: ["tune", "--pipeline", "minilm", "--size", "test", "--bound", v],
    "bench --batch": lambda v: ["bench", "--pipeline", "minilm", "--size", "test", "--batch", v],
    "bench --configs": lambda v: ["bench", "--pipeline", "minilm", "--size", "test", "--configs", v],
    "bench --pipeline": lambda v: ["bench", "--pipeline", v, "--size", "test"],
    "bench --budget": lambda v: ["bench", "--pipeline", "minilm", "--size", "test", "--budget", v],
    "gate --max-quality-drop": lambda v: ["gate", "2", "--baseline", "1", "--max-quality-drop", v],
    "explain --preset": lambda v: ["explain", "--pipeline", "minilm", "--size", "test", "--preset", v],
    "explain --policy": lambda v: ["explain", "--pipeline", "minilm", "--size", "test", "--policy", v],
    "tune --objective": lambda v: ["tune", "--pipeline", "minilm", "--size", "test", "--objective", v],
    "tune --seeds": lambda v: ["tune", "--pipeline", "minilm", "--size", "test", "--seeds", v],
    "tune --validation-seeds": lambda v: ["tune", "--pipeline", "minilm", "--size", "test", "--validation-seeds", v],
    "bench --executor": lambda v: ["bench", "--pipeline", "minilm", "--size", "test", "--executor", v],
    "ui --store-dir": lambda v: ["ui", "--store-dir", v],
    "run --device": lambda v: ["run", "--pipeline", "minilm", "--size", "test", "--out", "o.npy", "--device", v],
}


class TestEchoedInputIsBounded:
    @pytest.mark.parametrize("kind", sorted(HUGE))
    @pytest.mark.parametrize("parser", LIBRARY)
    def test_library_parsers(self, parser, kind, clean_env):
        value = HUGE[kind]
        with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
            _library()[parser](value)
        message = str(info.value)
        assert len(message) < LIMIT, (parser, len(message), message[:300])
        assert "\x1b" not in message  # control characters are shown escaped

    @pytest.mark.parametrize("command", sorted(CLI))
    def test_cli_flags(self, command, tmp_path, clean_env):
        from mixprec.cli import app

        clean_env.chdir(tmp_path)
        result = CliRunner().invoke(app, [*CLI[command](HUGE["digits"]), "--db", str(tmp_path / "s.sqlite")]
                                    if command.split()[0] in ("tune", "bench", "gate") else CLI[command](HUGE["digits"]))
        assert result.exit_code == 2, result.output[:500]
        assert len(result.output) < LIMIT, (len(result.output), result.output[:300])
        assert f"({N:,} characters)" in result.output.replace("\n", "")

    @pytest.mark.parametrize("kind", sorted(HUGE))
    def test_web_ui_tune_run(self, kind):
        from mixprec.ui.jobs import Job
        from mixprec.ui.tune_tab import tune_run

        for field in ("bound", "budget", "pipeline"):
            args = {"pipeline": "minilm", "bound": "cosine>=0.99", "budget": 16, field: HUGE[kind]}
            updates = list(tune_run("en", args["pipeline"], "test", args["bound"], "latency", args["budget"], None, Job()))
            shown = "".join(str(u) for u in updates[0])
            assert len(shown) < LIMIT, (field, len(shown), shown[:300])
            assert "Not started" in shown and "characters)" in shown
