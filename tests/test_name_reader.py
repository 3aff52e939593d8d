"""The name reader, rule by rule (``sidecar/processing/reader.py``), and what the mapping stage and
the window make of its reads: kinds that follow meaning, phases that contain phases, a step
decided by its siblings, a samples axis, a user overruling a read."""

from __future__ import annotations

import pytest

from sidecar.aggregation.aggregator import Aggregator
from sidecar.aggregation.insight import compute_insight
from sidecar.aggregation.ledger.facts import window_facts
from sidecar.core.pipeline import ingest_records
from sidecar.model.insight import GpuFacts
from sidecar.model.meanings import COLLECTIVES, PHASES, collectives
from sidecar.model.names import split_segments
from sidecar.model.window import GAUGE, PROFILE, TIMING
from sidecar.processing.mapping import Mapper, parse_rules
from sidecar.processing.reader import read_name, read_rate, stem, words


@pytest.mark.parametrize(("name", "meaning", "factor"), [
    ("timing/data_s", "data_wait", 1.0),                       # a namespace, the unit at the end
    ("perf/data_time_ms", "data_wait", 1e-3),
    ("Train/Samples/elapsed_time_ms_forward", "forward", 1e-3),  # the unit inside
    ("elapsed time per iteration (ms)", "step", 1e-3),          # Megatron's printed words
    ("batch_time", "step", 1.0),                                # no unit written: seconds
    ("sec_per_iter", "step", 1.0),
    ("ms/it", "step", 1e-3),                                    # a unit per step
    ("dataTimeMs", "data_wait", 1e-3),                          # camelCase
    ("fwd_bwd_time", "forward_backward", 1.0),
    ("optimizer_step_time", "optimizer", 1.0),                  # an optimizer word makes the step the optimizer's
    ("backward_allreduce_ms", "comm_wait", 1e-3),               # collectives win over the phase they sit in
    ("speed/data_load_time", "data_wait", 1.0),                 # speed as a namespace holds durations
    ("train/timing/step_total", "step", 1.0),                   # total next to a word of one step: the whole step
    ("timers/forward", "forward", 1.0),
    ("reader_cost", "data_wait", 1.0),                          # PaddlePaddle's costs are durations
    ("batch_cost", "step", 1.0),
    ("interval-time", "step", 1.0),                             # Megatron's timer of the logged interval
    ("Speed/Batch_processing_time_ms", "step", 1e-3),           # a batch's processing is the step
    ("timers/synch_weights_time_ms", "comm_wait", 1e-3),        # a sync verb beside what it moves
    ("wait_sparse_data_dist_ms", "comm_wait", 1e-3),            # torchrec's input dist: an all-to-all, not the data
    ("time/input_dist", "comm_wait", 1.0),
    ("time/ppo/optimize_step", "optimizer", 1.0),               # TRL's PPO update, a verb of the optimizer
    ("time/push_params", "comm_wait", 1.0),
    ("perf/gradients_reduce_s", "comm_wait", 1.0),
    ("ddp_sync_time", "comm_wait", 1.0),
    ("p2p_wait_ms", "comm_wait", 1e-3),                         # p2p is one word, no percentile p2
    ("pipeline_bubble_ms", "comm_wait", 1e-3),
    ("time/batch_gen", "data_wait", 1.0),                       # Megatron's batch generator, no text generation
    ("time/get_next", "data_wait", 1.0),
    ("t_data", "data_wait", 1.0),                               # a script's timer variables
    ("t_fwd", "forward", 1.0),
    ("timers/apply_grad_time_ms", "optimizer", 1e-3),           # gradients applied: the optimizer step
    ("grads_apply_time", "optimizer", 1.0),
    ("timers/compute_grads_time_ms", "forward_backward", 1e-3),  # gradients computed: the loss and its backward
    ("calc_gradients_time", "forward_backward", 1.0),
    ("dt_data", "data_wait", 1.0),                              # dt leading a phase word
    ("data_time_diff", "data_wait", 1.0),                       # a timer's last interval is no statistic
    ("iotime", "data_wait", 1.0),                               # a phase word glued to its duration word
    ("steptime_ms", "step", 1e-3),
    ("Time per iteration including communication", "step", 1.0),  # what a duration spans is no phase
    ("step_time_excl_data_ms", "step", 1e-3),
    ("dataload-time(ms)", "data_wait", 1e-3),                   # phase words glued together are split
    ("fwdbwdtime", "forward_backward", 1.0),
    ("gradsync_ms", "comm_wait", 1e-3),
    ("sendrecv_time", "comm_wait", 1.0),
    ("timer/sample_replay_buffer", "data_wait", 1.0),           # drawing a batch from a replay buffer, any order
    ("final_fwd_ms", "forward", 1e-3),                          # 'final' in the name proper: no run's end
    ("final_stage/forward_ms", "forward", 1e-3),                # nor in a segment of more words
    ("model.final.forward_time", "forward", 1.0),               # nor in a module's path
    ("comm/flag_broadcast_time", "comm_wait", 1.0),             # a flag before a duration word is what is timed
    ("train/batch_fetch_seconds_step", "data_wait", 1.0),       # Lightning's on_step suffix after the unit
    ("learner/wait_rollouts_time", "data_wait", 1.0),           # a learner's wait for its rollouts: its input
    ("rollout_wait_s", "data_wait", 1.0),
    ("time/waiting_for_rollouts", "data_wait", 1.0),
    ("Time/Batch getting", "data_wait", 1.0),                   # getting a batch, in either order
    ("batch_get_ms", "data_wait", 1e-3),
    ("time/replay_buffer_sample", "data_wait", 1.0),
    ("timer/train_batch_total_time_ms", "step", 1e-3),          # a batch's total is the whole step
    ("timer/train_batch_forward_ms", "forward", 1e-3),          # a phase beside the batch it is part of
    ("Timing_Stats/Train_Train_Batch", "step", 1.0),            # training one batch is the step
    ("batch_process_time", "step", 1.0),                        # a batch's processing is the step
    ("TRAIN/LoadDataTime(secs/batch)", "data_wait", 1.0),       # a / inside brackets is a ratio of units
    ("train_speed(s/it)", "step", 1.0),                         # a speed in seconds per step is a step time
    ("perf/throughput(ms/step)", "step", 1e-3),
    ("train_info/time_between_train_steps", "data_wait", 1.0),  # the gap between steps: the next batch's wait
    ("time_between_iterations_ms", "data_wait", 1e-3),
    ("step_time/process_0", "step", 1.0),                       # an OS process is no host preparation
    ("iter_time_process_rank", "step", 1.0),
    ("runtime/forward", "forward", 1.0),                        # runtime/ as a namespace holds durations
    ("throughput/sec_per_step", "step", 1.0),                   # seconds per step under throughput/: no rate
    ("Generator/backward_time", "backward", 1.0),               # a GAN's generator is trained: no collector
    ("clip.img_encoder_fwd_s", "forward", 1.0),                 # a CLIP model's namespace, no gradient clipping
    ("perf/iter_wall_time", "step", 1.0),                       # one iteration's wall time, not the run's
    ("step_wallclock_s", "step", 1.0),
])
def test_phases_read_from_names(name: str, meaning: str, factor: float) -> None:
    r = read_name(name)
    assert (r.meaning, r.unit.base, r.certainty) == (meaning, "seconds", 1.0), r
    assert r.unit.factor == pytest.approx(factor)


