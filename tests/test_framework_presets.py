"""The frameworks' own vocabularies as built-in presets (``sidecar/processing/frameworks.py``):
every preset name maps to its meaning and unit with no config; a user's ``[[mapping]]`` rule wins
over a preset; ``explain`` names the preset and the unit it read; and each framework's own dict
(``tests/framework_fixtures.py``), published as it is through the real shim to a real daemon on
the fake NVML driver, reads input-bound when data loading dominates and compute-bound when the GPU
is busy (with no phase timing in the dict too: HF, nanoGPT, Accelerate)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.insight import compute_insight
from sidecar.core.pipeline import ingest_records
from sidecar.model.meanings import KINDS_OF_CLASS, MEANINGS
from sidecar.model.settings import RoleSettings
from sidecar.model.window import GAUGE, PROFILE, TIMING, IngestReport
from sidecar.processing.explain import explain_data
from sidecar.processing.frameworks import FRAMEWORKS, doc_table, load
from sidecar.processing.mapping import Mapper, parse_rules
from tests.daemon_harness import ROOT, DaemonProc, env
from tests.fake_nvml.helpers import library_or_skip
from tests.framework_fixtures import DATA_TIMED, FIXTURES
from tests.verdict_matrix import _lines, _set_gpu, _write


@pytest.mark.parametrize("row", FRAMEWORKS, ids=lambda r: f"{r.preset}-{r.meaning}")
def test_every_framework_name_maps_to_its_meaning_as_a_dict_key(row) -> None:  # type: ignore[no-untyped-def]
    for name in row.names:
        m = Mapper().resolve(PROFILE, name, "trainer", "0")
        assert m.meaning == row.meaning and row.preset in m.rule, (name, m)
        cls = MEANINGS[row.meaning][0]
        share = name.endswith("(%)") and cls in ("wait", "busy")
        assert m.kind == (TIMING if TIMING in KINDS_OF_CLASS[cls] and not share else GAUGE), (name, m)


_T = '[t]\nversion = "1"\n[t.meanings]\n'
"""A framework table's head, its rows to follow."""
_FRAMEWORK, _ROW = "frameworks.toml [t]: a framework has exactly", "frameworks.toml [t] step: a row is"


