"""The mapping stage: key grammar, presets, user rules and their start-up checks, and that the
aggregator resolves a name once per series, not per record."""

from __future__ import annotations

import pytest

from sidecar.aggregation.aggregator import PROFILE, Aggregator
from sidecar.aggregation.verdict import Hysteresis, Verdict
from sidecar.core import config as config_mod
from sidecar.core.config import ConfigError
from sidecar.core.pipeline import ingest_records
from sidecar.model.mapped import Mapped
from sidecar.model.meanings import COUNT, GAUGE, MEANINGS, TIMING
from sidecar.processing.mapping import PRESETS, Mapper, MappingError, parse_rules
from tests.window_drive import drive
from trainer_shim.wire import MAX_NAME_BYTES


def resolve(name: str, kind: int = TIMING, role: str = "monitor", worker: str = "0", mapper: Mapper | None = None):
    m = (mapper or Mapper()).resolve(kind, name, role, worker)
    return m.role, m.worker, m.name, m.meaning


@pytest.mark.parametrize(("name", "kind", "expected"), [
    ("target.model_forward_ms", TIMING, ("target", "0", "model_forward_ms", "forward")),
    ("target.pack_hidden_ms", TIMING, ("target", "0", "pack_hidden_ms", "pack")),
    ("target.queue_put_ms", TIMING, ("target", "0", "queue_put_ms", "queue_put_wait")),
    ("drafter.queue_get_ms", TIMING, ("drafter", "0", "queue_get_ms", "queue_wait")),
    ("drafter.backward_ms", TIMING, ("drafter", "0", "backward_ms", "backward")),
    ("drafter.1.tokens", COUNT, ("drafter", "1", "tokens", "tokens")),
    ("drafter/1/forward_ms", TIMING, ("drafter", "1", "forward_ms", "forward")),
    ("rank.3.data_wait_ms", TIMING, ("monitor", "3", "data_wait_ms", "data_wait")),
    ("layer.3.forward_ms", TIMING, ("monitor", "0", "layer.3.forward_ms", "")),  # a per-layer name, no role
    ("monitor.2.step_ms", TIMING, ("monitor", "2", "step_ms", "step")),  # the channel's own role
    ("data_time_ms", TIMING, ("monitor", "0", "data_time_ms", "data_wait")),
    ("allreduce_ms", TIMING, ("monitor", "0", "allreduce_ms", "comm_wait")),
    ("optimizer_step_ms", TIMING, ("monitor", "0", "optimizer_step_ms", "optimizer")),
    ("step_ms", TIMING, ("monitor", "0", "step_ms", "step")),
    ("queue_depth", GAUGE, ("monitor", "0", "queue_depth", "queue_depth")),
    ("lr", GAUGE, ("monitor", "0", "lr", "lr")),
])
def test_key_grammar_and_presets(name: str, kind: int, expected: tuple[str, str, str, str]) -> None:
    assert resolve(name, kind) == expected


def test_unmapped_names_keep_the_channel_labels_and_a_meaning_needs_its_kind() -> None:
    assert resolve("train/loss_scale", GAUGE) == ("monitor", "0", "train/loss_scale", "")
    # a gauge whose name is a phase's duration is that phase's timing, as the same key published is
    assert Mapper().resolve(GAUGE, "forward_ms", "monitor", "0").kind == TIMING
    assert resolve("forward_ms", GAUGE)[3] == "forward"
    assert resolve("batches", TIMING)[3] == ""
    # an unknown first segment is not a role (train/... is a namespace), a numeric worker makes it one
    assert resolve("train.forward_ms")[:2] == ("monitor", "0")
    assert resolve("teacher.forward_ms", mapper=Mapper(known_roles=frozenset({"teacher"})))[:2] == ("teacher", "0")