@pytest.mark.parametrize(("name", "why"), [
    ("time/time_elapsed", "time_elapsed"),        # since the start
    ("eval_time_s", "eval"),
    ("data_time_max_ms", "max"),                  # a statistic of many steps
    ("layer.3.forward_ms", "layer"),              # one component's part
    ("timing_per_token_ms/update_actor", "per item"),
    ("time/iterations", "iterations"),            # a count under a namespace of durations
    ("time/fps", "fps"),
    ("memory/max_reserved(GiB)", "max"),
    ("timing_s/update_actor", "update"),          # a learner's whole update is no optimizer step
    ("time_debug/update_ema", "ema"),
    ("grad_norm", "norm"),
    ("data", "no time unit"),                     # names a phase, says no duration
    ("iteration-time/TFLOPs per gpu (estimated)", "tflops"),
    ("Prediction Iteration Time (seconds)", "predict"),  # a veto word in any of its forms
    ("timing/evaluating_step_s", "evaluate"),
    ("time/checkpoints_ms", "checkpoint"),
    ("Time Wait For Batch (Eval)", "eval"),       # a wait for an eval batch is the evaluation's
    ("step_start_time", "start"),                 # a moment, not a duration
    ("time/step_stop_server", "stop"),
    ("timing/offload_s", "offload"),              # an inference server's life
    ("timing/convert_to_training_input", "convert"),  # host-side preparation, not the loader's wait
    ("misc/gradient_update_elapse", "update"),    # a gradient's update: the learner's own, no backward
    ("batch_preprocessing_time", "preprocessing"),  # only processing right after a step word is the step
    ("grad_diff", "diff"),                        # a difference of no duration word is a statistic
    ("wall-time(ms)", "wall_time"),               # since the start in most loggers, whatever its unit
    ("gpu_mem_time", "mem"),                      # a device's memory, no device's time
    ("gpu_idle_time", "no phase"),                # a device word beside another word: no bare duration
    ("runtime", "runtime"),                       # a glued head that is no phase word stays one word
    ("walltime", "walltime"),
    ("eval_time_including_data", "eval"),         # a key outside the step is refused by all its words
    ("network_latency", "no phase"),              # a network's latency is a round trip, no step
    ("net_latency_ms", "no phase"),
    ("gpu_latency", "no phase"),                  # a device's latency or delay is no step's time
    ("net_delay", "no phase"),
    ("timer/train_loader_total_time_ms", "total"),  # a part's total sums it over many steps, unlike the step's
    ("Timing_Stats/Train_Process_Batch", "process"),  # processing a batch: its preparation on the host
    ("cpu/iowait", "iowait"),                     # the CPU's wait for I/O is a system figure, no data wait
    ("timestep_time", "no phase"),                # a word the reader knows is never split (no "time step")
    ("TRAIN/TrainTime(hours/epoch)", "epoch"),    # a time per epoch is no step's
    ("steps_between_evals", "steps"),             # a count of steps, no time between them
    ("commit_time", "no phase"),                  # no 'comm it': a two-letter piece only before a duration word
    ("async_commit_latency", "no phase"),
    ("gradio_latency_ms", "no phase"),            # no 'grad io'
    ("time_ms/batch_size", "size"),               # a size: the step noun of a unit per step ends its word
    ("timing_s/iter_num", "num"),
    ("train/loop_total_time", "total"),           # a loop's total is the run's; only one step's total is whole
    ("cycle_total_time", "total"),
    ("time_between_optimizer_steps", "steps"),    # no gap between steps: a phase word between
    ("avg_mean_ms", "no phase"),                  # two mean words are no mean of a time
    ("optimizer-unscale-and-check-inf-time", "unscale"),  # a loss scaler's part of the optimizer step
    ("time/after_train_iter", "after"),           # what runs after a step (a hook) is no part of it
    ("minimal IO rate [GB/s]", "rate"),           # a rate in square brackets
    ("perf/cleanup_minibatch_seconds", "cleanup"),  # housekeeping after a minibatch, no step
    ("perf/gc_time_ms", "gc"),
    ("timing/collector_weight_sync_ms", "collector"),  # an RL collector's own time, not the learner's step
    ("evaluator/step_time", "evaluator"),         # what evaluates: its step is the evaluation's
    ("validators/forward_ms", "validator"),
    ("checkpointer_step_time", "checkpointer"),
    ("final/sync_wait_other_seconds", "final"),   # a run's final figure, written once when it ends
    ("run/final/fwd_ms", "final"),
    ("epoch/wall_seconds", "epoch"),              # a duration of no phase word under an epoch's namespace
    ("epoch/duration", "epoch"),
    ("train/batch_fetch_seconds_epoch", "epoch"),  # Lightning's on_epoch mean: the epoch's, outside the step
    ("rollout_time", "rollout"),                  # the rollout itself stays outside
    ("time/unaccounted_step_s", "unaccounted"),   # what the timed phases leave of the step: a part of no phase
    ("train/timer_other", "other"),
    ("performance/train_misc_time", "misc"),
    ("perf/data_stall_flag", "flag"),             # a flag (1 when the data wait is over half the step), no wait
    ("timing/render", "no phase"),                # a render alone: an environment's, a picture's (beside a
    ("render_ms", "no phase"),                    # backward, the window reads it the forward)
    ("tr/dur", "no time unit or duration word"),  # speech code's dur: a duration predictor's loss, an
    ("data_dur", "no time unit or duration word"),  # utterance's length; no timer's
    ("train/walltime", "walltime"),               # the wall clock since the start, beside no word of one step
    ("perf/wall_time_s", "wall_time"),
    ("step_wallclock", "wallclock"),              # after a step word, but no unit nor duration word
    ("clip_grad_time", "clip"),                   # a gradient's clipping: one part of the optimizer step
    ("load_and_tokenize_time", "part of the step of no phase"),  # a preparation beside a load: often a
    ("time/jacobian", "no phase word"),           # one-off start-up's; a Jacobian is a solver's as often
])
def test_names_that_are_no_phase(name: str, why: str) -> None:
    r = read_name(name)
    assert r.meaning == "" and why in r.why, r


