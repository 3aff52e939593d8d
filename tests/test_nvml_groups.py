"""GPU group specs (--gpu-group), discovery from trainer processes, and group aggregates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.aggregation.gpu_groups import (
    GpuGroups,
    GpuGroupSpec,
    aggregate_groups,
    discover_groups,
    parse_gpu_ids,
    parse_group_spec,
)
from sidecar.model.gpu import GpuProcess, GpuReading, GpuSnapshot

GIB = 1024**3


def test_parse_ranges_and_lists() -> None:
    assert parse_group_spec("target=0-5") == GpuGroupSpec("target", (0, 1, 2, 3, 4, 5))
    assert parse_group_spec("drafter=6,7") == GpuGroupSpec("drafter", (6, 7))
    assert parse_group_spec(" mixed = 0-1, 4 ,2 ") == GpuGroupSpec("mixed", (0, 1, 2, 4))
    assert parse_gpu_ids("3") == (3,)


@pytest.mark.parametrize(("spec", "message"), [
    ("target", "NAME=IDS"),
    ("=0-3", "name"),
    ("9lives=0", "name"),
    ("bad name=0", "name"),
    ("target=", "lists no GPUs"),
    ("target=a", "integers"),
    ("target=1,,2", "empty GPU id"),
    ("target=5-2", "backwards"),
    ("target=-1", "integers"),
    ("target=0-2000", "between 0 and"),
    ("target=0-3,2", "listed twice"),
])
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_group_spec(spec)
    assert spec.split("=")[-1].strip() in str(info.value) or spec.split("=")[0].strip() in str(info.value)


def test_groups_reject_duplicates_and_overlaps() -> None:
    with pytest.raises(ValueError, match="given twice"):
        GpuGroups.parse(["target=0-3", "target=4"])
    with pytest.raises(ValueError, match="GPU 3 is in both group 'target' and group 'drafter'"):
        GpuGroups.parse(["target=0-3", "drafter=3-7"])
    groups = GpuGroups.parse(["target=0-5", "drafter=6,7"])
    assert not groups.discovered and GpuGroups().discovered
    assert groups.resolve(None) == {"target": (0, 1, 2, 3, 4, 5), "drafter": (6, 7)}


@given(st.lists(st.integers(0, 1023), min_size=1, max_size=40, unique=True))
def test_id_lists_round_trip(ids: list[int]) -> None:
    assert parse_gpu_ids(",".join(map(str, ids))) == tuple(sorted(ids))


def _gpu(index: int, **values: object) -> GpuReading:
    return GpuReading(index, f"GPU-{index}", "fake", **values)  # type: ignore[arg-type]


def _snapshot(*gpus: GpuReading) -> GpuSnapshot:
    return GpuSnapshot(100.0, 0.001, 10, gpus)


def test_aggregates_use_only_gpus_that_are_up_and_report_the_value() -> None:
    snapshot = _snapshot(
        _gpu(0, utilization_ratio=0.9, power_watts=400.0, temperature_celsius=70.0, memory_free_bytes=10 * GIB),
        _gpu(1, utilization_ratio=0.5, power_watts=300.0, temperature_celsius=75.0, memory_free_bytes=5 * GIB),
        _gpu(2, utilization_ratio=None, power_watts=None, temperature_celsius=None, memory_free_bytes=None),
        GpuReading(3, "GPU-3", "fake", up=False),
        _gpu(6, utilization_ratio=0.1, power_watts=100.0, temperature_celsius=50.0, memory_free_bytes=70 * GIB),
    )
    groups = GpuGroups.parse(["target=0-3", "drafter=6,7", "empty=9"])
    drafter, empty, target = aggregate_groups(snapshot, groups)
    assert target.name == "target" and target.gpus == (0, 1, 2, 3) and target.gpus_up == 3
    assert target.utilization_mean_ratio == pytest.approx(0.7)
    assert target.power_total_watts == pytest.approx(700.0)
    assert target.temperature_max_celsius == 75.0
    assert target.memory_free_min_bytes == 5 * GIB
    assert (drafter.gpus_up, drafter.power_total_watts) == (1, 100.0)  # GPU 7 is not on this host
    assert (empty.gpus_up, empty.utilization_mean_ratio, empty.power_total_watts) == (0, None, None)
    assert groups.unknown_gpus(snapshot) == (7, 9)
    assert aggregate_groups(None, groups) == ()


def test_discovery_takes_the_role_using_most_memory_on_each_gpu() -> None:
    snapshot = _snapshot(
        _gpu(0, processes=(GpuProcess(1, "target", "0", 30 * GIB),)),
        _gpu(1, processes=(GpuProcess(2, "target", "1", 1 * GIB), GpuProcess(3, "drafter", "0", 9 * GIB))),
        _gpu(2, processes=(GpuProcess(4, "drafter", "1", None),)),
        _gpu(3),
    )
    assert discover_groups(snapshot) == {"drafter": (1, 2), "target": (0,)}
    assert GpuGroups().resolve(snapshot) == discover_groups(snapshot)
    assert discover_groups(None) == {}
