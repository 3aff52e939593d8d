"""Step-time overhead of the shim in real CPU training loops, with and without it, in one run.

    python bench/bench_loops.py                  # every loop, 6 x 50 steps per condition
    python bench/bench_loops.py --loops plain compiled --rounds 4 --steps 100

Loops (tiny models, one torch thread, so a 2-core box shared with other jobs can run them):

* ``plain``: an MLP's forward, backward and SGD step on random batches;
* ``dataloader``: the same, its batches from a DataLoader with 2 persistent fork workers whose
  dataset publishes a count and a timing per item (the workers' flushers run too);
* ``compiled``: the step function under ``torch.compile`` (inductor), with shim calls inside it
  (``timing``, ``count``, ``scalar`` of the loss: calls deferred to the end of the graph) and
  ``publish`` and ``count`` outside; the compiled function's call is also timed alone, in both
  conditions, which gives the cost of the calls inside it;
* ``hf``: a Hugging Face ``Trainer`` on a tiny GPT-2 built from a config, with and without
  ``SidecarCallback``;
* ``lightning``: a Lightning ``Trainer`` on a tiny module, with and without ``SidecarCallback``.

In the plain, dataloader and compiled loops the shim side makes the calls a trainer would make per
step: ``publish(step, 8-key profile)``, 3 ``timing``, 2 ``count``, 2 ``gauge``. The plain and compiled
loops interleave the conditions step by step (shim calls on every other step), so both see the
same machine load; the others alternate whole runs (without, with, without, ...). Each
condition's figure is the median step time over all its steps (>= 300), the overhead the ratio of
the medians. On a shared machine that ratio is dominated by noise long before 0.2 %, so the
run also measures the shim's time on the training thread directly: the shim calls timed as one
block per step (plain, dataloader), or the time spent inside the callback's hooks per step (hf,
lightning), its median as a share of the median step. The shim publishes to a real receiver process;
in the "without" runs it is idle in the process (its flusher wakes every 100 ms and sends a
heartbeat every 2 s). Also measured, in the plain loop: the cost per shim call *inside* the loop
(the calls timed as one block each step, after a backward pass has evicted the caches) next to
the same calls in a tight loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.shim_helpers import ReceiverProcess  # noqa: E402
from trainer_shim import telemetry  # noqa: E402

CALLS_PER_STEP = 8  # publish + 3 timing + 2 count + 2 gauge
FEATURES, HIDDEN, BATCH = 256, 512, 64
"""The MLP and its batch: a few milliseconds per step on one core, a small real step."""


def shim_calls(step: int, loss: float) -> None:
    """What a trainer publishes per step (8 calls)."""
    telemetry.publish(step, {"step_ms": 1.0, "data_wait_ms": 0.1, "forward_ms": 0.4,
                             "backward_ms": 0.4, "optimizer_step_ms": 0.1, "loss": loss,
                             "lr": 0.01, "tokens": 64.0})
    telemetry.timing("forward_ms", 0.4)
    telemetry.timing("backward_ms", 0.4)
    telemetry.timing("optimizer_step_ms", 0.1)
    telemetry.count("batches")
    telemetry.count("tokens", 64)
    telemetry.gauge("loss", loss)
    telemetry.gauge("lr", 0.01)


def mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


# -- the loops: each returns per-step times (ns) -------------------------------------------------


class Plain:
    def __init__(self) -> None:
        self.model, self.opt = mlp()
        self.x, self.y = torch.randn(BATCH, FEATURES), torch.randn(BATCH, 1)
        self.in_loop_ns: list[int] = []

    interleaved = True

    def run_interleaved(self, steps: int) -> dict[bool, list[int]]:
        """Shim calls on every other step: both conditions see the same machine load."""
        times: dict[bool, list[int]] = {False: [], True: []}
        model, opt, x, y = self.model, self.opt, self.x, self.y
        for step in range(2 * steps):
            shim = step % 2 == 1
            t_start = time.perf_counter_ns()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if shim:
                t0 = time.perf_counter_ns()
                shim_calls(step, 0.5)
                self.in_loop_ns.append(time.perf_counter_ns() - t0)
            times[shim].append(time.perf_counter_ns() - t_start)
        return times


class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random samples; the worker publishes per item when ``shim`` is set (class attribute, read
    in the worker: the fork workers see the value at fork time, so the loader is rebuilt)."""

    def __init__(self, shim: bool) -> None:
        self.shim = shim

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shim:
            telemetry.count("items")
            telemetry.timing("item_ms", 0.01)
        return torch.randn(FEATURES), torch.randn(1)


class Loader:
    def __init__(self) -> None:
        self.model, self.opt = mlp()
        self.iters = {shim: iter(torch.utils.data.DataLoader(
            Items(shim), batch_size=BATCH, num_workers=2, persistent_workers=True,
            multiprocessing_context="fork", prefetch_factor=4)) for shim in (False, True)}
        self.in_loop_ns: list[int] = []

    def run(self, steps: int, shim: bool) -> list[int]:
        times, model, opt, it = [], self.model, self.opt, self.iters[shim]
        t_prev = time.perf_counter_ns()
        for step in range(steps):
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if shim:
                t0 = time.perf_counter_ns()
                shim_calls(step, 0.5)
                self.in_loop_ns.append(time.perf_counter_ns() - t0)
            now = time.perf_counter_ns()
            times.append(now - t_prev)
            t_prev = now
        return times