@pytest.mark.parametrize(("name", "factor"), [
    ("dt", 1.0),                  # a bare duration word
    ("time_diff", 1.0),           # a timer's last interval (its toc minus its tic)
    ("timer/time_delta_ms", 1e-3),
    ("gpu_etime_ms", 1e-3),       # an elapsed time on the device that runs the step
    ("gpu-time(ms)", 1e-3),       # the unit in brackets after a hyphenated word
    ("dt_net", 1.0),              # the network's time: the step's compute
    ("cuda_time_ms", 1e-3),
    ("perf/compute_time", 1.0),   # a step's compute in most trainers, a log interval's sum in fairseq2
    ("Time/compute", 1.0),        # the same under a namespace of durations
    ("timing/gpu_ms", 1e-3),
    ("perf_stats/train/avg_time_sec", 1.0),  # a mean of a bare time (a clock is never averaged)
    ("time_avg", 1.0),
    ("mean_duration_ms", 1e-3),
])
def test_bare_durations_are_the_step_uncertain(name: str, factor: float) -> None:
    r = read_name(name)
    assert (r.meaning, r.unit.base, r.certainty) == ("step", "seconds", 0.5) and "bare" in r.why, r
    assert r.unit.factor == pytest.approx(factor) and r.ambiguous


@pytest.mark.parametrize("name", [
    "cuda_sync_time", "gpu_sync_time", "device_sync_time", "torch_cuda_synchronize_ms",  # the GPU's own work
    "s3_sync_time", "disk_sync_time", "upload_sync_time", "wandb_sync_time",            # files copied out
    "last_sync_time", "sync_period_s", "time_sync_ms", "target_sync_time", "sync_time", "synctime",
])
def test_a_sync_of_nothing_moved_is_no_communication(name: str) -> None:
    """A sync names communication only beside what it moves (``grad_sync``, ``sync_weights``): alone
    or beside a device or a store it is as often the GPU's own work (a nanoGPT-style trainer logs its
    ``torch.cuda.synchronize()`` as ``cuda_sync_time`` on one GPU) or a copy outside the step."""
    assert read_name(name).meaning != "comm_wait", read_name(name)


@pytest.mark.parametrize(("collective", "spelling"),
                         [(c, s) for c, spellings in sorted(COLLECTIVES.items()) for s in sorted(spellings)])
def test_every_spelling_of_a_collective_is_communication_and_that_collective(collective: str, spelling: str) -> None:
    """One declaration (``model.meanings.COLLECTIVES``) feeds the reader and the insight, which sums a
    wait timed under different collectives: each spelling, in the forms trainers write it, reads as
    ``comm_wait`` and, by its stem, as its collective only (the insight's own list had drifted from
    the reader's: ``a2a`` was communication, but no collective of its own)."""
    parts = spelling.split("_")
    camel = "".join(p.capitalize() for p in parts)
    for name in (f"time/{spelling}_ms", f"perf/{camel}_s", f"{'-'.join(parts)}-time", f"moe/{camel}Time"):
        r = read_name(name)
        assert r.meaning == "comm_wait", (name, r)
        assert collectives(stem(name).split("_")) == {collective}, (name, stem(name))


@pytest.mark.parametrize(("name", "meaning"), [
    ("train/prefecth_time", "data_wait"),     # FixMatch's, two letters swapped
    ("foward_time_ms", "forward"),            # a letter left out
    ("bakward_time", "backward"),
    ("optimzer_step_ms", "optimizer"),
    ("allreudce_ms", "comm_wait"),
    ("iteraton_time", "step"),
    ("simple_time", ""),                      # a word of its own, no slip from "sample": short words are not guessed
    ("stared_time", ""),                      # nor the forms in -ed and -ing ("starved")
    ("forwar_time", ""),                      # a word cut short is an abbreviation, no slip
])
def test_a_misspelt_word_is_read_as_meant(name: str, meaning: str) -> None:
    """Read as meant, with the certainty lowered and the guess said (``interal`` may be ``internal``)."""
    r = read_name(name)
    assert r.meaning == meaning, r
    if meaning:
        assert r.certainty == 0.5 and "read as" in r.why and r.ambiguous, r


def test_no_misspelling_is_a_word_the_reader_knows() -> None:
    from sidecar.processing.reader import _KNOWN, MISSPELT

    assert MISSPELT and not MISSPELT.keys() & _KNOWN
    assert all(len(slip) >= 6 for slip in MISSPELT)


def test_lemmas_find_bases_never_phases() -> None:
    from sidecar.processing.reader import lemmas

    assert {"predict", "evaluate", "checkpoint", "compile", "save"} <= lemmas(
        {"prediction", "evaluating", "checkpoints", "compiling", "saves"})
    assert read_name("time/steps").meaning == ""  # a count, whatever its lemma
    assert read_name("perf/logits_time").meaning == "forward"  # logits is no form of log