def test_every_preset_meaning_is_known_and_no_name_is_listed_twice_for_one_class() -> None:
    # a name may mean one thing as a timing and another as a gauge ("step": the step's time, the
    # step number), never two things for one class
    names = [(n, MEANINGS[m][0]) for _, m, ns in PRESETS for n in ns]
    assert len(names) == len(set(names))
    assert {m for _, m, _ in PRESETS} <= set(MEANINGS)
    # the names the shim's callbacks publish all map
    for name in ("data_wait_ms", "forward_ms", "backward_ms", "optimizer_step_ms", "step_ms", "comm_wait_ms"):
        assert resolve(name)[3], name
    assert resolve("batches", COUNT)[3] == "batches" and resolve("loss", GAUGE)[3] == "loss"


def test_user_rules_glob_and_regex_with_captures() -> None:
    rules = parse_rules([
        {"match": "loader.*.fetch_ms", "worker": "$1", "phase": "data_wait"},
        {"regex": r"(?P<role>gen|critic)_rank(\d+)_(fwd|bwd)_ms", "role": "${role}", "worker": "$2", "name": "$3_ms"},
        {"match": "**.nccl_ms", "name": "$1_comm_ms", "phase": "comm_wait"},
    ])
    mapper = Mapper(rules)
    assert resolve("loader.7.fetch_ms", mapper=mapper) == ("monitor", "7", "loader.7.fetch_ms", "data_wait")
    assert resolve("critic_rank2_bwd_ms", mapper=mapper) == ("critic", "2", "bwd_ms", "backward")  # + preset
    assert resolve("a.b.nccl_ms", mapper=mapper) == ("monitor", "0", "a.b_comm_ms", "comm_wait")
    # a phase rule makes a gauge of that name the phase's timing (kinds follow meaning)
    assert Mapper(mapper.rules).resolve(GAUGE, "loader.7.fetch_ms", "monitor", "0").kind == TIMING
    assert resolve("loader.7.fetch_ms", GAUGE, mapper=mapper)[3] == "data_wait"
    assert mapper.hits == {1: 2, 2: 1, 3: 1}  # rule 1 mapped the name as a timing and as a gauge (re-kinded)
    assert Mapper(rules).unused_rules() == list(rules)


@pytest.mark.parametrize(("table", "message"), [
    ({"match": "x.*_ms", "phase": "dataload"}, "unknown phase/meaning 'dataload'"),
    ({"match": "loader.*.fetch_ms", "phase": "data_wait"}, "capture $1 is not used"),
    ({"regex": r"(?P<r>\w+)_ms", "phase": "forward"}, "capture ${r} is not used"),
    ({"match": "x_ms", "worker": "$2", "phase": "forward"}, "$2 names a capture the pattern does not have"),
    ({"regex": r"fwd^_ms", "phase": "forward"}, "can never match any name"),
    ({"regex": "fwd\n_ms", "phase": "forward"}, "can never match: the names it would match are not valid"),
    ({"regex": "x" * (MAX_NAME_BYTES + 1), "phase": "forward"}, "can never match"),
    ({"regex": "(", "phase": "forward"}, "not a valid regex"),
    ({"match": "a", "regex": "a", "phase": "forward"}, "exactly one of"),
    ({"match": "a"}, "maps to nothing"),
    ({"match": "a", "phase": "forward", "colour": "red"}, "unknown key(s) colour"),
    ({"match": "a", "phase": "forward", "unit": "fortnights"}, "unit 'fortnights' is not in the units grammar"),
    ({"match": "a", "phase": "forward", "unit": 1000}, "unit must be a string"),
    ({"match": "a", "role": "loader", "unit": "s"}, "a unit needs the phase or meaning its values are of"),
    ({"match": "a", "phase": "none", "unit": "s"}, "a unit needs the phase or meaning its values are of"),
])
def test_bad_rules_are_refused_with_what_to_fix(table: dict, message: str) -> None:
    with pytest.raises(MappingError) as exc:
        parse_rules([table])
    assert message in str(exc.value) and "mapping rule 1" in str(exc.value)