class Compiled:
    def __init__(self) -> None:
        self.model, self.opt = mlp()
        self.x, self.y = torch.randn(BATCH, FEATURES), torch.randn(BATCH, 1)

        def step_plain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.model(x), y)

        def step_shim(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            telemetry.timing("forward_ms", 0.4)
            telemetry.count("tokens", x.shape[0])
            telemetry.scalar("loss", loss.detach())
            return loss

        self.fns = {False: torch.compile(step_plain), True: torch.compile(step_shim)}
        for fn in self.fns.values():  # compile outside the measurement
            fn(self.x, self.y).backward()
        self.forward_ns: dict[bool, list[int]] = {False: [], True: []}
        """The compiled function's call alone, per condition (the in-graph calls' cost)."""

    interleaved = True

    def run_interleaved(self, steps: int) -> dict[bool, list[int]]:
        """The compiled step with shim calls on every other step (two compiled functions)."""
        times: dict[bool, list[int]] = {False: [], True: []}
        opt, x, y = self.opt, self.x, self.y
        for step in range(2 * steps):
            shim = step % 2 == 1
            t_start = time.perf_counter_ns()
            loss = self.fns[shim](x, y)
            self.forward_ns[shim].append(time.perf_counter_ns() - t_start)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if shim:
                telemetry.publish(step, {"loss_seen": 1.0, "lr": 0.01})
                telemetry.count("batches")
            times[shim].append(time.perf_counter_ns() - t_start)
        return times


class StepTimes:
    """Collects the time between consecutive step-end hooks (in both conditions)."""

    def __init__(self) -> None:
        self.ends: list[int] = []

    def tick(self) -> None:
        self.ends.append(time.perf_counter_ns())

    def times(self) -> list[int]:
        return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]


def timed_hooks(cls: type, hooks: tuple[str, ...], per_step: list[int]) -> type:
    """A subclass of the callback ``cls`` whose ``hooks`` time themselves: the last hook of each
    step (the last in ``hooks``) appends the step's total (ns) to ``per_step``, the shim's whole
    cost on the training thread in that step."""
    acc = [0]

    def wrap(name: str, last: bool) -> Callable[..., None]:
        base = getattr(cls, name)

        def hook(self: Any, *args: Any, **kwargs: Any) -> None:
            t0 = time.perf_counter_ns()
            base(self, *args, **kwargs)
            acc[0] += time.perf_counter_ns() - t0
            if last:
                per_step.append(acc[0])
                acc[0] = 0

        return hook

    return type(f"Timed{cls.__name__}", (cls,), {name: wrap(name, name == hooks[-1]) for name in hooks})


