"""The trainers of the verdict conformance matrix (``tests/verdict_matrix.py``): real frameworks
on CPU, each publishing through the real shim the way its documentation says, its injected
condition switched while it runs. Run as ``python -m tests.matrix_loops FRAMEWORK ENDPOINT
CONTROL [RANK WORLD PORT]``.

``CONTROL`` is a JSON file the matrix rewrites: ``{"condition": NAME}`` or ``{"stop": true}``; each
rank acknowledges a new condition in ``CONTROL.ack<RANK>`` once it has read it.
Conditions (``EFFECTS``, milliseconds per step): ``input`` a slow dataset; ``host`` host work
between the timed phases (a user's callback, a loop's own bookkeeping); ``unmapped`` a phase of the
step timed under a name no preset knows; ``comm`` a slow collective (a real gloo all-reduce, its
slowness a sleep inside the timed collective: a slow interconnect); ``straggler`` rank 1 slow in its
own compute; ``saturated`` every rank's own compute longer in the plain loops (``plain``,
``snapshot``, ``compile``, ``ddp``; the fake GPU reads 97 %: the ranks compute, they do not wait in
the collective), nothing in ``hf`` and ``lightning``; ``spin`` the slow collective of ``comm`` (the
fake GPU reads 97 % busy). Frameworks: ``plain`` (every occurrence, ``timed(loader)`` and
``timing()``; 2 ranks all-reduce their gradients over gloo), ``snapshot`` (the same, per-batch means
every 0.25 s through ``publish()``), ``hf`` (``Trainer`` + ``SidecarCallback``), ``lightning``
(``Trainer`` + ``SidecarCallback``), ``compile`` (a ``torch.compile``d model in a plain loop),
``ddp`` (``DistributedDataParallel`` on gloo, 2 ranks)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EFFECTS: dict[str, dict[str, float]] = {
    "base": {}, "input": {"data_ms": 60.0}, "host": {"host_ms": 60.0}, "unmapped": {"unmapped_ms": 80.0},
    "comm": {"comm_ms": 60.0}, "straggler": {"slow_ms": 60.0}, "saturated": {"work_ms": 30.0},
    "spin": {"comm_ms": 60.0},
}


SCALE = {"hf": 6.0}
"""Effects are scaled up where the framework's own step is long (the Trainer's per-step work on a
loaded CPU is 0.1-0.6 s), so each condition dominates the step as it would in a real run."""


class Control:
    """The injected condition, re-read from the control file at most every 50 ms."""

    def __init__(self, path: str, rank: int = 0, scale: float = 1.0) -> None:
        self.path = Path(path)
        self.rank = rank
        self.scale = scale
        self._next = 0.0
        self.state: dict[str, Any] = {"condition": None}  # none read yet: the first read is acknowledged

    def poll(self) -> dict[str, Any]:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + 0.05
            try:
                state = json.loads(self.path.read_text())
            except (OSError, ValueError):
                return self.state
            if state.get("condition") != self.state.get("condition"):
                self._ack(str(state.get("condition")))
            self.state = state
        return self.state

    def _ack(self, condition: str) -> None:
        """Tells the matrix this rank runs ``condition`` from now on (``CONTROL.ack<rank>``): a cell's
        windows are counted from the moment every rank has it, however late a loaded CPU reads it."""
        ack = self.path.with_name(f"{self.path.name}.ack{self.rank}")
        tmp = ack.with_name(ack.name + ".tmp")
        tmp.write_text(condition)
        tmp.replace(ack)

    @property
    def stop(self) -> bool:
        return bool(self.poll().get("stop"))

    def ms(self, effect: str) -> float:
        cond = self.poll().get("condition", "base")
        value = EFFECTS.get(cond, {}).get(effect, 0.0)
        if effect == "slow_ms" and self.rank != 1:
            return 0.0
        return value * self.scale


def sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


def _tiny_net() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))


class _Slow:
    """A dataset of random rows whose batches take ``data_ms`` (per batch of 8) to produce."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> Any:
        import torch

        sleep_ms(self.control.ms("data_ms") / 8)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randn(1, generator=g)


def _loader(control: Control) -> Any:
    import torch

    return torch.utils.data.DataLoader(_Slow(control), batch_size=8, num_workers=0)