@pytest.mark.parametrize("kind", [PROFILE, GAUGE])
def test_a_rules_unit_reads_a_name_that_says_none_in_it(kind: int) -> None:
    """A key that says no unit, its values in seconds (a Lightning profiler action's duration
    published as it is, a Python timer logged to W&B): a rule gives its phase and its unit, as a
    framework preset states one; without the unit such a key is a timing in milliseconds. A name
    that says its own unit keeps it, and a ``timing()`` record is in milliseconds, as its API says."""
    rules = parse_rules([{"match": "[_TrainingEpochLoop].train_dataloader_next", "phase": "data_wait", "unit": "s"},
                         {"regex": "fetch(?:_ms)?", "phase": "data_wait", "unit": "s"},
                         {"match": "load", "phase": "data_wait"}])
    m = Mapper(rules).resolve(kind, "[_TrainingEpochLoop].train_dataloader_next", "trainer", "0")
    assert (m.meaning, m.kind, m.scale) == ("data_wait", TIMING, 1000.0) and "unit s (your rule)" in m.rule, m
    assert Mapper(rules).resolve(kind, "fetch_ms", "trainer", "0").scale == 1.0  # its own unit
    assert Mapper(rules).resolve(kind, "load", "trainer", "0").scale == 1.0      # no unit: milliseconds
    assert Mapper(rules).resolve(TIMING, "fetch", "trainer", "0").scale == 1.0   # timing(): milliseconds
    assert "(unit s)" in rules[0].source


def test_a_rule_shadowed_by_an_earlier_one_can_never_match() -> None:
    with pytest.raises(MappingError, match="rule 2 .*can never match: rule 1 has the same pattern"):
        parse_rules([{"match": "f_ms", "phase": "forward"}, {"match": "f_ms", "phase": "backward"}])


def test_config_file_mapping_good_and_bad(tmp_path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[mapping]]\nmatch = "loader.*.fetch_ms"\nworker = "$1"\nphase = "data_wait"\n')
    cfg = config_mod.load({"config_file": str(good)})
    assert len(cfg.mapping) == 1 and cfg.mapping[0].meaning == "data_wait"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[mapping]]\nmatch = "loader.*.fetch_ms"\nphase = "data_wait"\n')
    with pytest.raises(ConfigError, match=r"invalid \[\[mapping\]\] in .*bad.toml: mapping rule 1 .*capture \$1"):
        config_mod.load({"config_file": str(bad)})


class CountingMapper(Mapper):
    calls = 0

    def resolve(self, kind, raw, role, worker):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().resolve(kind, raw, role, worker)


def test_names_are_resolved_once_per_series_not_per_record() -> None:
    agg = Aggregator()
    records = [[TIMING, "target.model_forward_ms", 5.0], [COUNT, "drafter.1.tokens", 10]] * 500
    records += [[PROFILE, 3, {"drafter.queue_get_ms": 1.0, "drafter.forward_ms": 2.0}]] * 100
    assert ingest_records(agg, "monitor", "0", records, CountingMapper()) == (len(records), {})
    assert CountingMapper.calls == 4
    assert ingest_records(agg, "monitor", "0", records, CountingMapper()) == (len(records), {})
    assert CountingMapper.calls == 4  # known names go straight to their series: the mapping stage is not asked
    views = {(v.role, v.worker, v.name): v for v in agg.roll(0.0, 0.0, 1.0).series}
    fwd = views["target", "0", "model_forward"]
    assert fwd.meaning == "forward" and not fwd.snapshot and fwd.window["count"] == 2 * 500
    assert views["drafter", "1", "tokens"].meaning == "tokens"
    get = views["drafter", "0", "queue_get"]
    assert get.meaning == "queue_wait" and get.snapshot and get.rule == "key grammar + preset dflash"


def test_the_same_name_in_two_roles_is_two_series_not_a_collision() -> None:
    agg = Aggregator()
    records = [[TIMING, "target.forward_ms", 1.0], [TIMING, "drafter.forward_ms", 2.0]]
    assert ingest_records(agg, "monitor", "0", records, Mapper()) == (2, {})
    assert sorted(v.role for v in agg.roll(0.0, 0.0, 1.0).series) == ["drafter", "target"]


