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

from tests.shim_helpers import SenderBook, books_of, run_script, wait_until

pytest_plugins = ["tests.shim_fixtures"]

def books_by_worker(rx: Any, expect_records: int) -> dict[str, SenderBook]:
    """Wait until ``expect_records`` records arrived, then the books by worker label."""
    wait_until(lambda: sum(b.received for b in books_of(rx.messages()).values()) >= expect_records,
               timeout_s=60)
    rx.stop()
    books = books_of(rx.messages())
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
    wait_until(lambda: sum(b.received for b in books_of(rx.messages()).values()) >= 32,
               timeout_s=60)
    rx.stop()
    books = [b for b in books_of(rx.messages()).values() if b.hellos]
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


def configure_only(workdir: Path) -> dict[str, str]:
    """Script environment where only ``configure(endpoint=...)`` names the endpoint: the
    script's main block removes the variable before it configures (a spawned child re-runs the
    module's top level, never that block), and the per-user default points into the test's
    directory, where no daemon listens."""
    return {"XDG_RUNTIME_DIR": str(workdir)}


def test_spawn_dataloader_workers_follow_configure(workdir: Path, ep: str,
                                                   receivers: Callable[..., Any]) -> None:
    """The endpoint came from ``configure()`` only: spawned DataLoader workers (fresh
    interpreters) publish there too, every one of the 256 samples, under loader labels of
    their own. They used to publish to the default endpoint: 0 of 256 arrived."""
    rx = receivers(ep)
    proc = run_script(workdir, f"""
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Samples(Dataset):
            def __len__(self):
                return 256
            def __getitem__(self, i):
                telemetry.count("samples")
                return torch.tensor([float(i)])

        if __name__ == "__main__":
            os.environ.pop("DFLASH_SIDECAR_ENDPOINT")
            telemetry.configure(endpoint={ep!r})
            loader = DataLoader(Samples(), batch_size=16, num_workers=2,
                                multiprocessing_context="spawn")
            assert sum(len(b) for b in loader) == 256
    """, ep, env=configure_only(workdir))
    wait_until(lambda: sum(b.received for b in books_of(rx.messages()).values()) >= 256,
               timeout_s=60)
    rx.stop()
    books = [b for b in books_of(rx.messages()).values() if b.hellos]
    assert sorted(b.hellos[0]["worker"] for b in books) == ["0/loader0", "0/loader1"]
    assert sum(b.received for b in books) == 256 and all(b.consistent() for b in books)
    assert "reaches no daemon" not in proc.stderr


def test_spawn_pool_terminate_after_completed_work(workdir: Path, ep: str,
                                                   receivers: Callable[..., Any]) -> None:
    """``Pool.terminate()`` of spawned counting workers (endpoint from ``configure()`` only)
    neither raises nor hangs, and the records of the work they completed and flushed arrive.
    (What a worker killed by the signal had not flushed yet is the sender tally's to count.)"""
    rx = receivers(ep)
    run_script(workdir, f"""
        import multiprocessing as mp

        def task(i):
            telemetry.count("tasks")
            assert telemetry.flush(wait_s=10)
            return i

        if __name__ == "__main__":
            os.environ.pop("DFLASH_SIDECAR_ENDPOINT")
            telemetry.configure(endpoint={ep!r})
            pool = mp.get_context("spawn").Pool(2)
            assert sum(pool.map(task, range(40), chunksize=5)) == sum(range(40))
            pool.terminate()
            pool.join()
    """, ep, env=configure_only(workdir))
    books = books_by_worker(rx, 40)
    assert 1 <= len(books) <= 2 and all(w.startswith("0/pid") for w in books)
    assert sum(b.received for b in books.values()) == 40


def test_child_that_reaches_no_daemon_says_so_once(workdir: Path, ep: str) -> None:
    """A spawned child whose endpoint has no daemon says so once on stderr, and its records are
    counted as ``no_receiver``."""
    proc = run_script(workdir, """
        import multiprocessing as mp
        import time

        def child():
            for _ in range(3):
                for _ in range(10):
                    telemetry.count("lost")
                time.sleep(0.6)  # past the connect grace: each batch is dropped
                telemetry.flush(wait_s=5)
            print(telemetry.stats()[("trainer", "0")]["dropped"])

        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(target=child)
            p.start()
            p.join()
            assert p.exitcode == 0
    """, ep)
    assert proc.stderr.count("reaches no daemon") == 1, proc.stderr
    assert proc.stdout.strip() == "{'no_receiver': 30}"


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process_children_follow_configure(method: str, workdir: Path, ep: str,
                                           receivers: Callable[..., Any]) -> None:
    """The endpoint and role ``configure()`` chose reach a child of a fresh interpreter."""
    rx = receivers(ep)
    run_script(workdir, f"""
        import multiprocessing as mp

        def child():
            for _ in range(100):
                telemetry.count("child_records")

        if __name__ == "__main__":
            os.environ.pop("DFLASH_SIDECAR_ENDPOINT")
            telemetry.configure(endpoint={ep!r}, role="drafter")
            telemetry.count("parent_records")
            p = mp.get_context({method!r}).Process(target=child)
            p.start()
            p.join()
            assert p.exitcode == 0
    """, ep, env=configure_only(workdir))
    books = books_by_worker(rx, 101)
    child = [b for w, b in books.items() if w != "0"]
    assert len(books) == 2 and len(child) == 1 and child[0].received == 100
    assert {b.hellos[0]["role"] for b in books.values()} == {"drafter"}