def test_ambiguous_names_are_read_with_less_certainty_and_say_why() -> None:
    r = read_name("iter_time")
    assert (r.meaning, r.certainty) == ("step", 0.5) and "ESPnet" in r.ambiguous
    m = Mapper().resolve(PROFILE, "time", "t", "0")  # a preset's bare time: which framework?
    assert (m.meaning, m.certainty) == ("step", 0.5) and "ambiguous" in m.rule
    assert read_name("throughput/duration").certainty == 0.5
    assert read_name("itertime").certainty == 0.5  # glued, still ESPnet's or detectron2's


def test_rates_are_throughputs() -> None:
    assert [read_rate(n) for n in ("perf/tokens_per_sec", "train/samples_per_second_per_gpu", "it/s",
                                   "Throughput (samples/s)", "time/fps", "perf/throughput")] == \
        ["tokens_per_s", "samples_per_s", "steps_per_s", "samples_per_s", "", ""]
    m = Mapper().resolve(PROFILE, "Throughput (samples/s)", "t", "0")
    assert (m.kind, m.meaning) == (GAUGE, "samples_per_s")  # not Megatron's TFLOP/s "throughput"


def test_kinds_follow_meaning_on_both_paths() -> None:
    mapper = Mapper()
    for kind in (PROFILE, GAUGE):  # a tapped logger call (publish) and a gauge() alike
        m = mapper.resolve(kind, "perf/data_time_ms", "t", "0")
        assert (m.kind, m.meaning, m.scale) == (TIMING, "data_wait", 1.0) and "read from the name" in m.rule
        m = mapper.resolve(kind, "timing/iter_s", "t", "0")
        assert (m.kind, m.meaning, m.scale) == (TIMING, "step", 1000.0)
    agg = Aggregator()
    assert ingest_records(agg, "t", "0", [[GAUGE, "timing/data_s", 0.03], [GAUGE, "timing/iter_s", 0.05]], mapper) \
        == (2, {})
    views = {v.raw: v for v in agg.roll(0.0, 1.0, 1.0).series}
    assert views["timing/data_s"].kind == TIMING and views["timing/data_s"].snapshot
    assert views["timing/data_s"].window["mean"] == pytest.approx(30.0)  # ms, as every timing series


def test_a_users_rule_overrules_a_read() -> None:
    rules = parse_rules([{"match": "perf/data_time_ms", "phase": "none"},
                         {"match": "batch_time", "phase": "optimizer"}])
    mapper = Mapper(rules)
    none = mapper.resolve(PROFILE, "perf/data_time_ms", "t", "0")
    assert none.meaning == "" and none.rule.startswith("mapping[1] (no phase)")
    assert mapper.resolve(PROFILE, "batch_time", "t", "0").meaning == "optimizer"
    assert [r.source for r in rules] == ["match = 'perf/data_time_ms' -> none", "match = 'batch_time' -> optimizer"]


DEEPSPEED = {f"Train/Samples/elapsed_time_ms_{k}": v for k, v in {
    "forward": 10.0, "backward": 45.0, "backward_inner": 12.0, "backward_allreduce": 33.0, "step": 5.0}.items()}


def _window(profiles: list[tuple[int, dict[str, float]]], sender: int = 1):
    agg, mapper = Aggregator(), Mapper()
    for step, data in profiles:
        for key, value in data.items():  # DeepSpeed's monitor: one add_scalar (one publish) per key
            ingest_records(agg, "trainer", "0", [[PROFILE, step, {key: value}]], mapper, sender_id=sender)
    return agg.roll(0.0, 10.0, 10.0)


def test_a_phase_told_with_its_parts_counts_once_and_its_all_reduce_is_communication() -> None:
    w = _window([(32 * i, DEEPSPEED) for i in range(1, 6)])
    meanings = {v.raw.rsplit("_ms_", 1)[1]: v.meaning for v in w.series}
    assert meanings == {"forward": "forward", "backward": "", "backward_inner": "backward",
                        "backward_allreduce": "comm_wait", "step": "optimizer"}
    whole = next(v for v in w.series if v.raw.endswith("_backward"))
    assert whole.counted_in and "the sum of its parts" in whole.rule
    shares = compute_insight(w, gpus=GpuFacts(busy={"0": 0.46})).roles["trainer"].time_share
    assert shares == pytest.approx({"forward": 10 / 60, "backward": 12 / 60, "comm_wait": 33 / 60, "optimizer": 5 / 60})


def test_sibling_words_read_the_same_in_any_order() -> None:
    """A review found the step's sibling decided after a render had become the forward in the same
    pass: one order of the names read the optimizer, another the step. Now every sibling is decided
    on the meanings as read."""
    import itertools

    keys = {"train/render_time": 0.1, "train/backward_time": 0.2, "train/time_step": 0.4}
    seen = {tuple(sorted((v.raw, v.meaning) for v in _window([(1, dict(order))]).series))
            for order in itertools.permutations(keys.items())}
    assert seen == {(("train/backward_time", "backward"), ("train/render_time", "forward"),
                     ("train/time_step", "step"))}


def test_a_bare_total_since_the_start_beside_phases_is_known_by_its_numbers() -> None:
    """A bare ``time/total`` beside three phases of its prefix reads as their whole, the step
    (uncertain); a trainer's seconds since the start under that name climb with the wall clock, and
    the clock rule reads it as no phase after five windows (sidecar.aggregation.clocks). A bare
    ``total_time`` with no timer's namespace stays a gauge, as before."""
    agg, mapper = Aggregator(), Mapper()
    meanings = []
    for k in range(8):
        records = [[PROFILE, 10 * k + j, {"time/total": 3600 + 10.0 * k + j, "time/data": 0.1, "time/forward": 0.2,
                                          "time/backward": 0.6}] for j in range(10)]
        ingest_records(agg, "trainer", "0", records, mapper)
        total = next(v for v in agg.roll(10.0 * (k + 1), 10.0 * (k + 1), 10.0).series if v.raw == "time/total")
        meanings.append(total.meaning)
    assert meanings[0] == "step" and meanings[-1] == "" and "climb with the wall clock" in total.rule, meanings
    assert Mapper().resolve(PROFILE, "total_time", "t", "0").kind == GAUGE


