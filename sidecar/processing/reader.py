"""The name reader: what a series name says, read as a person reads it, for names no rule or
preset knows.

A person who reads ``timing/data_s``, ``perf/data_time_ms``, ``Train/Samples/elapsed_time_ms_forward``
or ``batch_time`` knows at once that each is a duration, in which unit, and which part of the
training step it times. ``read_name`` does the same in four moves, once per new series (the
mapping stage caches its answer; bench/RESULTS_NAMES.md has the cost):

1. **Split** the name into segments (``model.names.split_segments``: ``/``, ``.``, ``:``, ``|``...) and
   each segment into words (``_``, ``-``, spaces, brackets, camelCase, letters/digits; ``h2d`` and
   ``p50`` stay one word; phase and duration words glued together are split: ``iotime``, ``dataload``):
   ``Train/Samples/elapsed_time_ms_forward`` -> ``[train] [samples] [elapsed time ms forward]``.
   The last segment is the name proper; the others are its namespace (``train/``, ``timing/``).
2. **Refuse what is no phase of the step** (``NOT_A_PHASE``): words anywhere that put the key
   outside the training step (``eval``, ``val``, ``checkpoint``, ``memory``, ``eta``, ``epoch``...),
   and in the name proper the words of a count or a rate (``iterations``, ``samples``,
   ``fps``, ``per_sec``, ``/s``) or of a statistic of many steps (``total``, ``max``, ``p50``).
3. **Find the duration**: a time unit at the end (``_ms``, ``(s)``) or inside the name beside a
   duration word (``elapsed_time_ms_forward``, ``sec_per_iter``; ``ms_ssim`` is no duration), else a
   duration word (``time``, ``duration``,
   ``latency``, ``elapsed``, ``wait``) in the name proper, else a namespace that holds durations
   (``timing/``, ``time/``, ``timers/``). A name without one is no timing, whatever it names.
4. **Find the phase** from ``PHASE_WORDS`` (the documented vocabulary, docs/METRICS.md), in the
   name proper first, then in its namespace: collectives win over the phase they sit in
   (``backward_allreduce`` is communication), forward and backward together are
   ``forward_backward``, an optimizer word makes ``step`` the optimizer step, gradients applied are
   the optimizer step and gradients computed the forward and backward (``GRAD_VERBS``). A duration
   of no phase word is the step, uncertain, when it is bare (``_bare_duration``: ``dt``,
   ``time_diff``, ``gpu_etime_ms``). Words after ``including``/``excluding`` (``SPAN_WORDS``) say
   what the duration spans, not what it times: the phase is read before them.

What the reader cannot decide from the name alone it says: ``Reading.ambiguous`` names the
other meaning (``iter_time`` is the whole step in detectron2 and the data wait in ESPnet;
``train/time`` is seconds since the start in some loggers), and ``Reading.certainty`` is lower.
A name whose last word is ``step`` next to ``forward``/``backward`` of the same prefix reads as
the optimizer step in that context (DeepSpeed's ``elapsed_time_ms_step``): ``Reading.sibling``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from sidecar.model.meanings import (
    COLLECTIVES,
    EXPOSED_WORDS,
    NEGATIONS,
    OVERLAP_OF,
    OVERLAP_WORDS,
    PHASES,
    said_exposed,
)
from sidecar.model.names import phrases, split_segments
from sidecar.processing.units import SECONDS, Unit

_WORDS = re.compile(r"[A-Z]{2,}s(?![a-z])|[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|µs")

_PER_TIME = re.compile(r"(?i)([a-z]+)(?:[\s_]*(?:per|/)[\s_]*)(?:per[\s_]*)?"
                       r"(?:s|sec|secs|second|seconds)(?:$|[_\s/()\[\]]|per)"
                       r"(?![\s_]*per[\s_]*(?:step|steps|it|iter|iters|iteration|iterations|batch|batches)(?![a-z]))")
"""A rate: what is counted, then ``per`` or ``/`` and seconds (``tokens_per_sec``, ``samples/s``,
``it/s``): the one grammar of a rate, for ``read_rate`` and for telling a rate from a duration.
Seconds followed by ``per`` and a step are a time per step, no rate (``throughput/sec_per_step``;
``samples_per_sec_per_gpu`` is a rate)."""

TIME_UNITS: dict[str, float] = {
    "ns": 1e-9, "nanoseconds": 1e-9, "us": 1e-6, "µs": 1e-6, "usec": 1e-6, "microseconds": 1e-6,
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3, "millis": 1e-3, "milliseconds": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "mins": 60.0, "minute": 60.0, "minutes": 60.0, "hours": 3600.0,
}
"""Words that are a time unit wherever they stand in the name (seconds per unit). ``min`` (a
minimum as often as minutes) and ``h`` are units only at the end of a name."""
END_UNITS: dict[str, float] = {"min": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0}

DURATION_WORDS = frozenset({"time", "times", "timing", "timings", "duration", "durations", "latency", "elapsed",
                            "took", "wait", "waiting", "waited", "dt", "delay", "stall", "stalled", "blocked", "timer",
                            "timers", "starvation", "starved", "starving", "cost", "costs", "elapse", "spent",
                            "etime"})
"""Words that make the name proper a duration when no unit is written (then read in seconds:
``time.time()`` and ``perf_counter()`` differences, what Python code logs); so does a leading ``t``
before another word (``t_data``, ``t_fwd``: a script's timer variables). ``etime`` is an elapsed
time (``gpu_etime_ms``); ``dt`` a time difference, alone or leading (``dt_data``, ``dt_net``).
``dur`` is none: in speech code it is an utterance's length or a duration predictor's loss
(``tr/dur``, ``data_dur``, ``batch_dur``), not a timer's."""
DURATION_NAMESPACES = frozenset({"time", "times", "timing", "timings", "timer", "timers", "durations", "runtime",
                                 "latency", "latencies", "profile", "profiling", "perf_time", "timeperf", "timeit",
                                 "time_perf", "perf_timing"})
"""Namespace segments whose keys are durations (``timing/data_s``, ``time/data``)."""

WEIGHTS = frozenset({"weight", "weights", "param", "params", "parameter", "parameters"})
GRADS = frozenset({"grad", "grads", "gradient", "gradients"})
PARALLEL = frozenset({"model", "ddp", "fsdp", "dp", "zero"})
COMM_VERBS: dict[str, frozenset[str]] = {
    "sync": WEIGHTS | GRADS | PARALLEL, "synch": WEIGHTS | GRADS | PARALLEL,
    "synchronize": WEIGHTS | GRADS | PARALLEL, "reduce": GRADS, "gather": WEIGHTS, "prefetch": WEIGHTS,
    "update": WEIGHTS, "push": WEIGHTS, "pull": WEIGHTS, "transfer": WEIGHTS, "broadcast": WEIGHTS,
}
"""A verb of moving tensors between processes -> the things it moves: either order beside each other
(``grad_sync``, ``sync_weights``, ``reduce_gradients``, ``param_prefetch``) names communication.
``update`` moves weights only (``update_weights``: new weights pushed to an inference engine); a
model's or a gradient's update is the learner's own step."""
GRAD_VERBS: dict[str, tuple[str, frozenset[str]]] = {
    "apply": ("optimizer", GRADS), "compute": ("forward_backward", GRADS), "calc": ("forward_backward", GRADS),
    "calculate": ("forward_backward", GRADS),
}
"""A verb of a gradient -> (the phase it names, the gradient's words), either order beside each other:
gradients applied are the optimizer step (``apply_grad``, TensorFlow's and RLlib's
``apply_gradients``), gradients computed are the forward and the backward that make them
(``compute_grads``: the loss, then its backward); a gradient alone is the backward."""


def _pairs(verbs: dict[str, frozenset[str]]) -> frozenset[str]:
    """``verb_object`` and ``object_verb`` for every verb and object of ``verbs``."""
    return frozenset(p for verb, objects in verbs.items() for o in objects for p in (f"{verb}_{o}", f"{o}_{verb}"))


def _grad_pairs(phase: str) -> frozenset[str]:
    """The ``GRAD_VERBS`` pairs that name ``phase`` (``apply_grads``, ``grads_compute``)."""
    return _pairs({verb: objects for verb, (named, objects) in GRAD_VERBS.items() if named == phase})


DATA_VERBS: dict[str, frozenset[str]] = {"sample": frozenset({"batch", "buffer", "replay", "rb"}),
                                         "get": frozenset({"batch", "batches"}),
                                         "getting": frozenset({"batch", "batches"})}
"""A verb of drawing the next batch -> where it draws from, either order beside each other
(``sample_batch``, ``rb_sample``, ``sample_replay_buffer``, ``Time/Batch getting``): the data wait
of off-policy RL and of samplers. ``sample`` alone is no phase (a policy's action, a generated
text), nor is ``get``."""

ROLLOUTS = frozenset({"rollout", "rollouts"})
DATA_FIRST = frozenset({"wait_for_batch", "get_batch", "next_batch", "batch_gen", "batch_generator",
                        "batch_generation"}) | frozenset(
    p for w in ("wait", "waiting", "waited", "blocked") for r in ROLLOUTS
    for p in (f"{w}_{r}", f"{r}_{w}", f"{w}_for_{r}", f"{w}_on_{r}"))
"""Words that say the trainer waits for its next batch even where another word would put the key
outside the step (``stats/rollout_queue_get_time``: a learner blocked on its rollouts' queue;
``learner/wait_rollouts_time``, ``rollout_wait_s``: the same wait; ``time/batch_gen``: Megatron's
batch generator, no text generation)."""

PHASE_WORDS: dict[str, frozenset[str]] = {
    "comm_wait": frozenset({"comm", "comms", "communication", "nccl", "collective", "collectives", "barrier",
                            "allreduce_wait", "p2p", "gather", "scatter", "data_parallel_sync", "bubble",
                            "data_dist", "input_dist", "output_dist"})
                 | frozenset().union(*COLLECTIVES.values()) | _pairs(COMM_VERBS),
    "queue_put_wait": frozenset({"put_wait", "queue_put", "put_blocked", "enqueue_wait"}),
    "queue_wait": frozenset({"queue_get", "queue_wait", "get_wait", "queue_empty", "dequeue_wait"}),
    "data_wait": frozenset({"data", "dataloader", "dataloading", "data_loader", "data_loading", "loader", "loading",
                            "load", "fetch", "fetching", "input", "inputs", "io", "next_batch", "get_batch",
                            "batch_load", "batch_loading", "batch_wait", "batch_generator", "dataset", "prefetch",
                            "sampler", "dequeue", "dl", "reader", "reading", "wait_for_batch", "inter_step",
                            "inter_batch", "between_steps", "between_iterations", "between_iters", "between_batches",
                            "get_next"})
                 | DATA_FIRST | _pairs(DATA_VERBS),
    "forward_backward": frozenset({"forward_backward", "fwd_bwd", "fwdbwd", "fb", "fwd_bwd_step"})
                        | _grad_pairs("forward_backward"),
    "forward": frozenset({"forward", "fwd", "fw", "fprop", "forward_pass", "logprobs", "logprob", "logp", "logits"}),
    "backward": frozenset({"backward", "bwd", "bw", "bprop", "backprop", "backward_pass", "grad", "grads",
                           "gradient", "gradients"}),
    "optimizer": frozenset({"optimizer", "optim", "opt", "optimize", "optimization", "optimizer_step", "opt_step",
                            "optim_step", "gradstep",
                            "grad_step", "adam", "adamw", "sgd", "zero_grad"})
                 | _grad_pairs("optimizer"),
    "step": frozenset({"step", "iter", "iteration", "it", "batch", "train_step", "step_time", "e2e",
                       "end_to_end", "cycle", "train_iter", "minibatch", "mini_batch", "loop", "interval"}),
}
"""Phase -> the words (one word, or two joined by ``_``) that name it, tried in this order when a
name holds words of several (``backward_allreduce``: communication, the part of the backward
that waits; ``data`` beside ``step``: the data wait of a step; a queue's get or put: the DFlash
hidden-state queue's meanings; ``sparse_data_dist``: torchrec's input distribution, an all-to-all of
the sparse features, before the data). docs/METRICS.md prints it."""

EVAL_WORDS = frozenset({"eval", "evaluate", "val", "valid", "validate", "test", "inference", "predict", "evaluator",
                        "validator"})
"""Words of a model's evaluation: outside the training step even where a trainer waits for a batch."""
NOT_A_PHASE = EVAL_WORDS | frozenset({
    "eta", "remaining", "left", "since", "after", "before", "uptime", "wallclock", "timestamp", "date", "clock",
    "start", "begin", "stop", "stopped", "checkpoint", "checkpointer", "ckpt", "save", "saver", "export", "warmup",
    "setup", "init", "initialize", "model_load", "load_model", "loading_model", "weights_load", "load_weights",
    "load_checkpoint", "startup", "compile", "compilation", "iowait", "log", "logging", "print", "store", "memory",
    "mem", "gpu_mem", "allocated", "reserved", "flops", "tflops", "mfu", "lr", "acc", "accuracy", "norm", "reward",
    "rollout", "generate", "gen", "collect", "collector", "sampling", "env", "environment", "episode", "total_time",
    "time_total", "time_elapsed", "total_elapsed", "wall_time", "walltime", "elapsed_total", "train_runtime",
})
"""Words, anywhere in the name and in any of their forms (``lemmas``: ``prediction``, ``checkpoints``,
``evaluating``), that put a key outside one training step: evaluation, checkpoints, time since the
start or to the end, a moment (``step_start_time``) rather than a duration, what runs before or after a
step (``time/after_train_iter``: a hook), memory, throughput, RL
rollouts, their collection and generation, model quality; and what does those (an ``evaluator``'s or an
RL ``collector``'s own step; not ``generator``, a GAN's trained model, nor ``loader`` or ``sampler``).
docs/METRICS.md prints it."""
EPOCHS = frozenset({"epoch", "epochs"})
NAME_NOT_A_PHASE = frozenset({"throughput", "speed", "runtime", "perf", "performance"}) | EPOCHS
"""Words that put a key outside the step in the name proper only: as a namespace they hold durations
too (``speed/data_load_time``, ``runtime/iteration_time``, ``TrainEpochStats/avg_loader_time``); a
duration of no phase word under an epoch's namespace is the epoch's (``epoch/wall_seconds``)."""
SPACE_NOT_A_PHASE = frozenset({"final"})
"""Words that put a key outside the step as a namespace segment of their own: a run's final figures,
written once when it ends (``final/sync_wait_other_seconds``); in the name proper or a segment of
more words ``final`` is as often a model's last layer or stage (``final_layer_time``,
``final_stage/forward_ms``)."""
SOFT_NOT_A_PHASE = frozenset({"loss"})
"""Words that put a key outside the step only where no phase word stands beside them: ``loss`` is
the model's quality, ``loss_backward_time`` the backward."""
COMPONENTS = frozenset({"layer", "layers", "block", "blocks", "module", "modules", "expert", "experts", "head",
                        "heads", "op", "ops", "kernel", "kernels", "clip", "clipping", "layernorm", "embeds",
                        "embedding", "embeddings", "attn", "attention", "mlp", "router", "load_balance",
                        "load_balancing"})
"""Words that make a duration one component's part of a phase (``layer.3.forward_ms``), not the
phase: the step's forward is not layer 3's."""
SPACE_MODELS = frozenset({"clip"})
"""``COMPONENTS`` that, as a namespace, name the model trained (``clip.img_encoder_fwd_s``: a CLIP
model's), not a part of its step; in the name proper a gradient's clipping (``clip_grad_time``)."""
ITEMS: dict[str, frozenset[str]] = {
    "tokens": frozenset({"token", "tokens", "tok", "toks", "tks"}),
    "samples": frozenset({"sample", "samples", "example", "examples", "image", "images", "img", "imgs", "sequence",
                          "sequences", "seq", "seqs", "sentence", "sentences", "item", "items"}),
    "frames": frozenset({"frame", "frames"}),
    "steps": frozenset({"step", "steps", "it", "its", "iter", "iters", "iteration", "iterations", "batch",
                        "batches", "timestep", "timesteps"}),
}
"""What a trainer counts -> the words that name it, declared once for the four rules below: a
count in a name, a rate, a cost per item and an axis. ``frames`` are an environment's (RL), no
training throughput."""
_PLURALS = frozenset(w for ws in ITEMS.values() for w in ws if w.endswith("s") and w != "its")
_DATA_ITEMS = ITEMS["tokens"] | ITEMS["samples"] | ITEMS["frames"]

NOT_A_DURATION = _PLURALS | frozenset({
    "num", "count", "counts", "n", "size", "len", "length", "number", "idx", "index", "id", "fps", "sps", "tps",
    "ips", "qps", "rate", "per_sec", "per_second", "per_s", "ratio", "pct", "percent", "frac", "fraction",
    "share", "util", "utilization",
})
"""Words that, in a name proper with no time unit written, make it a count, a rate or a share
(``time/iterations``, ``samples_per_sec``, ``data_ratio``): the plural of anything counted
(``ITEMS``) and these."""
FLAGS = frozenset({"flag", "flags", "indicator"})
"""The last word of a name that makes it a flag, no duration (``perf/data_stall_flag``: 1 when the
data wait is over half the step); before a duration word it is what is timed (``flag_broadcast_time``)."""
MOMENTS = frozenset({"start", "end", "begin", "stop", "started", "ended", "stopped", "finish", "finished"})
"""Beside a duration word, last (a time unit after them aside): a moment, no duration (torch DDP's
``backward_comm_time_end``, nanoseconds since the epoch beside ``backward_comm_time``;
``step_end_time``; ``step_time/end``), unless the name spans from one to another (``end_to_end``)
or times a hook (``on_train_batch_end_time``)."""
_MOMENT_UNITS = TIME_UNITS.keys() | END_UNITS.keys()
_MOMENT_BESIDE = DURATION_WORDS | TIME_UNITS.keys()
PER_ITEM = _DATA_ITEMS
"""After ``per``, words that make a duration a cost per item (``timing_per_token_ms``), not a
phase of the step."""
AXIS_NAMESPACES = _DATA_ITEMS & _PLURALS
"""A namespace segment that names what a logger's x-axis counts (DeepSpeed's ``Train/Samples/``)."""
STATISTICS = frozenset({"total", "cumulative", "sum", "max", "min", "std", "var", "stddev", "stdev", "p10", "p25",
                        "p50", "p75", "p90", "p95", "p99", "median", "minimum", "maximum", "diff", "difference",
                        "delta", "first"})
"""Words that make a duration a statistic over many steps, not one step's phase
(``data_time_max_ms``, ``total_data_time``): read as a duration of no phase; ``total`` beside a
word of one step is that step's whole (``total_step_time``: ``ONE_STEP``). A difference right
after a duration word (``INTERVAL``) is a timer's last interval, no statistic."""
INTERVAL = frozenset({"diff", "difference", "delta"})
"""After a duration word, a timer's last interval (pycls's ``time_diff``: its toc minus its tic),
one step's duration like ``dt``; elsewhere a statistic (``STATISTICS``)."""

HOST_PREP = frozenset({"preprocess", "preprocessing", "processing", "process_batch", "process_data",
                       "process_input", "process_inputs", "prep", "prepare", "preparation",
                       "tokenize", "tokenization", "collate", "h2d", "d2h", "to_device", "transfer", "copy", "memcpy",
                       "convert", "conversion", "converting", "cast", "augment", "augmentation", "transform",
                       "transforms"})
"""Host-side batch preparation and copies: a part of the step, never the data loader's wait."""
OTHER_PARTS = frozenset({"update", "updates", "priority", "priorities", "ema", "scheduler", "sched", "unscale",
                         "lr_scheduler", "scaler", "swa", "server", "servers", "shutdown", "launch", "restart",
                         "offload", "onload", "wake", "wakeup", "sleep", "resume", "cleanup", "teardown", "gc",
                         "empty_cache", "other", "others", "misc", "unaccounted", "unattributed", "remainder",
                         "residual", "untracked"}) | HOST_PREP
"""Words of a part of the step the insight has no phase for: a learner's whole ``update`` (its
forward, backward and optimizer steps over mini-batches: ``timing_s/update_actor``,
``time/update``; in no corpus key is ``update`` the optimizer step alone, and beside ``weights`` it
is the push of new weights to an inference engine: communication), host-side batch preparation
(``data_preprocess_time``, ``input_prep_time``), an EMA or replay-priority update, a loss scaler's
unscale inside the optimizer step (``optimizer-unscale-and-check-inf-time``), an inference
server's life (``step_stop_server``, ``offload``), housekeeping (``cleanup_minibatch``, ``gc``,
``empty_cache``), what is left when the timed phases are taken out (``time/unaccounted_step_s``,
``timer_other``, ``train_misc_time``). A name with one of these and no stronger phase
word reads as no phase (its time unattributed, never a wait); ``processing`` right after a step
word is the step itself (``Batch_processing_time_ms``), processing a batch or data before it their
preparation (``Train_Process_Batch``); a process alone is an OS process (``step_time/process_0``)."""

AMBIGUOUS: dict[tuple[str, ...], tuple[str, str]] = {
    ("iter", "time"): ("data_wait", "ESPnet's iter_time is the wait for the next batch; elsewhere the whole step"),
    ("time",): ("", "a bare time is the step in some loggers and seconds since the start in others"),
    ("train", "time"): ("", "train/time is the iteration time in some loggers, seconds since the start in others"),
    ("batch",): ("", "a bare batch under time/ counts batches in composer; elsewhere it is the batch time"),
}
"""Names whose words mean different things in different codebases: (the other meaning, why)."""

BARE_STEP = frozenset({"duration", "latency", "dt", "seconds", "secs", "sec"})
"""A name proper that is only one of these words: a duration that names no phase, most often the
whole step's (levanter's ``throughput/duration``, tacotron2's ``duration``); read as the step at the
ambiguous certainty. So is a timer's last interval (``time_diff``: ``INTERVAL``) and the time of
the device or the network that runs the step (``DEVICE_WORDS``)."""
DEVICE_WORDS = frozenset({"gpu", "cuda", "net", "compute"})
"""Words of what runs the step's work: with words of elapsed time and nothing else (``DEVICE_TIMES``:
``gpu_etime_ms``, ``gpu-time(ms)``, SlowFast's ``dt_net``, ``compute_time``), the time of that work,
the step (its compute, data excluded or not: uncertain). A compute time is one step's forward,
backward and optimizer in three trainers of the corpus (DeepLearningExamples, a JAX loop, an
Accelerate loop) and their sum over a log interval in one (fairseq2's ``Compute Time``): the
daemon's numbers settle a sum logged rarely (``sidecar.aggregation.clocks``). ``network`` is no
such word: a network's latency is a round trip (an actor's call to its learner, an RPC), no step."""
DEVICE_TIMES = frozenset({"time", "times", "etime", "dt", "elapsed"})
"""The duration words that read a device's time (``DEVICE_WORDS``): a latency, a delay or a wait of
a device or the network (``gpu_latency``, ``net_delay``) is no step."""

MEANS = frozenset({"avg", "average", "mean", "averaged"})
"""With one of ``MEAN_OF`` and nothing else (``avg_time``, ``time_avg``, ``mean_duration``): the mean
of a time over many events, the step's if nothing else (uncertain). A bare ``time`` may be the
seconds since the start; a mean of it never is."""
MEAN_OF = frozenset({"time", "duration", "dt"})

WAIT_WORDS = frozenset({"wait", "waiting", "waited", "blocked", "stall", "stalled", "starvation", "starved",
                        "starving"})
"""A duration word that says the trainer waited; with no phase word, for its input (uncertain)."""

AMBIGUOUS_CERTAINTY = 0.5
"""A read's certainty (0-1) where the name alone cannot decide (``AMBIGUOUS``); 1 otherwise."""

SIBLING_WORDS: dict[str, str] = {"step": "optimizer", "render": "forward", "rendering": "forward",
                                 "rasterize": "forward", "rasterization": "forward", "unet": "forward"}
"""The last word of a name that means a phase beside its siblings (``sidecar.aggregation.parts``):
``X_step`` next to ``X_forward`` and ``X_backward`` (the same prefix) is the optimizer step
(DeepSpeed's timers), alone the step; a render next to a backward is a differentiable renderer's
forward (Gaussian splatting, NeRF: ``time/render [ms]`` beside ``time/backward [ms]``, in three
trainers of the corpus), alone no phase (an environment's render, a picture drawn for the log); so
is a diffusion trainer's UNet beside a backward (``time/unet_time`` beside ``time/backward_time``),
alone no phase (a frozen UNet's, a sampler's)."""

SPAN_WORDS = frozenset({"including", "incl", "excluding", "excl"})
"""Words after which a name says what its duration spans or leaves out, not what it times (``Time
per iteration including communication`` is the iteration's time): the phase is read from the words
before the first of them; a key outside the step is refused by all its words."""
GLUABLE = (frozenset(w for ws in PHASE_WORDS.values() for w in ws if w.isalpha() and len(w) >= 2)
           | DURATION_WORDS | COMM_VERBS.keys() | GRAD_VERBS.keys() | DATA_VERBS.keys() | WEIGHTS | GRADS)
"""Words that may stand glued to each other in one word, read as the words they are (``iotime``,
``dataload``, ``gradsync``, ``fwdbwdtime``): a word the reader does not know (``_KNOWN``) that is
wholly two or more of these is split into them; ``runtime``, ``uptime``, ``walltime`` and
``timestep`` are not (``run``, ``up``, ``wall`` are no such words; ``timestep`` is known)."""
_KNOWN = frozenset().union(
    *PHASE_WORDS.values(), DURATION_WORDS, DURATION_NAMESPACES, NOT_A_PHASE, NAME_NOT_A_PHASE,
    SPACE_NOT_A_PHASE, SOFT_NOT_A_PHASE, COMPONENTS, *ITEMS.values(), NOT_A_DURATION, STATISTICS, OTHER_PARTS,
    TIME_UNITS, END_UNITS, BARE_STEP, DEVICE_WORDS, WAIT_WORDS, SPAN_WORDS)
"""Every word of the reader's lists: a word it knows is never split (``timestep``, ``dataset``)."""
_GLUE_ENDS = (frozenset(w[:2] for w in GLUABLE), frozenset(w[-2:] for w in GLUABLE))
"""The first and the last two letters of the ``GLUABLE`` words: most words begin or end otherwise and
are never walked (two set lookups each)."""
_MAX_GLUED = 32
"""Letters of the longest word the reader tries to split (a bound on its work for any name)."""


def _slips(word: str) -> set[str]:
    """``word`` with one slip of the fingers: two neighbouring letters swapped, or one letter inside
    it left out (not its first or last: a word cut short is an abbreviation, no slip)."""
    swapped = {word[:i] + word[i + 1] + word[i] + word[i + 2:] for i in range(len(word) - 1)}
    return (swapped | {word[:i] + word[i + 1:] for i in range(1, len(word) - 1)}) - {word}


_SLIPPED = [(slip, w) for w in sorted(frozenset().union(*PHASE_WORDS.values(), DURATION_WORDS))
            if w.isalpha() and len(w) >= 7 and not w.endswith(("ed", "ing")) for slip in _slips(w)]
_SLIP_FROM = Counter(slip for slip, _ in _SLIPPED)
MISSPELT: dict[str, str] = {slip: w for slip, w in _SLIPPED if slip not in _KNOWN and _SLIP_FROM[slip] == 1}
"""A phase or duration word of seven letters or more misspelt by one slip (two neighbouring letters
swapped, one left out: FixMatch's ``prefecth_time``, ``foward``, ``optimzer``) -> the word, read as
it. Shorter words are not guessed at (``sample`` is a slip from ``simple``), nor the forms ending in
``ed`` or ``ing`` (``stared`` is a slip from ``starved``, ``lading`` from ``loading``); a slip that is
a word the reader knows, or a slip from two words, is no misspelling. A phase read from a slip is
read with the certainty lowered, and says so (``'prefecth' read as 'prefetch'``): ``interal`` is a
slip from ``interval`` and from ``internal``, which the reader does not know."""
MISSPELT_WORDS = frozenset(MISSPELT.values())


def counts_items(name: str) -> bool:
    """Whether ``name``'s namespace says its logger's step counts items (``AXIS_NAMESPACES``):
    ``Train/Samples/lr``, not a rate of them (``samples/s``, ``tokens/sec/gpu``)."""
    segs = segments(name)
    if len(segs) < 2 or read_rate(name) or any(seg[0] in TIME_UNITS or "per" in seg for seg in segs[1:]):
        return False  # samples/s, tokens/per_sec, tokens/sec/gpu: a rate
    return any(len(seg) == 1 and seg[0] in AXIS_NAMESPACES for seg in segs[:-1])


@dataclass(frozen=True, slots=True)
class Reading:
    """What ``read_name`` made of a name. ``meaning``: a phase (``sidecar.model.meanings``) or
    ``""`` (a duration of no phase, or no duration); ``unit``: the time unit read (``Unit.base``
    ``seconds``; ``Unit(name)`` when the name is no duration); ``why``: the words that decided, for
    ``explain``; ``certainty`` 0-1; ``ambiguous``: the other meaning's explanation, ``""`` if none;
    ``sibling``: the meaning the name takes beside phases of the same prefix (``SIBLING_WORDS``);
    ``outside``: the name says the key is no part of a training step (eval, checkpoint, since the
    start, a statistic of many steps). ``unit`` is a time unit only where one is written or a
    phase is read, or a duration word names no phase (seconds where no unit is written: a timing
    of no phase, its time unattributed); a key outside the step (``time_elapsed``) stays a gauge."""

    meaning: str
    unit: Unit
    why: str
    certainty: float = 1.0
    ambiguous: str = ""
    sibling: str = ""
    outside: bool = False

    @property
    def duration(self) -> bool:
        return self.unit.base == SECONDS


def words(text: str) -> list[str]:
    """The lower-case words of one segment: ``dataTime_ms`` -> ``['data', 'time', 'ms']``; ``log``
    before ``probs``, ``prob`` or ``p`` is one word (``log_probs`` is a forward pass, not logging);
    words glued together are split (``iotime`` -> ``['io', 'time']``: ``GLUABLE``), a misspelt
    word is read as meant (``prefecth`` -> ``['prefetch']``: ``MISSPELT``)."""
    out = [w.lower() for w in _WORDS.findall(text)]
    heads, tails = _GLUE_ENDS
    unknown = set(out).difference(_KNOWN)
    glued = {w: [MISSPELT[w]] for w in unknown if w in MISSPELT}
    glued.update((w, parts) for w in unknown.difference(glued)
                 if w[:2] in heads and w[-2:] in tails and (parts := _unglue(w)))
    if glued:
        out = [p for w in out for p in glued.get(w, (w,))]  # dataload, iotime, prefecth: split or mended
    for i in range(len(out) - 1, 0, -1):
        if out[i - 1] == "log" and out[i] in ("probs", "prob", "p"):
            out[i - 1:i + 1] = ["log" + out[i]]
        elif (out[i].isdigit() and i + 1 < len(out) and out[i + 1].isalpha() and len(out[i + 1]) <= 3
              and out[i - 1].isalpha() and len(out[i - 1]) <= 3):
            out[i - 1:i + 2] = [out[i - 1] + out[i] + out[i + 1]]  # h2d, d2h, all2all, p2p: one word
        elif out[i].isdigit() and out[i - 1] == "p":
            out[i - 1:i + 1] = ["p" + out[i]]  # p50, p99: a percentile
    return out


def _unglue(word: str) -> list[str]:
    """``word`` as the ``GLUABLE`` words it is glued from (``dataload`` -> ``['data', 'load']``),
    ``[]`` where it is not wholly made of two or more of them. The first (shortest) head wins. A
    piece of two letters stands only before a duration word (``iotime``, ``dttime``): ``commit`` is
    no ``comm it``, ``gradio`` no ``grad io``."""
    if not 4 <= len(word) <= _MAX_GLUED:
        return []
    for cut in range(2, len(word) - 1):
        head, tail = word[:cut], word[cut:]
        if head in GLUABLE:
            rest = [tail] if tail in GLUABLE and len(tail) > 2 else _unglue(tail)  # a split tail checked its own
            if rest and (len(head) > 2 or rest[0] in DURATION_WORDS):
                return [head, *rest]
    return []


def segments(name: str) -> list[list[str]]:
    """The name's segments, each as its words (empty segments dropped)."""
    return [ws for seg in split_segments(name) if (ws := words(seg))]


def stem(name: str) -> str:
    """The name's words without time units, joined by ``_``: ``Train/Samples/elapsed_time_ms_backward``
    -> ``train_samples_elapsed_time_backward`` (a phase's parts extend its stem)."""
    return "_".join(w for seg in segments(name) for w in seg if w not in TIME_UNITS and w not in DURATION_WORDS)


_SUFFIXES = ("ations", "ation", "ions", "ion", "ings", "ing", "es", "s", "ed")
_SUFFIX_ENDS = frozenset(suffix[-1] for suffix in _SUFFIXES)


def lemmas(ws: set[str]) -> set[str]:
    """``ws`` with the bases their endings may hide (``prediction`` -> ``predict``, ``evaluating`` ->
    ``evaluate``, ``checkpoints`` -> ``checkpoint``): candidates only, for looking words up in a
    list of base words, never to read a phase (``steps`` counts, ``step`` is a phase)."""
    out = set(ws)
    for w in ws:
        if len(w) < 4 or w[-1] not in _SUFFIX_ENDS:
            continue  # most words: no ending to take off (one compare, not nine)
        for suffix in _SUFFIXES:
            if w.endswith(suffix) and len(base := w[:-len(suffix)]) >= 3:
                out.update((base, base + "e") + ((base + "ate",) if suffix.startswith("ation") else ()))
    return out


def _vocab(ws: list[str]) -> set[str]:
    """The words and the joined neighbour pairs and triples of ``ws`` (``all_reduce``, ``fwd_bwd_step``),
    and ``between`` joined to the word after next (``time_between_train_steps``: ``between_steps``)."""
    out = phrases(ws)
    out.update(f"between_{c}" for a, b, c in zip(ws, ws[1:], ws[2:], strict=False)
               if a == "between" and not _phase({b})[0])  # between train steps; between optimizer steps: no gap
    return out


def _time_unit(name: str, proper: list[str]) -> tuple[str, float] | None:
    """The time unit written in the name: (as written, seconds per unit), or None."""
    if _PER_TIME.search(name):
        return None  # a rate: samples/s, tokens_per_sec
    last = len(proper) - 1
    for i, w in enumerate(proper):
        factor = TIME_UNITS.get(w)
        if factor is None and i == last:
            factor = END_UNITS.get(w)
        if factor is None or (i > 0 and proper[i - 1].isdigit()):
            continue  # d2h, hr_10: a digit before it makes a word, not a unit
        if i > 0 and proper[i - 1] == "per":
            return None  # samples_per_s, tokens_per_second_per_gpu: a rate
        beside = set(proper[max(0, i - 1):i + 2]) - {w}
        lightning = (i == last - 1 and proper[last] in LIGHTNING_SUFFIXES
                     and name.lower().endswith(f"{w}_{proper[last]}"))  # not a ratio: throughput(ms/step)
        if i < last and not beside & (DURATION_WORDS | {"per"}) and not lightning:
            continue  # inside a name a unit stands by a duration word (time_ms_forward, sec_per_iter): ms_ssim
        return w, factor
    return None


LIGHTNING_SUFFIXES = frozenset({"step", "epoch"})
"""What Lightning's ``self.log(..., on_step=True, on_epoch=True)`` appends to a key
(``train/batch_fetch_seconds_step``): after a unit that ends the name otherwise, the unit stands."""
TOTALS = frozenset({"total", "whole", "all", "overall"})
"""A name proper that is only one of these (with duration words and units): a bare total, the
step's whole beside phases of its prefix (``time/total`` beside ``time/data`` and
``time/forward``: lgssl, gsplat, pydreamer), the run's since the start elsewhere (composer's,
klib's ``time/total``): read with the sibling rules, uncertain."""
BARE_TOTAL_VETO = frozenset({"total", "total_time", "time_total"})
"""What refuses a bare total as a statistic or a time since the start, and no more."""
TIMER_WORDS = frozenset({"timer", "timers", "timing", "timings"})
"""Words of a timer, beside which a bare total without a unit is still a timer's (``train/timer_total``)."""
ONE_STEP = frozenset({"step", "iter", "iteration", "batch", "minibatch"})
"""Words of one step, whose ``total`` is the step's whole (``step_total``); a loop's, a cycle's or an
interval's total is the run's or many steps' (``loop_total_time``)."""


WALL = frozenset({"wall", "walltime", "wallclock"})
"""Words of the wall clock: after a word of one step (``ONE_STEP``), with a unit or a duration word
(``perf/iter_wall_time``, ``step_wallclock_s``), the step's duration by the wall clock; elsewhere
(``wall_time``, ``train/walltime``, ``step_wallclock``) the time since the start (``NOT_A_PHASE``)."""


def _whole_step(proper: list[str]) -> bool:
    """Whether ``total`` stands next to a word of the step (``step_total``, ``total_step_time``,
    ``batch_total_time``): the whole of one step, all its parts. Beside a part of the step
    (``loader_total_time``) it is that part summed over many steps."""
    i = proper.index("total")
    return any(w in ONE_STEP for w in proper[max(0, i - 1):i + 2])


_STEP_NOUNS = sorted({w for w in PHASE_WORDS["step"] | ITEMS["steps"] if "_" not in w}, key=len, reverse=True)
_UNIT_WORDS = sorted(TIME_UNITS, key=len, reverse=True)
_PER_STEP = re.compile(r"(?i)(?<![a-z])(" + "|".join(_UNIT_WORDS) + r")\s*/\s*(" + "|".join(_STEP_NOUNS)
                       + r")(?![a-z0-9_])")
"""A time unit per step, written as a ratio (``ms/it``, ``train_speed(s/it)``, ``Time(secs/batch)``):
the step noun ends its word (``time_ms/batch_size`` is a size); ``min`` and ``h`` are left out
(``loss/min/step`` is a minimum)."""


def _per_step(name: str) -> tuple[str, float] | None:
    """The unit of a time per step written as a ratio (``_PER_STEP``): (as written, seconds per unit)."""
    m = _PER_STEP.search(name)
    return None if m is None else (m.group(1), TIME_UNITS[m.group(1).lower()])


RECORD_UNIT = ("ms (a timing record's)", 1e-3)
"""The unit of a ``timing()`` record whose name writes none: the protocol's milliseconds."""


def read_name(name: str, record: bool = False) -> Reading:
    """Read ``name`` (as sent, role and worker taken off). ``record``: the name of a ``timing()``
    record, a duration in milliseconds by its kind whatever its words (``timing("loader", ms)``).
    Pure and total: never raises."""
    segs = segments(name)
    if not segs:
        return Reading("", Unit(name), "no words")
    proper, namespace = segs[-1], [w for seg in segs[:-1] for w in seg]
    if len(segs) > 1 and len(proper) == 1 and proper[0] in PHASE_WORDS["step"] and segs[-2][-1] not in TIME_UNITS:
        proper, namespace = segs[-2] + proper, [w for seg in segs[:-2] for w in seg]  # optimizer.step: one phrase
    vocab, space = _vocab(proper), _vocab(namespace)
    unit = _time_unit(name, proper)
    per_step = unit is None and (unit := _per_step(name)) is not None  # ms/it, (secs/batch): a time per step
    if unit is None and record:
        unit = RECORD_UNIT
    alone = {seg.strip().lower() for seg in name.split("/")[:-1]}  # final/...: not model.final.forward
    refused = _refused(name, proper, namespace, vocab, space, unit, per_step, alone)
    if refused is not None:
        return refused
    cut = next((i for i, w in enumerate(proper) if w in SPAN_WORDS), len(proper))
    if 0 < cut < len(proper):
        proper = proper[:cut]  # time per iteration including communication: what it spans is no phase
        vocab = _vocab(proper)
    meaning, hit = _phase(vocab)
    if not meaning:
        meaning, hit = _phase(space - DURATION_NAMESPACES)
    meaning, hit = _overlap(meaning, hit, vocab)
    if not meaning or ((meaning in ("optimizer", "step", "data_wait") or hit in GRADS) and _parts(proper, vocab)):
        return _no_phase_word(name, proper, vocab, unit, meaning, set(namespace))
    why = f"'{hit}' -> {meaning}" + (f", unit {unit[0]}" if unit else ", unit not written: seconds")
    other = _ambiguity(segs)
    slip = _slip(name, hit)
    if slip:
        why, other = f"'{slip}' read as '{MISSPELT[slip]}', {why}", ("", "a misspelling, guessed")
    # DeepSpeed's elapsed_time_ms_step: a timer's step, no phase before it (not Lightning's batch_seconds_step)
    step_of_timer = (len(proper) > 1 and proper[-2] in TIME_UNITS.keys() | DURATION_WORDS
                     and not _phase(_vocab(proper[:-1]))[0])
    sibling = SIBLING_WORDS.get(proper[-1], "") if meaning == "step" and step_of_timer else ""
    if other is not None:
        return Reading(meaning, _unit(name, unit), why, AMBIGUOUS_CERTAINTY, other[1], sibling)
    return Reading(meaning, _unit(name, unit), why, 1.0, "", sibling)


_OVERLAP_INSIDE = {wait: overlap for overlap, wait in OVERLAP_OF.items()}


def _overlap(meaning: str, hit: str, vocab: set[str]) -> tuple[str, str]:
    """(``meaning``, ``hit``), or the overlap inside that wait where the words say overlap
    (``OVERLAP_WORDS``, and nothing ``said_exposed``)."""
    inside = _OVERLAP_INSIDE.get(meaning, "")
    if inside and vocab & OVERLAP_WORDS and not said_exposed(vocab):
        return inside, f"{hit}+{_first(vocab & OVERLAP_WORDS)}"
    return meaning, hit


def _slip(name: str, hit: str) -> str:
    """The misspelt word of ``name`` that ``hit`` (the phase words read) was read from, or ""."""
    parts = re.split(r"[_+]", hit)
    if not MISSPELT_WORDS.intersection(parts):
        return ""  # most names: no word of the hit is one the reader guesses from a slip
    return next((w for w in map(str.lower, _WORDS.findall(name)) if w in MISSPELT and MISSPELT[w] in parts), "")


def _refused(name: str, proper: list[str], namespace: list[str], vocab: set[str], space: set[str],
             unit: tuple[str, float] | None, per_step: bool = False, alone: set[str] | None = None) -> Reading | None:
    """The reading of a name that is no timing of a phase (a count, a rate, a statistic, a key
    outside the step, no duration at all), None where a phase may be read. A unit written per step
    (``per_step``: ``train_speed(s/it)``) makes a speed a time per step, no throughput."""
    # what a time lies between is no count (time_between_steps)
    counted = vocab & NOT_A_DURATION - {w[len("between_"):] for w in vocab if w.startswith("between_")}
    if proper[-1] in FLAGS:
        return Reading("", Unit(name), f"a flag: {proper[-1]}")
    if (moment := _moment(proper, namespace)):
        return Reading("", Unit(name), f"a moment, no duration: {moment}")
    if unit is None and (counted or (proper[-1] in ("s", "sec") and "per" in proper)):
        return Reading("", Unit(name), f"a count, rate or statistic: {_first(counted)}")
    stats = vocab & STATISTICS
    if stats & INTERVAL and _interval(proper):
        stats = stats - INTERVAL  # time_diff, dt_delta: a timer's last interval, no statistic
    anywhere = lemmas(vocab | space)
    if "total" in stats and _whole_step(proper):
        stats = stats - {"total"}  # step_total, total_step_time: the whole of the step, not a sum of many
        anywhere -= {"total_time", "time_total"}
    if (unit or vocab & DURATION_WORDS) and any(a in ONE_STEP and b in WALL for a, b in zip(proper, proper[1:],
                                                                                           strict=False)):
        anywhere -= WALL | {"wall_time"}  # iter_wall_time: one iteration's wall time, not the run's
    veto = (anywhere & NOT_A_PHASE | (vocab | space) & COMPONENTS - SPACE_MODELS | vocab & COMPONENTS | stats
            | (alone or set()) & SPACE_NOT_A_PHASE)
    if not per_step:
        veto |= vocab & NAME_NOT_A_PHASE
    if vocab & SOFT_NOT_A_PHASE and not _phase(vocab)[0]:
        veto |= vocab & SOFT_NOT_A_PHASE
    if vocab & DATA_FIRST:
        veto = stats | anywhere & EVAL_WORDS  # a wait for an eval batch is the evaluation's
    if veto <= BARE_TOTAL_VETO and (total := _bare_total(name, proper, vocab, space, unit)) is not None:
        return total  # time/total: the step beside its parts, the run's total elsewhere
    if veto:
        return Reading("", _unit(name, unit) if unit else Unit(name), f"not a phase of the step: {_first(veto)}",
                       outside=True)
    timer = len(proper) > 1 and proper[0] == "t"  # t_data, t_fwd: a script's timer variables
    if unit is None and not timer and not vocab & DURATION_WORDS and not set(namespace) & DURATION_NAMESPACES:
        return Reading("", Unit(name), "no time unit or duration word")
    words = namespace + proper
    if any(a == "per" and b in PER_ITEM for a, b in zip(words, words[1:], strict=False)):
        return Reading("", _unit(name, unit) if unit else Unit(name), "a cost per item, not per step", outside=True)
    return None


def _moment(proper: list[str], namespace: list[str]) -> str:
    """The words that make a name a moment (``MOMENTS``), or ""."""
    core = proper[:-1] if len(proper) > 2 and proper[-1] in _MOMENT_UNITS else proper
    if "to" in core or "on" in core:
        return ""  # end_to_end: a span; on_train_batch_end_time: a hook's time
    if len(core) == 1 and core[0] in MOMENTS and namespace and namespace[-1] in DURATION_WORDS:
        return f"{namespace[-1]}/{core[0]}"
    if len(core) < 2:
        return ""
    a, b = core[-2:]
    moment, other = (b, a) if b in MOMENTS else (a, b)
    return f"{a} {b}" if moment in MOMENTS and other not in MOMENTS and other in _MOMENT_BESIDE else ""


def _no_phase_word(name: str, proper: list[str], vocab: set[str], unit: tuple[str, float] | None,
                   meaning: str, space: set[str] | None = None) -> Reading:
    """A duration whose words name no phase, or name one beside a part of the step of no phase
    (``OTHER_PARTS``: a learner's update, a scheduler's step, a host-side copy). ``space``: the
    namespace's words. A namespace of durations (``timing/``) makes a sibling word a duration (a
    unit written makes it one too: ``render_ms``; other words with a unit and no duration word stay
    what they were, ``core_hours`` and ``num_seconds`` being totals and counts); under an epoch's
    namespace a duration that names nothing is the epoch's (``epoch/wall_seconds``)."""
    space = space or set()
    parts = _parts(proper, vocab)
    timed = unit is not None or bool(vocab & DURATION_WORDS)  # update_time: a timing of no phase, like sync_time
    if parts and (meaning != "data_wait" or parts & HOST_PREP):
        part = _first(parts)
        return Reading("", _unit(name, unit) if timed else Unit(name), f"a part of the step of no phase: {part}")
    if meaning:  # a data word beside another part (a buffer's priority update): the data wait still
        return Reading(meaning, _unit(name, unit), f"'{meaning}' beside {_first(parts)}", 1.0)
    if vocab & WAIT_WORDS:
        return Reading("data_wait", _unit(name, unit), "a wait for no named thing: the input, if nothing else",
                       AMBIGUOUS_CERTAINTY, "a trainer's bare wait is most often for its next batch")
    if space & EPOCHS:
        return Reading("", _unit(name, unit) if unit else Unit(name), "an epoch's duration: no phase of the step",
                       outside=True)
    bare = _bare_duration(proper, bool(space & DURATION_NAMESPACES))
    if bare:
        return Reading("step", _unit(name, unit), f"a bare {bare}: the step, if nothing else",
                       AMBIGUOUS_CERTAINTY, "a bare duration is the step in most loggers, but not in all")
    if (total := _bare_total(name, proper, vocab, space, unit)) is not None:
        return total  # tick/whole_ms
    core = [w for w in proper if w not in TIME_UNITS and w not in END_UNITS and w not in DURATION_WORDS]
    sibling = SIBLING_WORDS.get(core[-1], "") if core and core[-1] != "step" else ""  # unet_time: the unet
    # train/hr is a hit rate, not hours; a sibling word's unit or namespace says its duration (render_ms)
    timed = bool(vocab & DURATION_WORDS) or bool(sibling and (space & DURATION_NAMESPACES or unit is not None))
    return Reading("", _unit(name, unit) if timed else Unit(name), "a duration of no phase word", sibling=sibling)


def _bare_total(name: str, proper: list[str], vocab: set[str], space: set[str],
                unit: tuple[str, float] | None) -> Reading | None:
    """A bare total (``TOTALS``, alone with duration words and units: ``time/total``,
    ``train/timer_total``, ``tick/whole_ms``) of a timer (a unit written, a namespace of durations,
    a timer's word), outside an epoch's namespace: the step beside two phases of its prefix (their
    whole: ``sidecar.aggregation.parts``), uncertain; alone no phase (the run's total, since the
    start, in other trainers: a key outside the step). A bare ``total_time`` with none of these
    stays what it was, a gauge outside the step."""
    core = [w for w in proper if w not in TIME_UNITS and w not in END_UNITS and w not in DURATION_WORDS]
    if len(core) != 1 or core[0] not in TOTALS or space & EPOCHS:
        return None
    if unit is None and not space & DURATION_NAMESPACES and not vocab & TIMER_WORDS:
        return None  # a bare total_time stays a gauge (the run's, since the start, in most trainers)
    return Reading("", _unit(name, unit), f"a bare '{core[0]}': the step beside phases of its prefix",
                   AMBIGUOUS_CERTAINTY, "a bare total is one step's whole beside its parts, the run's elsewhere",
                   sibling="step", outside=True)


def _interval(proper: list[str]) -> bool:
    """Whether a word of ``INTERVAL`` follows a duration word (``time_diff``: a timer's last interval)."""
    return any(b in INTERVAL and a in DURATION_WORDS for a, b in zip(proper, proper[1:], strict=False))


def _bare_duration(proper: list[str], in_durations: bool = False) -> str:
    """What makes a name proper a bare duration, the step's if nothing else (``""``: it is not one):
    one ``BARE_STEP`` word; a timer's last interval (``time_diff``); a mean of a bare time
    (``avg_time``: ``MEANS``); duration words beside a word of what runs the step (``DEVICE_WORDS``:
    ``gpu_etime_ms``, ``dt_net``). Time units aside."""
    if len(proper) == 1 and proper[0] in BARE_STEP:
        return f"'{proper[0]}'"
    core = [w for w in proper if w not in TIME_UNITS and w not in END_UNITS]
    if len(core) == 2 and _interval(core):
        return f"'{core[0]}_{core[1]}' (a timer's last interval)"
    if len(core) == 2 and set(core) & MEANS and set(core) & MEAN_OF:
        return f"'{'_'.join(core)}' (a mean of a bare time)"
    device = [w for w in core if w in DEVICE_WORDS]
    timed = [w for w in core if w in DEVICE_TIMES]
    if len(device) == 1 and (timed or in_durations) and len(device) + len(timed) == len(core):
        return f"'{'_'.join(core)}' (the {device[0]}'s time)"  # compute_time; Time/compute
    return ""


def _parts(proper: list[str], vocab: set[str]) -> set[str]:
    """The words of ``OTHER_PARTS`` in the name, less a ``processing`` that follows a step word: a
    batch's processing is the step (``Batch_processing_time_ms``); a batch's preprocessing, or
    processing a batch (``process_batch``: its preparation), is not."""
    parts = vocab & OTHER_PARTS
    for before, word in zip(proper, proper[1:], strict=False):
        if word == "processing" and before in PHASE_WORDS["step"]:
            parts.discard(word)
    return parts


def ambiguity(name: str) -> tuple[str, str] | None:
    """(the other meaning, why) where ``name``'s words mean different things in different codebases
    (``AMBIGUOUS``), whoever reads it (the reader, or a framework's preset for a bare ``time``)."""
    return _ambiguity(segments(name))


def _ambiguity(segs: list[list[str]]) -> tuple[str, str] | None:
    """``ambiguity`` of a name split into ``segs`` (``segments``)."""
    if not segs:
        return None
    proper = tuple(w for w in segs[-1] if w not in TIME_UNITS)
    whole = tuple(w for seg in segs for w in seg if w not in TIME_UNITS)
    return AMBIGUOUS.get(proper) or AMBIGUOUS.get(whole)


def _phase(vocab: set[str]) -> tuple[str, str]:
    """(phase, the word that named it) from a name's words, in ``PHASE_WORDS`` order."""
    found = {phase: sorted(vocab & ws) for phase, ws in PHASE_WORDS.items() if vocab & ws}
    if "forward" in found and "backward" in found and "comm_wait" not in found:
        return "forward_backward", f"{found['forward'][0]}+{found['backward'][0]}"
    if "optimizer" in found and "comm_wait" not in found:
        return "optimizer", found["optimizer"][0]
    for phase, hits in found.items():
        return phase, hits[0]
    return "", ""


def _unit(name: str, unit: tuple[str, float] | None) -> Unit:
    """The reading's unit: the written one, else seconds (what Python timers measure)."""
    if unit is None:
        return Unit(name, "(not written: s)", SECONDS, 1.0)
    return Unit(name, unit[0], SECONDS, unit[1])


def _first(found: set[str]) -> str:
    return min(found, key=lambda w: (len(w), w)) if found else ""


RATES: dict[str, frozenset[str]] = {"tokens_per_s": ITEMS["tokens"], "samples_per_s": ITEMS["samples"],
                                    "steps_per_s": ITEMS["steps"]}
"""Throughput meaning -> the words of what a rate counts (``ITEMS``), read before ``per``/``/`` and a
time unit (``perf/tokens_per_sec``, ``train/samples_per_second_per_gpu``, ``it/s``)."""


def read_rate(name: str) -> str:
    """The throughput meaning (``RATES``) a rate's name says, ``""`` if none: what the last segment
    counts per second (``perf/tokens_per_sec`` -> ``tokens_per_s``); a namespace of counts is read
    too (``samples/s``). Environment frames and steps of RL (``fps``, ``SPS``) are no training rate,
    nor an evaluation's (``eval/steps_per_second``: HF's, at each evaluation)."""
    if lemmas({w for seg in segments(name) for w in seg}) & EVAL_WORDS:
        return ""
    segs = split_segments(name)
    for text in dict.fromkeys((segs[-1], "/".join(segs[-2:]), "/".join(segs[-3:]))):  # tokens/sec/gpu
        m = _PER_TIME.search(text)
        if m is not None:
            counted = m.group(1).lower()
            return next((meaning for meaning, ws in RATES.items() if counted in ws), "")
    return ""


def read_share(stem_: str) -> str:
    """The phase a percent gauge is the share of, read from its name less the unit (``time/data``
    of ``time/data_pct``, ``comm_time`` of ``comm_time_percent``): a phase read for sure from words
    that say a time (a namespace of durations, a duration word other than a wait: ``sys/io_wait`` is
    the CPU's iowait), else ``""``."""
    said = {w for seg in segments(stem_) for w in seg}
    if not said & (DURATION_NAMESPACES | DURATION_WORDS) - WAIT_WORDS:
        return ""
    reading = read_name(stem_)
    return reading.meaning if reading.meaning in PHASES and reading.certainty >= 1.0 else ""


def doc_table() -> list[str]:
    """docs/METRICS.md's vocabulary of the reader, one row per word list (a test keeps the two equal)."""
    def words_of(ws: frozenset[str] | dict[str, float]) -> str:
        return ", ".join(f"`{w}`" for w in sorted(ws))

    rows = [("a time unit, anywhere in the name", words_of(TIME_UNITS) + "; at the end only: " + words_of(END_UNITS)),
            ("a duration, when no unit is written (read in seconds)", words_of(DURATION_WORDS)),
            ("a namespace of durations", words_of(DURATION_NAMESPACES))]
    rows += [(f"phase `{phase}`", words_of(ws)) for phase, ws in PHASE_WORDS.items()]
    rows += [("no phase of the step, anywhere in the name, in any of their forms", words_of(NOT_A_PHASE)),
             ("no phase of the step, in the name proper", words_of(NAME_NOT_A_PHASE)),
             ("no phase of the step, as a namespace segment of its own (a run's final figures)",
              words_of(SPACE_NOT_A_PHASE)),
             ("the last word: a flag, no duration", words_of(FLAGS)),
             ("beside a duration word or a time unit, last (a unit after them aside; not in a span or a hook's "
              "name: `end_to_end`, `on_..._end_time`): a moment, no duration", words_of(MOMENTS)),
             ("a component's part of a phase, not the phase", words_of(COMPONENTS)),
             ("a statistic of many steps (`total` next to a word of one step excepted)", words_of(STATISTICS)),
             ("right after a duration word: a timer's last interval, no statistic (alone with it: the step, uncertain)",
              words_of(INTERVAL)),
             ("a count, a rate or a share, when no time unit is written", words_of(NOT_A_DURATION)),
             ("after `per`: a cost per item", words_of(PER_ITEM)),
             ("a part of the step of no phase (`update`: a learner's whole update)", words_of(OTHER_PARTS)),
             ("the next batch, even where another word would put the key outside the step", words_of(DATA_FIRST)),
             ("a wait for no named thing: `data_wait`, uncertain", words_of(WAIT_WORDS)),
             ("with a communication wait's words: `comm_overlap`, the part of it spent computing (unless a word "
              "of the next row)", words_of(OVERLAP_WORDS)),
             ("with the above: not the overlap (a wait so named is exposed already, no overlap taken off it)",
              words_of(EXPOSED_WORDS | NEGATIONS)),
             ("what the duration spans or leaves out follows: the phase is read before the first of them",
              words_of(SPAN_WORDS)),
             ("glued to each other in one word the reader does not know, split (`iotime`, `dataload`, `gradsync`)",
              words_of(GLUABLE)),
             ("misspelt by one slip (two neighbouring letters swapped, one inside left out): read as the word",
              words_of(MISSPELT_WORDS)),
             ("the last word, beside phases of the same prefix: the phase they leave out (`step` the optimizer "
              "beside a forward and a backward, a render the forward beside a backward)",
              words_of(frozenset(SIBLING_WORDS))),
             ("alone, of a timer (a unit, a namespace of durations, `timer`): the step beside two phases of its "
              "prefix, uncertain, else no phase", words_of(TOTALS)),
             ("alone: the step, uncertain", words_of(BARE_STEP)),
             ("with one of " + words_of(MEAN_OF) + " and nothing else: the step, uncertain", words_of(MEANS)),
             ("with words of elapsed time only: the time of what runs the step, the step, uncertain",
              words_of(DEVICE_WORDS)),
             ("the words of elapsed time that read a device's time", words_of(DEVICE_TIMES)),
             ("a namespace that says the step axis counts items", words_of(AXIS_NAMESPACES))]
    rows += [(f"before `per`/`/` and a time unit: `{meaning}`", words_of(ws)) for meaning, ws in RATES.items()]
    return ["| the words | mean |", "| --- | --- |"] + [f"| {ws} | {what} |" for what, ws in rows]