@pytest.mark.parametrize(("text", "message"), [
    (_T + 'step = { unit = "s", names = ["it"] ', "frameworks.toml: "),  # not TOML
    ("", "frameworks.toml: no framework"),
    ('[t]\n[t.meanings]\nstep = { names = ["it"] }', _FRAMEWORK),
    ('[t]\nversion = "1"\nsource = "x"\n[t.meanings]\nstep = { names = ["it"] }', _FRAMEWORK),
    ('[t]\nversion = "1"\nmeanings = 3', _FRAMEWORK),
    ('[t]\nversion = 3\n[t.meanings]\nstep = { names = ["it"] }', _FRAMEWORK),
    (_T, _FRAMEWORK),
    ("t = 3", _FRAMEWORK),
    (_T + 'steps = { names = ["it"] }', "frameworks.toml [t] steps: not a meaning of sidecar.model.meanings"),
    (_T + 'step = { unit = "s", names = [] }', _ROW),
    (_T + 'step = { units = "s", names = ["it"] }', _ROW),
    (_T + 'step = { names = "it" }', _ROW),
    (_T + "step = { names = 3 }", _ROW),
    (_T + "step = { names = [1, 2] }", _ROW),
    (_T + 'step = { names = [""] }', _ROW),
    (_T + 'step = { names = [["a"]] }', _ROW),
    (_T + 'step = { unit = ["s"], names = ["it"] }', _ROW),
    (_T + "step = 3", _ROW),
    (_T + 'step = { unit = "fortnights", names = ["it"] }',
     "frameworks.toml [t] step: unit 'fortnights' is not in the units grammar"),
])
def test_a_bad_frameworks_table_is_refused_naming_the_framework_and_row(text: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        load(text)
    assert str(refused.value).startswith(message), refused.value


def test_a_frameworks_table_loads_in_file_order_with_its_units() -> None:
    rows = load('[a]\nversion = "2"\n[a.meanings]\nstep = { unit = "s", names = ["t", "t2"] }\n'
                'loss = { names = ["l"] }\n[b]\nversion = "main"\n[b.meanings]\nstep = { names = ["t"] }')
    assert [tuple(r) for r in rows] == [("a", "2", "step", "s", ("t", "t2")), ("a", "2", "loss", "", ("l",)),
                                        ("b", "main", "step", "", ("t",))]


def test_metrics_md_holds_the_framework_table() -> None:
    text = (ROOT / "docs" / "METRICS.md").read_text().splitlines()
    begin = next(i for i, line in enumerate(text) if "generated from sidecar.processing.frameworks" in line)
    end = text.index("<!-- END generated from frameworks -->", begin)
    assert text[begin + 1:end] == doc_table()


def test_a_timing_in_a_unit_that_is_no_time_stays_in_ms_and_explain_says_so() -> None:
    m = Mapper().resolve(TIMING, "fetch(%)", "trainer", "0")
    assert (m.scale, m.rule) == (1.0, "unit (%) is no time: taken as milliseconds")


def test_torchtitans_dict_in_base_units_with_prometheus_names() -> None:
    got = {k: Mapper().resolve(PROFILE, k, "trainer", "0") for k in FIXTURES["torchtitan"](0.5, 0.7, 10)}
    expect = {  # key -> (kind, exported token, scale, meaning)
        "time_metrics/end_to_end(s)": (TIMING, "time_metrics_end_to_end", 1000.0, "step"),
        "time_metrics/data_loading(s)": (TIMING, "time_metrics_data_loading", 1000.0, "data_wait"),
        "time_metrics/data_loading(%)": (GAUGE, "time_metrics_data_loading_ratio", 0.01, "data_wait"),
        "throughput(tps)": (GAUGE, "throughput_tokens_per_second", 1.0, "tokens_per_s"),
        "tflops": (GAUGE, "flops_per_second", 1e12, "flops_per_s"),
        "mfu(%)": (GAUGE, "mfu_ratio", 0.01, "mfu"),
        "memory/max_reserved(GiB)": (GAUGE, "memory_max_reserved_bytes", 2.0 ** 30, "memory_reserved"),
        "memory/max_active(%)": (GAUGE, "memory_max_active_ratio", 0.01, ""),
        "memory/num_ooms": (GAUGE, "memory_num_ooms", 1.0, ""),
    }
    for key, (kind, token, scale, meaning) in expect.items():
        m = got[key]
        assert (m.kind, m.token, m.meaning) == (kind, token, meaning) and m.scale == pytest.approx(scale), (key, m)


def test_a_framework_unit_applies_to_dict_keys_and_gauges_not_to_a_timing_in_ms() -> None:
    mapper = Mapper()
    data_time = mapper.resolve(PROFILE, "data_time", "t", "0")  # mmengine / detectron2: seconds
    assert (data_time.kind, data_time.scale, data_time.meaning) == (TIMING, 1000.0, "data_wait")
    assert "mmengine/detectron2" in data_time.rule
    timed = mapper.resolve(TIMING, "data_time", "t", "0")  # timing(name, ms): milliseconds, as its API says
    assert (timed.scale, timed.meaning) == (1.0, "data_wait")
    memory = mapper.resolve(GAUGE, "memory", "t", "0")  # mmengine's MB (MiB)
    assert (memory.token, memory.scale) == ("memory_bytes", 2.0 ** 20)
    # a bare "step" is the step's time as a timing, the step number as a dict key
    assert mapper.resolve(TIMING, "step", "t", "0").meaning == "step"
    assert mapper.resolve(PROFILE, "step", "t", "0").meaning == "step_number"
    # Megatron's "throughput" is TFLOP/s; torchtitan's "throughput(tps)" tokens/s
    assert mapper.resolve(PROFILE, "throughput", "t", "0").meaning == "flops_per_s"
    assert mapper.resolve(PROFILE, "throughput(tps)", "t", "0").meaning == "tokens_per_s"
    # a gauge named tokens is no throughput; tokens/s is
    assert mapper.resolve(GAUGE, "tokens", "t", "0").meaning == ""
    assert mapper.resolve(GAUGE, "tokens/s", "t", "0").meaning == "tokens_per_s"


def test_a_users_rule_wins_over_a_preset() -> None:
    rules = parse_rules([{"match": "time_metrics/data_loading(s)", "phase": "comm_wait"},
                         {"match": "time", "name": "qzx_wall(s)"}])
    mapper = Mapper(rules)
    m = mapper.resolve(PROFILE, "time_metrics/data_loading(s)", "trainer", "0")
    assert (m.meaning, m.kind, m.scale) == ("comm_wait", TIMING, 1000.0) and m.rule.startswith("mapping[1]")
    # a rule that only renames: the preset is looked up on the new name, its unit read from it
    m = mapper.resolve(PROFILE, "time", "trainer", "0")
    assert m.meaning == "" and m.kind == TIMING and m.token == "qzx_wall" and m.rule.startswith("mapping[2]")
    assert Mapper().resolve(PROFILE, "time", "trainer", "0").meaning == "step"
    assert mapper.hits == {1: 1, 2: 1}
    # a rule's gauge meaning for a key in seconds wins over the unmapped timing its unit makes it
    m = Mapper(parse_rules([{"match": "warmup_left_s", "meaning": "lr"}])).resolve(PROFILE, "warmup_left_s", "t", "0")
    assert (m.kind, m.meaning, m.token, m.scale) == (GAUGE, "lr", "warmup_left_seconds", 1.0)


def _explain_rows(records: dict[str, float]) -> dict[str, dict[str, str]]:
    agg, mapper = Aggregator(), Mapper()
    for step in range(3):
        ingest_records(agg, "trainer", "0", [[PROFILE, step, records]], mapper)
    window = agg.roll(1.0, 1_700_000_000.0, 1.0)
    report = IngestReport(window, (), {}, {}, {}, 0, 0, 0, len(window.series), 0)
    return {r["name"]: r for r in explain_data(report, mapper, RoleSettings())["series"]}


def test_explain_names_the_preset_and_the_unit_read_or_not_known() -> None:
    rows = _explain_rows({**FIXTURES["torchtitan"](0.5, 0.7, 10), "queue(batches)": 3.0})
    assert rows["time_metrics/data_loading(s)"]["rule"] == "preset torchtitan; unit (s) -> seconds"
    assert rows["time_metrics/data_loading(s)"]["meaning"] == "data_wait"
    assert "preset torchtitan" in rows["mfu(%)"]["rule"] and "unit (%) -> ratio" in rows["mfu(%)"]["rule"]
    assert rows["queue(batches)"]["rule"] == "unit (batches) not known: taken as sent"
    assert rows["ntokens_seen"]["meaning"] == "unmapped"


# -- real shim, real daemon, fake NVML ------------------------------------------------------------

CONDITIONS = (("input", 0.7, 30), ("compute", 0.05, 97))
"""(condition, data loading share of the step, GPU utilization %)."""


def run_framework(framework: str, workdir: Path, windows: int = 8, interval_s: float = 0.5) -> dict[str, object]:
    """One daemon and one trainer publishing ``framework``'s dict: the scored verdicts of each
    condition (the first two windows after a switch not scored) and the trainer families' values."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.control import FakeNvml

    row = workdir / framework
    row.mkdir(parents=True)
    library = build_fake_nvml("full")
    nvml = FakeNvml(row / "nvml-control.txt", library, {"devices": 1})
    _set_gpu(nvml, 30)
    control = row / "control.json"
    _write(control, {"data": CONDITIONS[0][1]})
    d = DaemonProc(row, "--nvml-interval", "0.25", "--gpu-group", "trainer=0", interval=interval_s, gpu=True,
                   extra_env={"LD_LIBRARY_PATH": str(library.parent), "FAKE_NVML_CONTROL": str(nvml.path)})
    proc = subprocess.Popen([sys.executable, "-m", "tests.framework_loops", framework, d.endpoint, str(control)],
                            env=env(), cwd=row, stdout=subprocess.DEVNULL, stderr=open(row / "trainer.log", "wb"))
    out: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 60
        while (d.value("dflash_trainer_step") or 0) < 4:
            assert time.monotonic() < deadline and proc.poll() is None, (row / "trainer.log").read_text()
            time.sleep(0.2)
        for condition, data, busy in CONDITIONS:
            _set_gpu(nvml, busy)
            _write(control, {"data": data})
            start = len(_lines(d))
            time.sleep(windows * interval_s)
            out[condition] = [v for dur, v, _ in _lines(d)[start:][2:] if dur >= 0.5 * interval_s]
        out["samples"] = d.samples()
    finally:
        _write(control, {"stop": True})
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        d.stop()
    return out


def _real_ddp_logging_data(tmp_path: Path) -> dict[str, float]:
    """The numbers of ``_get_ddp_logging_data()`` of torch's own DistributedDataParallel (gloo, one
    rank, on CPU) after a few steps, as a trainer logs them (a tap leaves the strings out)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(6)]), bucket_cap_mb=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(8):
            model(torch.randn(32, 128)).sum().backward()
            opt.step()
            opt.zero_grad()
        data = model._get_ddp_logging_data()
    finally:
        dist.destroy_process_group()
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def test_a_real_ddp_logging_dict_reads_as_the_preset_says(tmp_path: Path) -> None:
    """torch DDP's real dict: each time maps under the preset in nanoseconds, and the moments beside
    them (``backward_comm_time_end``: nanoseconds since the epoch) are no duration (the reader read
    two of them as the wait and the backward, 1.8e9 s each); the communication wait the insight
    reads is the all-reduce less its overlap, each of the twin the insight takes (the longer; the
    overlap of the wait's own twin)."""
    data = _real_ddp_logging_data(tmp_path)
    mapper = Mapper()
    meanings = {k: mapper.resolve(PROFILE, k, "trainer", "0") for k in data}
    for key, m in meanings.items():
        if key.endswith(("_start", "_end")):
            assert m.meaning == "" and m.kind == GAUGE, (key, m)
        elif key.endswith("_time"):
            assert "preset torch_ddp" in m.rule and m.kind == TIMING and m.scale == pytest.approx(1e-6), (key, m)
    agg = Aggregator(clock=lambda: 1010.0)
    ingest_records(agg, "trainer", "0", [[PROFILE, i, data] for i in range(50)], mapper, sender_id=1)
    share = compute_insight(agg.roll(1010.0, 1010.0, 10.0)).roles["trainer"].time_share

    def longer(name: str) -> tuple[str, float]:
        return max(((k, data[k]) for k in (name, f"avg_{name}")), key=lambda kv: kv[1])

    wait_key, wait = longer("backward_comm_time")
    overlap = data[wait_key.replace("backward_comm_time", "backward_compute_comm_overlap_time")]
    phases = longer("forward_compute_time")[1] + longer("backward_compute_time")[1] + max(0.0, wait - overlap)
    assert share["comm_wait"] == pytest.approx(max(0.0, wait - overlap) / phases, rel=1e-6), (data, share)


