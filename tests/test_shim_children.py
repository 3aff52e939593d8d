"""Processes the trainer does not manage: multiprocessing children (fork, spawn, forkserver),
DataLoader workers and fork pool workers deliver what they queued without ``close()``, through
multiprocessing's exit path, each under its own worker label.

Each scenario is a script run in a fresh interpreter (spawn needs an importable main module)
against a real receiver process; the receiver's frames are accounted per sender.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.shim_helpers import SenderLedger, ledgers, run_script, wait_until

pytest_plugins = ["tests.shim_fixtures"]

def books_by_worker(rx: Any, expect_records: int) -> dict[str, SenderLedger]:
    """Wait until ``expect_records`` records arrived, then the ledgers by worker label."""
    wait_until(lambda: sum(b.received for b in ledgers(rx.messages()).values()) >= expect_records,
               timeout_s=60)
    rx.stop()
    books = ledgers(rx.messages())
    by_worker = {b.hellos[0]["worker"]: b for b in books.values() if b.hellos}
    assert len(by_worker) == len(books), "a sender without hello, or two with one label"
    assert all(b.consistent() for b in books.values())
    return by_worker


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_process_children_deliver_without_close(method: str, workdir: Path, ep: str,
                                                receivers: Callable[..., Any]) -> None:
    """Two children each count 1,000 records and return: all 2,000 arrive, under labels
    distinct from each other and from the parent's."""
    rx = receivers(ep)
    run_script(workdir, f"""
        import multiprocessing as mp

        def child():
            for _ in range(1000):
                telemetry.count("child_records")

        if __name__ == "__main__":
            telemetry.count("parent_records")
            ctx = mp.get_context({method!r})
            procs = [ctx.Process(target=child) for _ in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            assert [p.exitcode for p in procs] == [0, 0]
    """, ep)
    books = books_by_worker(rx, 2001)
    assert len(books) == 3 and books["0"].received == 1
    children = [b for w, b in books.items() if w != "0"]
    for book in children:
        assert book.hellos[0]["worker"] == f"0/pid{book.hellos[0]['pid']}"
        assert book.received == 1000 and {r[1] for r in book.records} == {"child_records"}
    assert len({b.hellos[0]["pid"] for b in children}) == 2


def test_dataloader_workers_deliver_every_epoch_under_loader_labels(
    workdir: Path, ep: str, receivers: Callable[..., Any],
) -> None:
    """Every record a DataLoader worker produced, up to its last moments, arrives in every
    epoch. Two epochs, two workers: four worker processes, four senders, each labelled with the
    parent's worker and its loader id."""
    rx = receivers(ep)
    run_script(workdir, """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Numbers(Dataset):
            def __len__(self):
                return 16
            def __getitem__(self, i):
                telemetry.count("items")
                return torch.tensor([float(i)])

        if __name__ == "__main__":
            loader = DataLoader(Numbers(), batch_size=4, num_workers=2,
                                multiprocessing_context="fork")
            for epoch in range(2):
                list(loader)
    """, ep)
    wait_until(lambda: sum(b.received for b in ledgers(rx.messages()).values()) >= 32,
               timeout_s=60)
    rx.stop()
    books = [b for b in ledgers(rx.messages()).values() if b.hellos]
    assert len(books) == 4
    assert sorted(b.hellos[0]["worker"] for b in books) == ["0/loader0", "0/loader0",
                                                            "0/loader1", "0/loader1"]
    assert sum(b.received for b in books) == 32


def test_fork_pool_workers_deliver_at_close_and_join(workdir: Path, ep: str,
                                                     receivers: Callable[..., Any]) -> None:
    rx = receivers(ep)
    run_script(workdir, """
        import multiprocessing as mp

        def task(i):
            telemetry.count("tasks")
            return i

        if __name__ == "__main__":
            pool = mp.get_context("fork").Pool(2)
            assert sum(pool.map(task, range(200), chunksize=10)) == sum(range(200))
            pool.close()
            pool.join()
    """, ep)
    books = books_by_worker(rx, 200)
    assert all(w.startswith("0/pid") for w in books) and len(books) <= 2
    assert sum(b.received for b in books.values()) == 200