def test_every_sibling_word_has_its_needs() -> None:
    from sidecar.aggregation.parts import SIBLING_NEEDS
    from sidecar.processing.reader import SIBLING_WORDS

    assert set(SIBLING_WORDS.values()) <= SIBLING_NEEDS.keys()


def test_a_render_beside_its_backward_is_the_forward_in_the_time_shares() -> None:
    """A Gaussian splatting loop's own timers (gsplat, speedy-splat, LiteGS: ``timing/render`` beside
    ``timing/backward``): the render's time is the forward's, not unread; said in its rule."""
    w = _window([(i, {"timing/data": 0.01, "timing/render": 0.04, "timing/backward": 0.05}) for i in range(1, 6)])
    render = next(v for v in w.series if v.raw == "timing/render")
    assert render.kind == TIMING and render.meaning == "forward" and "forward beside timing/backward" in render.rule
    shares = compute_insight(w, gpus=GpuFacts(busy={"0": 0.9})).roles["trainer"].time_share
    assert shares == pytest.approx({"data_wait": 0.1, "forward": 0.4, "backward": 0.5})


def test_a_step_alone_is_the_step_and_a_forward_backward_beside_its_parts_is_not_counted() -> None:
    alone = _window([(1, {"Train/Samples/elapsed_time_ms_step": 50.0, "Train/Samples/elapsed_time_ms_data": 5.0})])
    assert {v.raw: v.meaning for v in alone.series}["Train/Samples/elapsed_time_ms_step"] == "step"
    both = _window([(1, {"fwd_ms": 10.0, "bwd_ms": 20.0, "fwd_bwd_ms": 30.0})])
    assert {v.raw: v.meaning for v in both.series} == {"fwd_ms": "forward", "bwd_ms": "backward", "fwd_bwd_ms": ""}
    assert stem("Train/Samples/elapsed_time_ms_backward") == "train_samples_backward"


def test_a_samples_axis_counts_steps_not_samples() -> None:
    from sidecar.model.window import IngestReport, SenderView

    def report(w):
        s = SenderView(1, "trainer", "0", 4242, {"started_unix_s": 1.0}, 0.1, 9.9, 5, 5, 5, 0, 0, 0, {}, {})
        return IngestReport(w, (s,), {}, {}, {}, 0, 0, 0, 0, 0)

    samples = _window([(32 * i, DEEPSPEED) for i in range(1, 9)])
    assert samples.sender_step_counts == {1: 8} and samples.sender_steps == {1: 256}
    fact = window_facts(report(samples)).senders[0]
    assert (fact.step, fact.first_step) == (8, 1)
    # a batch-size ramp (32, then 64 a step) and a variable token count: still one step a change
    ramp = _window([(s, DEEPSPEED) for s in (32, 64, 96, 160, 224, 288)])
    assert ramp.sender_step_counts == {1: 6}
    # the same stride from a logger that says no samples namespace (every 32nd step): steps as sent;
    # a rate under samples/ says nothing of the axis
    every = _window([(32 * i, {"timing/iter_s": 0.05, "samples/s": 640.0, "tokens/sec/gpu": 9e3})
                     for i in range(1, 9)])
    assert every.sender_step_counts == {} and window_facts(report(every)).senders[0].step == 256


def _paced(strides: list[int], seconds_per_change: float, keys: dict[str, float]):
    """A TensorBoard-style logger whose step moves by ``strides``, ``seconds_per_change`` apart."""
    now = [0.0]
    agg, mapper = Aggregator(clock=lambda: now[0]), Mapper()
    step = 0
    for stride in strides:
        step += stride
        now[0] += seconds_per_change
        ingest_records(agg, "trainer", "0", [[PROFILE, step, keys]], mapper, sender_id=1)
    return agg.roll(0.0, 10.0, 10.0)


def test_a_samples_axis_is_known_by_its_pace_without_a_samples_namespace() -> None:
    keys = {"timing/iter_s": 0.05, "timing/data_s": 0.03}  # 50 ms a step
    # the step moves by the batch (32) once per step's time: it counts samples
    assert _paced([32] * 12, 0.05, keys).sender_step_counts == {1: 12}
    # every tenth step logged on a step axis: it moves by 10 once per ten steps' time, read as sent
    assert _paced([10] * 12, 0.5, keys).sender_step_counts == {}
    # a stride that varies (a step axis logged when something happened), too few changes, no step time
    assert _paced([32, 32, 33] * 4, 0.05, keys).sender_step_counts == {}
    assert _paced([32] * 5, 0.05, keys).sender_step_counts == {}
    assert _paced([32] * 12, 0.05, {"loss": 1.0}).sender_step_counts == {}


def test_any_name_is_read_without_raising() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.text(min_size=1, max_size=200))
    def check(name: str) -> None:
        r = read_name(name)
        assert r.meaning in {"", "step"} | set(PHASES)  # the queue's waits included (QueueWait)
        assert 0.0 < r.certainty <= 1.0 and (r.unit.base in ("", "seconds"))
        assert read_rate(name) in ("", "tokens_per_s", "samples_per_s", "steps_per_s")
        stem(name)

    check()


