"""The metric dicts training frameworks hand their loggers, with their own key names (read from
each framework's sources at the version in ``VERSIONS``, the presets' own table), filled with the
values a run of ``step_s`` seconds a step, ``data`` of it loading data, would give. A trainer
publishes them as they are: ``telemetry.publish(step, metrics)``."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.processing.frameworks import FRAMEWORKS

Fixture = Callable[[float, float, int], dict[str, float]]
"""(seconds per step, data loading share of it 0-1, steps so far) -> the framework's dict."""

VERSIONS = {r.preset: r.version for r in FRAMEWORKS}

TOKENS_PER_STEP = 8192
FLOPS_PER_TOKEN = 6 * 124e6
PEAK_FLOPS = 989e12


def torchtitan(step_s: float, data: float, step: int) -> dict[str, float]:
    """torchtitan/components/metrics.py MetricsProcessor.log: the means over log_freq steps."""
    tps = TOKENS_PER_STEP / step_s
    return {
        "loss_metrics/global_avg_loss": 2.31, "loss_metrics/global_max_loss": 2.52, "grad_norm": 0.87,
        "ntokens_seen": float(TOKENS_PER_STEP * step), "throughput(tps)": tps,
        "tflops": FLOPS_PER_TOKEN * tps / 1e12, "mfu(%)": 100 * FLOPS_PER_TOKEN * tps / PEAK_FLOPS,
        "time_metrics/end_to_end(s)": step_s, "time_metrics/data_loading(s)": step_s * data,
        "time_metrics/data_loading(%)": 100.0 * data,
        "memory/max_active(GiB)": 31.5, "memory/max_active(%)": 22.6, "memory/max_reserved(GiB)": 36.0,
        "memory/max_reserved(%)": 25.8, "memory/num_alloc_retries": 0.0, "memory/num_ooms": 0.0,
    }


def megatron(step_s: float, data: float, step: int) -> dict[str, float]:
    """megatron/training/training.py training_log: timers.write(<timer>-time) in seconds per
    iteration (batch-generator runs inside forward-backward), iteration-time, throughput
    (TFLOP/s/GPU), and its scalars."""
    compute = step_s * (1.0 - data)
    return {
        "iteration-time": step_s, "batch-generator-time": step_s * data,
        "forward-backward-time": step_s * data + compute * 0.85, "grads-all-reduce-time": compute * 0.05,
        "optimizer-time": compute * 0.08, "learning-rate": 3e-4, "lm loss": 2.4, "loss-scale": 1.0,
        "grad-norm": 0.9, "batch-size": 32.0, "throughput": FLOPS_PER_TOKEN * TOKENS_PER_STEP / step_s / 1e12,
    }


def hf(step_s: float, data: float, step: int) -> dict[str, float]:
    """transformers Trainer logs (loss, grad_norm, learning_rate, epoch) and its speed metrics
    (trainer_utils.speed_metrics, logged at the end of training)."""
    return {"loss": 2.2, "grad_norm": 1.3, "learning_rate": 5e-5, "epoch": step / 100.0,
            "train_samples_per_second": 8 / step_s, "train_steps_per_second": 1 / step_s,
            "train_tokens_per_second": TOKENS_PER_STEP / step_s}


def nanogpt(step_s: float, data: float, step: int) -> dict[str, float]:
    """nanoGPT train.py: the wandb.log dict (mfu as a percent)."""
    return {"iter": float(step), "train/loss": 3.1, "val/loss": 3.2, "lr": 6e-4,
            "mfu": 100 * FLOPS_PER_TOKEN * TOKENS_PER_STEP / step_s / PEAK_FLOPS}


def mmengine(step_s: float, data: float, step: int) -> dict[str, float]:
    """mmengine: the tag LogProcessor hands the visualizer each logging interval (IterTimerHook's
    data_time and time in seconds, memory in MB)."""
    return {"lr": 0.02, "data_time": step_s * data, "time": step_s, "loss": 1.4, "loss_cls": 0.8,
            "loss_bbox": 0.6, "memory": 4096.0}


def detectron2(step_s: float, data: float, step: int) -> dict[str, float]:
    """detectron2: EventStorage scalars (data_time from the train loop, time from IterationTimer)."""
    return {"data_time": step_s * data, "time": step_s, "total_loss": 1.1, "loss_cls": 0.4, "loss_box_reg": 0.3,
            "lr": 0.02}