def test_a_new_mapper_remaps_on_the_next_record() -> None:
    agg = Aggregator()
    ingest_records(agg, "t", "0", [[TIMING, "qzx_ms", 1.0]], Mapper())  # a name nothing reads
    assert [v.meaning for v in agg.roll(0.0, 0.0, 1.0).series] == [""]
    agg.remap()  # what the pipeline does when it takes a reloaded mapping
    ingest_records(agg, "t", "0", [[TIMING, "qzx_ms", 1.0]],
               Mapper(parse_rules([{"match": "qzx_ms", "phase": "data_wait"}])))
    assert [v.meaning for v in agg.roll(1.0, 1.0, 1.0).series] == ["data_wait"]


def test_the_pipeline_takes_a_reloaded_mapping_with_its_next_frame_and_only_a_changed_one() -> None:
    import msgspec

    from sidecar.core.pipeline import Pipeline

    def frame(seq: int) -> bytes:
        return msgspec.msgpack.encode([1, 2, 7, seq, "t", "0", None, seq + 1, {}, [[TIMING, "fetch_ms", 1.0]]])

    pipeline = Pipeline()
    first = pipeline.mapper
    pipeline.reload(config_mod.load({}))  # the same mapping and role names: nothing to remap
    pipeline.frame(frame(0), 1.0)
    assert pipeline.mapper is first and pipeline.mapping() is first
    tables = [{"match": "fetch_ms", "phase": "data_wait"}]
    rules = parse_rules(tables)
    pipeline.reload(config_mod.load({"mapping": tables}))
    assert pipeline.mapper is first and pipeline.mapping().rules == rules  # in force from the next frame
    pipeline.frame(frame(1), 2.0)
    assert pipeline.mapper.rules == rules
    assert [v.meaning for v in pipeline.aggregator.roll(2.0, 2.0, 1.0).series] == ["data_wait"]


def test_hysteresis_holds_a_weak_change_for_one_window_and_takes_a_strong_one() -> None:
    h = Hysteresis()
    assert h.update(Verdict("balanced", confidence=0.8)).name == "balanced"
    held = h.update(Verdict("input-bound", (("x", 0.26),), confidence=0.52))
    assert held.name == "balanced" and "held: input-bound for 1 window" in held.detail
    assert h.update(Verdict("balanced", confidence=0.8)).name == "balanced"  # noise: back, no flap
    assert h.update(Verdict("input-bound", confidence=0.52)).name == "balanced"
    assert h.update(Verdict("input-bound", confidence=0.52)).name == "input-bound"  # two in a row
    assert h.update(Verdict("host-bound", confidence=0.95)).name == "host-bound"  # clear: at once
    assert h.update(Verdict("unknown", detail="window too short")).name == "unknown"
    assert h.shown is not None and h.shown.name == "host-bound"  # the flush window changes nothing


def test_a_relabelled_sender_maps_its_names_again() -> None:
    agg = Aggregator()
    assert ingest_records(agg, "target", "0", [[TIMING, "forward_ms", 1.0]], Mapper(), sender_id=5) == (1, {})
    assert ingest_records(agg, "drafter", "0", [[TIMING, "forward_ms", 2.0]], Mapper(), sender_id=5) == (1, {})
    views = {v.role: v.window["count"] for v in agg.roll(0.0, 0.0, 1.0, known_senders=[5]).series}
    assert views == {"target": 1.0, "drafter": 1.0}
    agg.roll(1.0, 1.0, 1.0, known_senders=[])  # a forgotten sender's name table goes with it
    assert agg.names_of(5) == {}


def test_the_mapper_keeps_what_it_mapped_when_the_aggregator_drops_its_tables() -> None:
    mapped: list[str] = []

    class Counted(Mapper):
        def _map(self, kind: int, raw: str, role: str, worker: str) -> Mapped:
            mapped.append(raw)
            return super()._map(kind, raw, role, worker)

    agg, mapper = Aggregator(), Counted()
    assert ingest_records(agg, "t", "0", [[TIMING, "fetch_ms", 1.0]], mapper) == (1, {})
    agg.remap()  # the series tables dropped (as when series expire or are evicted)
    assert ingest_records(agg, "t", "0", [[TIMING, "fetch_ms", 2.0]], mapper) == (1, {})
    assert mapped == ["fetch_ms"]
    assert mapper.resolve(TIMING, "fetch_ms", "t", "1").worker == "1"  # another sender's labels: mapped anew
    assert mapped == ["fetch_ms", "fetch_ms"]