@pytest.mark.parametrize(("profile", "expected"), [
    # a part of the phase's own meaning alone is inside it: the forward stays, the attention is not counted again
    ({"forward_ms": 30.0, "forward_attn_ms": 12.0}, {"forward_ms": "forward", "forward_attn_ms": ""}),
    # a part of another phase alone stays beside it: the backward compute is not lost
    ({"backward_ms": 45.0, "backward_allreduce_ms": 33.0},
     {"backward_ms": "backward", "backward_allreduce_ms": "comm_wait"}),
    # forward_backward beside another model's forward and backward is no sum of them
    ({"timing/policy_fwd_bwd": 0.5, "timing/ref_logprob": 0.1, "timing/critic_backward": 0.2},
     {"timing/policy_fwd_bwd": "forward_backward", "timing/ref_logprob": "forward",
      "timing/critic_backward": "backward"}),
    # Megatron: forward-backward beside forward-compute and backward-compute keeps its bubbles
    ({"forward-backward-time": 0.5, "forward-compute-time": 0.1, "backward-compute-time": 0.2},
     {"forward-backward-time": "forward_backward", "forward-compute-time": "forward",
      "backward-compute-time": "backward"}),
    # a loop's train_step beside its train_forward and train_backward is the whole step, not the optimizer
    ({"timing/train_step": 0.5, "timing/train_forward": 0.1, "timing/train_backward": 0.2},
     {"timing/train_step": "step", "timing/train_forward": "forward", "timing/train_backward": "backward"}),
    # a step of one word beside a forward and a backward is the step too (time/step, not DeepSpeed's)
    ({"time/step": 0.5, "time/forward": 0.1, "time/backward": 0.2},
     {"time/step": "step", "time/forward": "forward", "time/backward": "backward"}),
    # Gaussian splatting: a render beside its backward is the renderer's forward (a unit written or not)
    ({"timing/data": 0.01, "timing/render": 0.1, "timing/backward": 0.2},
     {"timing/data": "data_wait", "timing/render": "forward", "timing/backward": "backward"}),
    ({"time/render [ms]": 100.0, "time/backward [ms]": 200.0},
     {"time/render [ms]": "forward", "time/backward [ms]": "backward"}),
    # ... and its rasterizer's forward, a part of it, is not counted again
    ({"time/render [ms]": 100.0, "time/render/rasterize_forward [ms]": 60.0, "time/backward [ms]": 200.0},
     {"time/render [ms]": "forward", "time/render/rasterize_forward [ms]": "", "time/backward [ms]": "backward"}),
    # a diffusion trainer's UNet beside its backward is its forward; alone (a frozen one's) no phase
    ({"time/unet_time": 0.3, "time/backward_time": 0.5},
     {"time/unet_time": "forward", "time/backward_time": "backward"}),
    ({"time/unet_time": 0.3, "time/vae_time": 0.1}, {"time/unet_time": "", "time/vae_time": ""}),
    # a sibling word takes only the phase its siblings leave out: beside the trainer's own forward, no phase
    ({"time/forward": 0.1, "time/unet": 0.08, "time/backward": 0.2},
     {"time/forward": "forward", "time/unet": "", "time/backward": "backward"}),
    # a name of one word has the one-word names as siblings: an RL render, a learner's backward elsewhere
    ({"timing/env_step": 0.3, "timing/render": 0.2, "timing/policy_backward": 0.1},
     {"timing/env_step": "", "timing/render": "", "timing/policy_backward": "backward"}),
    ({"render_time": 0.2, "train/backward_time": 0.1}, {"render_time": "", "train/backward_time": "backward"}),
    # Lightning's _step suffix is no DeepSpeed timer's step: the batch's time stays the step
    ({"train/fwd_seconds_step": 0.1, "train/bwd_seconds_step": 0.2, "train/batch_seconds_step": 0.4},
     {"train/fwd_seconds_step": "forward", "train/bwd_seconds_step": "backward", "train/batch_seconds_step": "step"}),
    # a bare total beside two phases of its prefix is their whole, the step (lgssl, gsplat, pydreamer)
    ({"time/data_loading": 0.05, "time/forward": 0.1, "time/backward": 0.2, "time/total": 0.4},
     {"time/data_loading": "data_wait", "time/forward": "forward", "time/backward": "backward", "time/total": "step"}),
    ({"train/timer_data": 0.05, "train/timer_forward": 0.1, "train/timer_total": 0.2},
     {"train/timer_data": "data_wait", "train/timer_forward": "forward", "train/timer_total": "step"}),
    ({"tick/input_ms": 55.0, "tick/fwdbwd_ms": 45.0, "tick/whole_ms": 100.0},
     {"tick/input_ms": "data_wait", "tick/fwdbwd_ms": "forward_backward", "tick/whole_ms": "step"}),
    # ... beside one phase, or beside a step timed already, it is no phase (a run's total, a statistic)
    ({"time/total": 3600.0, "time/dataloader": 0.1}, {"time/total": "", "time/dataloader": "data_wait"}),
    ({"time/total": 0.4, "time/data": 0.05, "time/forward": 0.1, "time/step": 0.3},
     {"time/total": "", "time/data": "data_wait", "time/forward": "forward", "time/step": "step"}),
    # a render with no backward beside it (an RL environment's) is no phase: a timing of no phase
    ({"timing/render": 0.02, "timing/env_step": 0.1}, {"timing/render": "", "timing/env_step": ""}),
    # a render beside another prefix's backward is none of its siblings'
    ({"env/render_ms": 20.0, "learner/backward_ms": 200.0}, {"env/render_ms": "", "learner/backward_ms": "backward"}),
])
def test_parts_and_siblings_keep_what_the_names_do_not_contain(profile: dict[str, float],
                                                                expected: dict[str, str]) -> None:
    assert {v.raw: v.meaning for v in _window([(1, profile)]).series} == expected


@pytest.mark.parametrize(("profile", "expected"), [
    # the SAC loggers (pytorch_sac, CURL): an episode's wall time beside its number, when it ends
    ({"train/duration": 12.0, "train/episode": 3.0, "train/episode_reward": 1.5},
     {"train/duration": "", "train/episode": "", "train/episode_reward": ""}),
    ({"train/duration": 12.0, "train/EpisodeReturn": 1.5}, {"train/duration": "", "train/EpisodeReturn": ""}),
    # an episode in another namespace says nothing of this one's duration: the step, uncertain
    ({"train/duration": 0.2, "eval/episode_reward": 1.5}, {"train/duration": "step", "eval/episode_reward": ""}),
    # a read the name decided stays, beside episodes or not
    ({"train/step_time": 0.2, "train/episode": 3.0}, {"train/step_time": "step", "train/episode": ""}),
])
def test_an_uncertain_step_beside_an_episode_is_the_episodes_time(profile: dict[str, float],
                                                                  expected: dict[str, str]) -> None:
    series = _window([(1, profile)]).series
    assert {v.raw: v.meaning for v in series} == expected
    for v in series:
        if v.raw.endswith("duration") and not v.meaning:
            assert v.outside and "an episode's time beside train/" in v.rule, v