@pytest.mark.timeout(300)
def test_each_frameworks_own_dict_reads_input_bound_only_when_data_loading_dominates(tmp_path: Path) -> None:
    library_or_skip("full")
    names = list(FIXTURES)
    with ThreadPoolExecutor(max_workers=3) as pool:
        rows = dict(zip(names, pool.map(lambda f: run_framework(f, tmp_path), names), strict=True))
    verdicts = {f: {c: r[c] for c, _, _ in CONDITIONS} for f, r in rows.items()}
    for framework, row in rows.items():
        inputs, computes = row["input"], row["compute"]
        assert isinstance(inputs, list) and isinstance(computes, list)
        assert len(inputs) >= 4 and len(computes) >= 4, verdicts
        # the GPU 97 % busy: compute-bound, with or without phase timings (evidence first)
        assert computes.count("compute-bound") / len(computes) >= 0.8, (framework, verdicts)
        if framework in DATA_TIMED:
            assert inputs.count("input-bound") / len(inputs) >= 0.8, (framework, verdicts)
        else:
            # no data time in its dict: the idle GPU is unexplained (never balanced), never a wait verdict
            assert not {"input-bound", "host-bound", "balanced"} & set(inputs), (framework, verdicts)
            assert inputs.count("unexplained-idle") / len(inputs) >= 0.8, (framework, verdicts)
    _check_torchtitan_families(rows["torchtitan"]["samples"])  # type: ignore[arg-type]


def _check_torchtitan_families(samples: dict[str, list[tuple[dict[str, str], float]]]) -> None:
    def one(name: str) -> float:
        [(labels, value)] = samples[name]
        assert labels["role"] == "trainer"
        return value

    assert one("dflash_trainer_throughput_tokens_per_second") > 1000
    assert 0 < one("dflash_trainer_mfu_ratio") < 1
    assert one("dflash_trainer_memory_max_reserved_bytes") == 36.0 * 2 ** 30
    assert 0 < one("dflash_trainer_time_metrics_data_loading_ratio") <= 1
    assert one("dflash_trainer_flops_per_second") > 1e12
    assert one("dflash_trainer_time_metrics_end_to_end_seconds_count") > 0
    # and the insight's throughput and efficiency families read them (the trainer's own figures)
    assert one("dflash_pipeline_reported_tokens_per_second") > 1000
    assert 0 < one("dflash_pipeline_reported_mfu_ratio") < 1