@pytest.mark.parametrize(("name", "why"), [("perf/epoch_data_wait_s", "epoch"), ("eval_time_s", "eval"),
                                          ("timing/checkpoint_ms", "checkpoint")])
def test_a_duration_outside_the_step_says_why(name: str, why: str) -> None:
    """A duration its name puts outside the step is no phase, and ``explain`` (the series' rule) says
    why: a new user's epoch sum of the data wait showed as unmapped with no reason."""
    m = Mapper().resolve(TIMING, name, "trainer", "0")
    assert m.meaning == "" and m.outside and "outside the step by its name" in m.rule and why in m.rule, m


@pytest.mark.parametrize(("name", "meaning", "scale"), [
    ("loader", "data_wait", 1.0),      # a timing() record is a duration by its kind, whatever its words
    ("time/data", "data_wait", 1.0),   # and in the protocol's milliseconds where its name writes no unit
    ("fetch_s", "data_wait", 1000.0),  # a unit written stands
])
def test_a_timing_records_name_is_a_duration_in_milliseconds(name: str, meaning: str, scale: float) -> None:
    """``timing("loader", ms)``: a new user's loader timed with the shim's own call was unmapped (no
    unit nor duration word in its name), and ``timing("time/data", ms)`` was read in seconds."""
    m = Mapper().resolve(TIMING, name, "trainer", "0")
    assert (m.meaning, m.scale) == (meaning, scale), m


def test_a_loader_timed_by_the_shims_call_alone_reads_input_bound() -> None:
    """The probe's loop: its loader timed with ``timing("loader", ms)`` (60 % of the step), its step and
    compute with ``timing()`` too, GPUs 30 % busy."""
    events = [(1000.0 + 0.1 * (i + 1), 1, None, {"loader": 60.0, "fwd_bwd_ms": 35.0, "step_ms": 100.0})
              for i in range(300)]
    _, verdicts = drive(events, "loader", busy=0.3)
    assert set(verdicts[1:]) == {"input-bound"}, verdicts


@pytest.mark.parametrize(("name", "meaning"), [
    ("time/data_pct", "data_wait"), ("timing/forward_pct", "forward"), ("comm_time_percent", "comm_wait"),
    ("time/data(%)", "data_wait"),
    ("perf/comm_percent", ""),   # no word of a duration: a share of what is not said
    ("gpu/mem_pct", ""), ("eval_time_pct", ""), ("train/data_ratio", ""),  # a ratio: a mix as often as a share
    ("sys/io_wait_pct", ""),   # the CPU's iowait (psutil): no share of the step
])
def test_a_percent_whose_words_read_a_phase_is_its_share(name: str, meaning: str) -> None:
    """A percent gauge whose name, less its unit, reads a phase for sure is that phase's share of the
    step, as a preset's ``data_loading(%)`` is: a new user's ``time/data_pct`` was unmapped."""
    m = Mapper().resolve(PROFILE, name, "trainer", "0")
    assert m.meaning == meaning and m.kind == GAUGE, m


def test_a_loop_that_logs_its_phases_as_percents_reads_input_bound() -> None:
    """The probe's loop: its phases as percents of the step (``time/data_pct`` 60), the step in ms,
    GPUs 30 % busy."""
    shares = {"time/data_pct": 60.0, "time/forward_pct": 15.0, "time/backward_pct": 20.0, "time/optimizer_pct": 5.0}
    events = [(1000.0 + 0.1 * (i + 1), 1, i, shares | {"time/step_ms": 100.0}) for i in range(300)]
    _, verdicts = drive(events, "time/step_ms", busy=0.3)
    assert set(verdicts[1:]) == {"input-bound"}, verdicts