def test_two_names_of_one_phase_read_one_preset_first() -> None:
    w = _window([(1, {"time/data": 0.03, "data_time": 0.02, "time/step": 0.1})])
    shares = compute_insight(w).roles["trainer"].time_share
    assert shares["data_wait"] == pytest.approx(0.2)  # mmengine's data_time (a preset), not the read time/data


def test_no_false_health_reads_no_kernel_and_the_timed_role() -> None:
    from sidecar.aggregation.settings import InsightSettings
    from sidecar.aggregation.verdict import RoleFacts, decide

    s = InsightSettings()
    timed = RoleFacts("trainer", {"forward": 0.4, "backward": 0.5, "optimizer": 0.1}, ())
    balanced = {"trainer": timed, "eval": RoleFacts("eval", {}, ())}
    # the timed trainer 80 % busy with its idle explained; an untimed evaluator's GPU 5 % busy
    idle = {"trainer": {"idle": 0.2, "unexplained": 0.2}, "eval": {"idle": 0.95, "unexplained": 0.95}}
    v = decide(balanced, 10.0, None, None, {}, {}, s, {"trainer": 0.8, "eval": 0.05}, 2, ("trainer", "eval"),
               None, idle)
    assert v.name == "balanced", v
    # GPM SM activity 0.6 while NVML utilization reads 1.0: the GPU never idled
    w = _window([(1, {"forward_ms": 40.0, "backward_ms": 50.0, "optimizer_ms": 10.0, "step_ms": 100.0})])
    gpus = GpuFacts(busy={"0": 0.6}, utilization={"0": 1.0})
    assert compute_insight(w, gpus=gpus).verdict.name != "unexplained-idle"


def test_a_name_overruled_as_none_is_not_unattributed() -> None:
    rules = parse_rules([{"match": "perf/data_time_ms", "phase": "none"}])
    m = Mapper(rules).resolve(PROFILE, "perf/data_time_ms", "t", "0")
    assert (m.kind, m.meaning, m.outside) == (TIMING, "", True)


def _verdict_of(profile: dict[str, float], busy: float = 0.4) -> tuple[str, str]:
    """The verdict (name, detail) of a trainer publishing ``profile`` every step, ten steps a 10 s
    window, after three windows, its GPU ``busy``."""
    agg, mapper = Aggregator(), Mapper()
    for k in range(3):
        ingest_records(agg, "trainer", "0", [[PROFILE, 10 * k + j, profile] for j in range(10)], mapper)
        report = agg.roll(10.0 * (k + 1), 10.0 * (k + 1), 10.0)
    v = compute_insight(report, gpus=GpuFacts(busy={"0": busy})).verdict
    return v.name, v.detail


def test_a_duration_of_no_phase_is_a_timing_whose_time_is_unattributed() -> None:
    """Kinds follow meaning: a key that says a duration and no phase is a timing of no phase (in
    seconds where no unit is written), not a gauge; outside the step it stays a gauge."""
    mapper = Mapper()
    for name in ("timing/sync_time", "put_duration", "training_time", "learner/sgd_update_time", "update_time"):
        m = mapper.resolve(PROFILE, name, "t", "0")
        assert (m.kind, m.meaning, m.scale, m.outside) == (TIMING, "", 1000.0, False), (name, m)
    for name in ("eval_time", "time_elapsed", "train/hr"):
        assert mapper.resolve(PROFILE, name, "t", "0").kind == GAUGE, name


@pytest.mark.parametrize(("profile", "named"), [
    # a step and the trainer's own timers, none of whose names says a phase (a DDP weight push);
    # before: unexplained-idle saying "no phase timings", nothing named
    ({"timing/step_time": 1.0, "timing/train_time": 0.4, "timing/sync_time": 0.55, "loss": 1.0},
     "55% of the step in timing/sync_time and 1 more"),
    # a step, its data wait and forward, and an unread sync; before: host-bound (the gap taken for host time)
    ({"step_time": 1.0, "data_time": 0.1, "fwd_time": 0.2, "timing/sync_time": 0.6},
     "60% of the step in timing/sync_time"),
    # no step; four timed parts, two of them read; before: input-bound (the two were the whole)
    ({"timing/data_loading_duration": 0.08, "timing/training_duration": 0.3, "timing/put_duration": 0.55,
      "timing/gather_duration": 0.05}, "timing/put_duration"),
])
def test_time_in_a_duration_of_no_phase_is_named_never_host_or_input(profile: dict[str, float], named: str) -> None:
    """SPEC: time in timings that map to nothing is unattributed, lowers the confidence, is named,
    and never makes host-bound. Before, such keys stayed gauges: the second read host-bound, the
    third input-bound (the data wait 62 % of a cycle of the two parts read; it is 8 %)."""
    name, detail = _verdict_of(profile)
    assert name == "unexplained-idle" and named in detail and "unmapped: add a rule" in detail, (name, detail)


def test_the_dflash_queue_rules_say_what_was_read() -> None:
    from sidecar.aggregation.settings import InsightSettings
    from sidecar.aggregation.verdict import RoleFacts, decide

    s = InsightSettings()
    target = RoleFacts("target", {"data_wait": 0.6, "forward": 0.3}, (), read={"data_wait": ("time/fetch", 1.0)})
    drafter = RoleFacts("drafter", {"queue_wait": 0.5, "forward": 0.4}, ())
    v = decide({"target": target, "drafter": drafter}, 10.0, 0.5, 0.1, {}, {}, s)
    assert v.name == "input-bound" and "data_wait read from the name: time/fetch" in v.detail, v


@pytest.mark.parametrize("name", ["dataloader", "dataloading", "fwdbwd", "gradstep", "reducescatter", "timestep"])
def test_a_word_the_reader_knows_is_never_split(name: str) -> None:
    assert words(name) == [name]


def test_loss_min_per_step_is_no_duration() -> None:
    """``min`` is a minimum as often as minutes: no time unit per step in ``loss/min/step``."""
    r = read_name("loss/min/step")
    assert r.meaning == "" and not r.duration, r