def plain(endpoint: str, control: Control, rank: int, world: int, port: int, form: str = "timing",
          compiled: bool = False, ddp: bool = False) -> None:
    """A plain loop: data, forward, backward, (all-reduce,) optimizer, each timed; every
    occurrence through ``timing()`` or per-batch means through ``publish()``."""
    import torch
    import torch.distributed as dist

    from trainer_shim import telemetry
    from trainer_shim.integrations.loader import timed

    ch = telemetry.configure(endpoint=endpoint, role="trainer", worker=str(rank), flush_interval_s=0.05)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    net = _tiny_net()
    model: Any = torch.nn.parallel.DistributedDataParallel(net) if ddp else net
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sums: dict[str, float] = {}
    count = 0
    last_publish = time.monotonic()
    step = 0

    def record(name: str, ms: float) -> None:
        if form == "timing":
            ch.timing(name, ms)
        else:
            sums[name] = sums.get(name, 0.0) + ms

    batches = timed(_loader(control), channel=ch) if form == "timing" else _loader(control)
    it = iter(batches)
    while not control.stop:
        t_step = time.perf_counter()
        x, y = next(it)
        t0 = time.perf_counter()
        if form != "timing":
            record("data_wait_ms", (t0 - t_step) * 1000)
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, y)
        sleep_ms(control.ms("slow_ms") + control.ms("work_ms"))
        t1 = time.perf_counter()
        record("forward_ms", (t1 - t0) * 1000)
        opt.zero_grad()
        loss.backward()
        sleep_ms(control.ms("slow_ms") + control.ms("work_ms"))
        t2 = time.perf_counter()
        record("backward_ms", (t2 - t1) * 1000)
        if world > 1 and not ddp:
            for p in net.parameters():
                dist.all_reduce(p.grad)
        if world > 1:  # every step, on both ranks (a loss average), so the collectives pair up
            dist.all_reduce(torch.ones(1024))
            sleep_ms(control.ms("comm_ms"))
        t3 = time.perf_counter()
        if world > 1:
            record("allreduce_ms", (t3 - t2) * 1000)
        opt.step()
        unmapped = control.ms("unmapped_ms")
        sleep_ms(unmapped)
        t4 = time.perf_counter()
        record("t_update_ms" if unmapped else "optimizer_step_ms", (t4 - t3) * 1000)
        sleep_ms(control.ms("host_ms"))  # untimed host work between steps
        step += 1
        count += 1
        if form == "timing":
            ch.count("batches")
        else:
            record("step_ms", (time.perf_counter() - t_step) * 1000)
            if time.monotonic() - last_publish >= 0.25:
                ch.publish(step, {k: v / count for k, v in sums.items()})
                ch.count("batches", count)
                sums.clear()
                count = 0
                last_publish = time.monotonic()
    telemetry.flush()
    if world > 1:
        dist.destroy_process_group()


def hf(endpoint: str, control: Control) -> None:
    """``transformers.Trainer`` with ``SidecarCallback`` (the documented two lines), a tiny GPT-2."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from trainer_shim import telemetry
    from trainer_shim.integrations.hf import SidecarCallback

    telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc,type-arg]
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict[str, Any]:
            sleep_ms(control.ms("data_ms") / 8)
            ids = torch.arange(i, i + 16) % 64
            return {"input_ids": ids, "labels": ids}

    class UserWork(TrainerCallback):  # type: ignore[misc]
        """A user's own callback after the sidecar's: host work, or a phase timed under its own name."""

        def on_optimizer_step(self, args: Any, state: Any, control_: Any, **kwargs: Any) -> None:
            if control.stop:
                control_.should_training_stop = True
            sleep_ms(control.ms("host_ms"))
            ms = control.ms("unmapped_ms")
            if ms:
                with telemetry.timer("ema_update_ms"):
                    sleep_ms(ms)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=os.environ.get("MATRIX_OUT", "out"), max_steps=10**6,
                             per_device_train_batch_size=8, logging_steps=10**6, report_to=[], use_cpu=True,
                             save_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[SidecarCallback(), UserWork()]).train()
    telemetry.flush()


def lightning(endpoint: str, control: Control) -> None:
    """``lightning.Trainer`` with ``SidecarCallback`` (the documented two lines)."""
    import lightning as L
    import torch

    from trainer_shim import telemetry
    from trainer_shim.integrations.lightning import SidecarCallback

    telemetry.configure(endpoint=endpoint, role="trainer", worker="0", flush_interval_s=0.05)

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = _tiny_net()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class UserWork(L.Callback):  # type: ignore[misc]
        """A user's own callback after the sidecar's: a phase timed under its own name inside the
        step, or host work at each batch end (between the batches)."""

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if control.stop:
                trainer.should_stop = True
            ms = control.ms("unmapped_ms")
            if ms:
                with telemetry.timer("ema_update_ms"):
                    sleep_ms(ms)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            sleep_ms(control.ms("host_ms"))

    trainer = L.Trainer(max_steps=10**6, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[SidecarCallback(), UserWork()])
    trainer.fit(Tiny(), _loader(control))
    telemetry.flush()


def main(argv: list[str]) -> int:
    framework, endpoint, control_path = argv[:3]
    rank, world, port = (int(a) for a in argv[3:6]) if len(argv) >= 6 else (0, 1, 0)
    control = Control(control_path, rank, SCALE.get(framework, 1.0))
    import torch

    # one intra-op thread a process: the matrix runs up to 6 trainer processes on 2 cores, and
    # torch's default (a thread per core, spinning) makes each rank's compute wait on the others'
    torch.set_num_threads(1)
    if framework == "plain":
        plain(endpoint, control, rank, world, port)
    elif framework == "snapshot":
        plain(endpoint, control, rank, world, port, form="snapshot")
    elif framework == "compile":
        plain(endpoint, control, rank, world, port, compiled=True)
    elif framework == "ddp":
        plain(endpoint, control, rank, world, port, ddp=True)
    elif framework == "hf":
        hf(endpoint, control)
    elif framework == "lightning":
        lightning(endpoint, control)
    else:
        raise SystemExit(f"unknown framework {framework!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