class HF:
    def __init__(self, workdir: str) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback

        self.workdir = workdir
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16,
                                                n_layer=1, n_head=2))

        class Tick(TrainerCallback):  # type: ignore[misc]
            def __init__(self, clock: StepTimes) -> None:
                self.clock = clock

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                self.clock.tick()

        self.tick_cls = Tick
        self.in_loop_ns: list[int] = []

    def run(self, steps: int, shim: bool) -> list[int]:
        from transformers import Trainer, TrainingArguments

        from trainer_shim.integrations.hf import SidecarCallback

        class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return 10**6

            def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
                ids = torch.arange(i, i + 8) % 64
                return {"input_ids": ids, "labels": ids}

        clock = StepTimes()
        timed = timed_hooks(SidecarCallback, ("on_log", "on_step_begin", "on_pre_optimizer_step",
                                              "on_optimizer_step", "on_step_end"), self.in_loop_ns)
        callbacks = [self.tick_cls(clock)] + ([timed()] if shim else [])
        args = TrainingArguments(output_dir=self.workdir, max_steps=steps + 1, logging_steps=1,
                                 per_device_train_batch_size=4, report_to=[], use_cpu=True,
                                 save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
        from transformers.trainer_callback import PrinterCallback

        trainer = Trainer(model=self.model, args=args, train_dataset=Tokens(), callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)  # no log line per step on stdout
        trainer.train()
        return clock.times()


class LightningLoop:
    def __init__(self) -> None:
        import lightning as L

        class Tiny(L.LightningModule):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.net, _ = mlp()

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        class Tick(L.Callback):  # type: ignore[misc]
            def __init__(self, clock: StepTimes) -> None:
                self.clock = clock

            def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
                self.clock.tick()

        self.module_cls, self.tick_cls = Tiny, Tick
        self.in_loop_ns: list[int] = []
        data = torch.utils.data.TensorDataset(torch.randn(8192, FEATURES), torch.randn(8192, 1))
        self.loader = torch.utils.data.DataLoader(data, batch_size=BATCH)

    def run(self, steps: int, shim: bool) -> list[int]:
        import lightning as L

        from trainer_shim.integrations.lightning import SidecarCallback

        clock = StepTimes()
        timed = timed_hooks(SidecarCallback, ("on_train_batch_start", "on_before_backward",
                                              "on_after_backward", "on_train_batch_end"),
                            self.in_loop_ns)
        callbacks = [self.tick_cls(clock)] + ([timed()] if shim else [])
        trainer = L.Trainer(max_steps=steps + 1, accelerator="cpu", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=callbacks)
        trainer.fit(self.module_cls(), self.loader)
        return clock.times()


# -- measurement ---------------------------------------------------------------------------------


def compare(loop: Any, rounds: int, steps: int) -> dict[str, float]:
    """Alternate runs; medians over all steps of each condition (ns) and the overhead (%)."""
    got: dict[bool, list[int]] = {False: [], True: []}
    if getattr(loop, "interleaved", False):
        loop.run_interleaved(50)  # warm-up
        for _ in range(rounds):
            for shim, times in loop.run_interleaved(steps).items():
                got[shim].extend(times)
    else:
        loop.run(min(steps, 50), False)  # warm up both paths
        loop.run(min(steps, 50), True)
        for _ in range(rounds):
            for shim in (False, True):
                got[shim].extend(loop.run(steps, shim))
    without, with_ = statistics.median(got[False]), statistics.median(got[True])
    direct = statistics.median(loop.in_loop_ns) if getattr(loop, "in_loop_ns", None) else float("nan")
    return {"steps": min(len(got[False]), len(got[True])), "without_us": without / 1e3,
            "with_us": with_ / 1e3, "overhead_pct": 100 * (with_ - without) / without,
            "direct_us": direct / 1e3, "direct_pct": 100 * direct / without}


def tight_loop_cost_ns(repeats: int = 20_000) -> float:
    """The same 8 calls back to back, per call (ns): the microbenchmark figure in this run."""
    t0 = time.perf_counter_ns()
    for step in range(repeats):
        shim_calls(step, 0.5)
    return (time.perf_counter_ns() - t0) / repeats / CALLS_PER_STEP


LOOPS: dict[str, Callable[[str], Any]] = {
    "plain": lambda wd: Plain(), "dataloader": lambda wd: Loader(),
    "compiled": lambda wd: Compiled(), "hf": HF, "lightning": lambda wd: LightningLoop(),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", nargs="+", choices=list(LOOPS), default=list(LOOPS))
    parser.add_argument("--rounds", type=int, default=6, help="alternations per loop (default 6)")
    parser.add_argument("--steps", type=int, default=50, help="steps per run (default 50)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dfs-bench-", dir="/tmp") as workdir:
        endpoint = f"ipc://{workdir}/sidecar.sock"
        rx = ReceiverProcess(endpoint, None)
        try:
            telemetry.configure(endpoint=endpoint, worker="bench")
            load = os.getloadavg()
            print(f"# torch {torch.__version__}, {os.cpu_count()} CPUs, load average at start "
                  f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.rounds} x {args.steps} steps "
                  "per condition")
            print("| loop | steps/condition | median step without | with shim | overhead (medians) "
                  "| shim time on the training thread per step | as % of the step |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            plain_loop = None
            notes: list[str] = []
            for name in args.loops:
                loop = LOOPS[name](workdir)
                if name == "plain":
                    plain_loop = loop
                r = compare(loop, args.rounds, args.steps)
                direct = ("n/a (calls inside the compiled function: see below)" if r["direct_us"] != r["direct_us"]
                          else f"{r['direct_us']:.1f} us")
                pct = "n/a" if r["direct_pct"] != r["direct_pct"] else f"{r['direct_pct']:.3f} %"
                print(f"| {name} | {r['steps']} | {r['without_us']:.1f} us | {r['with_us']:.1f} us "
                      f"| {r['overhead_pct']:+.2f} % | {direct} | {pct} |", flush=True)
                if isinstance(loop, Compiled):
                    fwd = {k: statistics.median(v) / 1e3 for k, v in loop.forward_ns.items()}
                    notes.append(f"compiled loop, the compiled forward call alone (3 shim calls "
                                 f"inside with the shim): median {fwd[False]:.1f} us without, "
                                 f"{fwd[True]:.1f} us with, {(fwd[True] - fwd[False]) / 3:+.2f} us "
                                 f"per call ({len(loop.forward_ns[True])} calls each)")
            for note in notes:
                print(f"\n{note}")
            if plain_loop is not None and plain_loop.in_loop_ns:
                in_loop = statistics.median(plain_loop.in_loop_ns) / CALLS_PER_STEP
                print(f"\nper shim call, plain loop: {in_loop:.0f} ns inside the loop (median of "
                      f"{len(plain_loop.in_loop_ns)} steps, 8 calls timed as one block), "
                      f"{tight_loop_cost_ns():.0f} ns in a tight loop")
            load = os.getloadavg()
            print(f"load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            telemetry.close()
        finally:
            rx.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