@pytest.mark.parametrize("name", ["time_per_iter_train_ms", "time_per_batch_training", "time_per_step_bf16",
                                  "time_per_iter_rank0_ms", "perf/ms_per_batch"])
def test_a_time_per_step_with_words_after_it_stays_the_step(name: str) -> None:
    """A rule that read the words after ``per <step>`` as what is timed (``ms_per_batch_forced_align``,
    a forced alignment a batch) was withdrawn: a review found the step's own qualifiers after it
    (its split, precision, rank) read as no phase."""
    reading = read_name(name)
    assert reading.meaning == "step" and reading.duration, reading


@pytest.mark.parametrize("name", ["eval/steps_per_second", "eval_samples_per_second", "val/it_per_sec",
                                  "test/tokens_per_sec"])
def test_an_evaluations_rate_is_no_training_rate(name: str) -> None:
    """HF logs ``eval/steps_per_second`` at each evaluation: it was read as the trainer's steps per
    second (the pace of its step where no step is timed: a review's case)."""
    assert read_rate(name) == ""


@pytest.mark.parametrize(("name", "meaning"), [
    ("profile/a2a", "comm_wait"), ("moe/a2a_ms", "comm_wait"), ("time/a2a_dispatch", "comm_wait"),
    ("a2a_loss", ""), ("train/a2a_acc", ""),
])
def test_a2a_is_the_all_to_all_of_a_mixture_of_experts(name: str, meaning: str) -> None:
    """A new user's MoE loop timed ``profile/a2a`` (46 % of its step, unread: unexplained-idle)."""
    reading = read_name(name)
    assert reading.meaning == meaning and reading.duration == bool(meaning), reading


@pytest.mark.parametrize(("name", "meaning"), [
    ("backward_compute_comm_overlap_time", "comm_overlap"), ("perf/allreduce_overlap_ms", "comm_overlap"),
    ("comm/overlapped_ms", "comm_overlap"), ("non_overlapped_comm_ms", "comm_wait"), ("exposed_comm_ms", "comm_wait"),
    ("comm/exposed_overlap_ms", "comm_wait"), ("train/overlap_time", ""), ("overlap_ratio", ""),
    ("comm_time_without_overlap", "comm_wait"), ("comm_wo_overlap_ms", "comm_wait"),
    ("allreduce_minus_overlap_ms", "comm_wait"), ("comm_beyond_overlap_ms", "comm_wait"),
    ("comm_outside_overlap_ms", "comm_wait"), ("comm_excluding_overlap_ms", "comm_wait"),
    ("allreduce_non_blocking_ms", "comm_wait"),
])
def test_a_communication_overlap_is_read_apart_from_the_wait(name: str, meaning: str) -> None:
    """The part of a collective's time spent under the compute (``comm_overlap``) is taken off the
    wait by the insight; read as the wait itself it counted the overlap as waited. A name that says
    what lies outside the overlap is the wait (a review's cases)."""
    reading = read_name(name)
    assert reading.meaning == meaning, reading


@pytest.mark.parametrize(("name", "meaning"), [
    ("backward_comm_time_end", ""), ("forward_compute_time_start", ""), ("train/step_time_begin", ""),
    ("time_metrics/end_to_end(s)", "step"), ("time/epoch_end", ""), ("data_time", "data_wait"),
    ("backward_comm_time_end_ms", ""), ("comm_end_time", ""), ("step_time_end_s", ""), ("step_end_time", ""),
    ("train/step_time/end", ""), ("end_to_end_time", "step"), ("on_train_batch_end_time", "step"),
])
def test_a_moment_after_a_duration_word_is_no_duration(name: str, meaning: str) -> None:
    """torch DDP's logging data holds the moments its timers began and ended (nanoseconds since the
    epoch): ``backward_comm_time_end`` was read as the communication wait."""
    assert read_name(name).meaning == meaning, read_name(name)


def test_a_misspelt_collective_beside_overlap_is_read_as_meant_and_said() -> None:
    """The overlap's word joined to the hit hid a misspelling from its lowered certainty."""
    reading = read_name("allreudce_overlap_ms")
    assert reading.meaning == "comm_overlap" and reading.certainty < 1.0 and "read as" in reading.why, reading


@pytest.mark.timeout(30)
def test_segments_are_found_in_one_scan_of_any_name() -> None:
    """A long run of separators before a closing bracket: a bracket lookahead after each run
    rescanned the rest of the name from every position of the run (cubic: 4,000 separators took
    35 s); one scan takes microseconds."""
    assert split_segments("/" * 20_000 + ")") == ["", ")"]
    assert split_segments("TRAIN/LoadDataTime(secs/batch)") == ["TRAIN", "LoadDataTime(secs/batch)"]
    assert split_segments("a(b/c") == ["a(b", "c"]  # an unclosed bracket is no bracket
    assert read_name("." * 20_000 + "]").meaning == ""


def test_the_no_false_health_advice_asks_only_for_what_is_not_timed() -> None:
    """A probe's trainer timing its data wait and its iteration was told to "time the data wait,
    collectives and forward/backward"; it is asked for what it does not send."""
    name, detail = _verdict_of({"timers/data": 0.01, "timers/iter": 0.1})
    assert name == "unexplained-idle" and "time the collectives and forward/backward" in detail, detail
    assert "time the data wait" not in detail, detail
    name, detail = _verdict_of({"loss": 1.0, "lr": 0.1})
    assert "time the data wait, the collectives and forward/backward" in detail, detail


def test_a_learner_waiting_on_its_rollouts_is_input_bound() -> None:
    """A probe's RL learner (``learner/wait_rollouts_time`` 63 % of its iteration, an SGD update it
    times as ``learner/sgd_update_time``), GPU 40 % busy: input-bound, the update named as
    unattributed. Before, the wait was refused for its ``rollouts`` and the update stayed a gauge:
    unexplained-idle saying "no phase timings"."""
    name, detail = _verdict_of({"learner/wait_rollouts_time": 0.063, "learner/sgd_update_time": 0.03,
                                "learner/iteration_time": 0.1})
    assert name == "input-bound" and "learner/wait_rollouts_time" in detail, detail
    assert "learner/sgd_update_time" in detail, detail
