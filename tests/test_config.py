"""Settings: precedence, validation messages, and the shipped sample config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sidecar.core import config
from sidecar.core.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _flags(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_flags_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('interval = 5.0\nprometheus_addr = "0.0.0.0:9000"\ngpu_group = ["target=0-5", "drafter=6,7"]\n')
    cfg = config.load(_flags("--config", str(f), "--interval", "2", "--no-gpu-metrics"))
    assert cfg.interval == 2.0 and cfg.prometheus_addr == "0.0.0.0:9000" and not cfg.gpu_metrics
    assert cfg.gpu_group == ("target=0-5", "drafter=6,7") and cfg.nvml_interval == 1.0
    assert cfg.config_file == str(f)


def test_defaults_without_anything() -> None:
    cfg = config.load({}, environ={})
    assert cfg.prometheus_addr == "127.0.0.1:9478" and cfg.interval == 10.0 and cfg.wandb_run is None
    assert len(cfg.endpoint) == 1 and cfg.endpoint[0].startswith("ipc://")


@pytest.mark.parametrize("toml, message", [
    ("interval = 'soon'", "invalid --interval"),
    ("gpu_metrics = 'yes'", "expected true or false"),
    ("endpoint = ['tcp://example.com:1']", "is not an IP address"),
    ("log_level = 'loud'", "expected one of debug"),
    ("insight_handoff_ratio = 1.5", "invalid --insight-handoff-ratio .*: 1.5: insight_handoff_ratio must be a ratio "
                                    "between 0 and 1$"),
])
def test_file_errors_name_the_setting_and_the_fix(tmp_path: Path, toml: str, message: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        config.load({"config_file": str(f)})
    assert str(f) in str(err.value)


def test_the_sample_config_lists_every_setting_and_is_the_shipped_one() -> None:
    sample = config.sample_toml()
    for setting in config.SETTINGS:
        assert f"# {setting.name} = " in sample
    assert (ROOT / "deploy" / "config.toml").read_text() == sample + "\n", \
        "regenerate with: dflash-sidecar sample-config > deploy/config.toml"


def test_the_sample_with_every_line_uncommented_loads_and_marks_defaults_truthfully(tmp_path: Path) -> None:
    sample = config.sample_toml()
    setting_lines = [line for line in sample.splitlines() if line.startswith("# ") and " = " in line]
    assert len(setting_lines) == len(config.SETTINGS)
    uncommented = tmp_path / "all.toml"
    uncommented.write_text("\n".join(line[2:] if line in setting_lines else line for line in sample.splitlines()))
    loaded = config.load({"config_file": str(uncommented)})  # every line at once, the file as an operator has it
    defaults = config.Config()
    examples = set()
    for line in setting_lines:
        name, _, mark = line[2:].partition(" = ")
        assert "  # default" in mark or "  # example; default: " in mark, line
        if "# example" in mark:
            examples.add(name)
            assert config.BY_NAME[name].value(loaded) != config.BY_NAME[name].value(defaults), \
                f"{name}: an example equal to the default"
        else:
            assert config.BY_NAME[name].value(loaded) == config.BY_NAME[name].value(defaults), \
                f"{name} is marked default but is not"
    assert examples == {"endpoint", "gpu_group", "state_dir", "flops_per_token"}
    assert loaded.wandb_run is None and loaded.prometheus_tls_cert is None  # "" leaves them unset


def test_each_setting_is_declared_once_by_its_component() -> None:
    """``Config`` is the components' sections and nothing else: each of its fields (but
    ``config_file``) is one declared setting, with the section's default."""
    import dataclasses

    from sidecar.aggregation.settings import InsightSettings

    fields = {f.name: f for f in dataclasses.fields(config.Config)}
    assert set(fields) - {"config_file"} == {s.attr for s in config.SETTINGS}
    assert len({s.attr for s in config.SETTINGS}) == len(config.SETTINGS)  # no two sections share a field
    for s in config.SETTINGS:
        own = {f.name: f for f in dataclasses.fields(s.section)}[s.attr]
        assert fields[s.attr].default == own.default and fields[s.attr].metadata is own.metadata, s.name
        assert s.flag in {"", f"--{s.name.replace('_', '-')}", f"--no-{s.name.replace('_', '-')}"}
    assert {s.name for s in config.SETTINGS if s.section is InsightSettings} == {
        "insight_" + f.name for f in dataclasses.fields(InsightSettings)}
    assert "sw_power_cap" not in InsightSettings().throttle_reasons
    assert issubclass(config.Config, InsightSettings)  # the daemon hands its Config to the verdict as it is


def test_help_is_grouped_by_component_and_the_top_level_lists_the_main_options() -> None:
    from sidecar.cli.main import build_parser

    top = build_parser().format_help()
    for flag, _ in config.summary():
        assert flag in top, flag
    run = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    assert "insight options:" in run and "W&B options:" in run
    for s in config.SETTINGS:
        assert s.kind == "tables" or s.flag in run, s.name


@pytest.mark.parametrize("text, expected", [("127.0.0.1:9478", ("127.0.0.1", 9478)), ("[::1]:1", ("::1", 1)),
                                            (":9000", ("127.0.0.1", 9000)), ("localhost:80", ("localhost", 80))])
def test_host_port(text: str, expected: tuple[str, int]) -> None:
    from sidecar.model.address import parse_host_port

    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text, message", [("9478", "expected HOST:PORT"), ("h:0", "expected HOST:PORT"),
                                           ("h:65536", "expected HOST:PORT"), ("box:80", "'box' is not an IP")])
def test_host_port_errors(text: str, message: str) -> None:
    from sidecar.model.address import parse_host_port

    with pytest.raises(ValueError, match=message):
        parse_host_port(text)


def test_reading_a_config_loads_no_component() -> None:
    """The sections are declared beside their components, not inside them: a config (``check``,
    ``top``, ``report``, ``--version``) loads no transport, no outside service and no mapping stage."""
    import subprocess
    import sys

    heavy = ("zmq", "wandb", "pynvml", "prometheus_client", "sidecar.processing.mapping", "sidecar.sources.receiver")
    code = (f"import sys, sidecar.core.config as c; c.load({{}}); c.sample_toml(); "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]", out