def accelerate(step_s: float, data: float, step: int) -> dict[str, float]:
    """Accelerate's examples (complete_nlp_example.py): accelerator.log of the trainer's own dict."""
    return {"train_loss": 0.7, "epoch": float(step // 50), "accuracy": 0.8, "f1": 0.79}


def rllib(step_s: float, data: float, step: int) -> dict[str, float]:
    """RLlib's old-API-stack result as Ray Tune flattens it for its loggers: the timers' means in
    ms (a synchronous PPO iteration: sample, learn, synch the weights), Tune's own iteration time
    and total, the episodes' and the learner's figures."""
    ms = step_s * 1000.0
    return {"timers/training_iteration_time_ms": ms, "timers/sample_time_ms": ms * data,
            "timers/learn_time_ms": ms * (1.0 - data) * 0.9, "timers/synch_weights_time_ms": ms * (1.0 - data) * 0.05,
            "timers/learn_throughput": 4000 / step_s, "time_this_iter_s": step_s, "time_total_s": step_s * step,
            "training_iteration": float(step), "timesteps_total": 4000.0 * step, "episode_reward_mean": 120.0,
            "episode_len_mean": 200.0, "info/learner/default_policy/learner_stats/total_loss": 0.4,
            "info/learner/default_policy/learner_stats/cur_lr": 5e-5}


def rllib_new_stack(step_s: float, data: float, step: int) -> dict[str, float]:
    """RLlib's new-API-stack result as Ray Tune flattens it: the timers' means in seconds (a
    synchronous PPO training_step: sample the env runners, update the learners, synch the weights;
    the iteration one training_step), the env runners' and learners' figures, Tune's own times."""
    rest = step_s * (1.0 - data)
    return {"timers/training_iteration": step_s * 1.001, "timers/training_step": step_s,
            "timers/env_runner_sampling_timer": step_s * data, "timers/learner_update_timer": rest * 0.9,
            "timers/synch_weights": rest * 0.05, "timers/synch_env_connectors": rest * 0.01,
            "time_this_iter_s": step_s * 1.002, "time_total_s": step_s * step, "training_iteration": float(step),
            "env_runners/episode_return_mean": 120.0, "env_runners/episode_len_mean": 200.0,
            "env_runners/num_env_steps_sampled_lifetime": 4000.0 * step,
            "learners/default_policy/total_loss": 0.4, "learners/default_policy/entropy": 1.2,
            "learners/default_policy/default_optimizer_learning_rate": 5e-5,
            "learners/__all_modules__/num_env_steps_trained_lifetime": 4000.0 * step}


def torch_ddp(step_s: float, data: float, step: int) -> dict[str, float]:
    """torch DDP's ``_get_ddp_logging_data()`` as a trainer logs it (its numbers; the strings left
    out, as a tap leaves them): the sampled iteration's and the running averages' times in ns, and
    the moments each began and ended (ns since the epoch)."""
    ns = step_s * (1.0 - data) * 1e9
    times = {"forward_compute_time": ns * 0.3, "backward_compute_time": ns * 0.5, "backward_comm_time": ns * 0.25,
             "backward_compute_comm_overlap_time": ns * 0.2}
    moments = {f"{k}_{end}": 1.8e18 + step * step_s * 1e9
               for k in times if "overlap" not in k for end in ("start", "end")}
    return {**times, **{f"avg_{k}": v for k, v in times.items()}, **moments, "rank": 0.0, "world_size": 8.0,
            "iteration": float(step), "bucket_cap_bytes": 25 * 2**20, "num_buckets_reduced": 5.0,
            "total_parameter_size_bytes": 4.9e8}


FIXTURES: dict[str, Fixture] = {"torchtitan": torchtitan, "megatron": megatron, "hf": hf, "nanogpt": nanogpt,
                                "mmengine": mmengine, "detectron2": detectron2, "accelerate": accelerate,
                                "rllib": rllib, "rllib_new_stack": rllib_new_stack, "torch_ddp": torch_ddp}
DATA_TIMED = ("torchtitan", "megatron", "mmengine", "detectron2", "rllib", "rllib_new_stack")
"""Frameworks whose own dict reports data loading against the step; the others' (HF, nanoGPT,
Accelerate) carry no data time, so their names alone cannot tell an input-bound run."""
