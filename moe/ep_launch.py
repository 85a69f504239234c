"""Start an expert-parallel group: one process per rank, torch.distributed over loopback.

`run_ep_group(n, fn, *args)` spawns `n` ranks, initialises the process group (the backend
matches the device: gloo for CPU tensors, NCCL for CUDA with one rank per GPU; see
`ep_backend`) on a free loopback port, calls
`fn(ep, *args)` on each rank and returns the per-rank results. `StepChannel` carries the
leader's per-step inputs to follower ranks, so the engine (rank 0: scheduler, server)
and the followers run the same forward passes.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loraplex.moe.expert_parallel import ExpertParallelGroup, set_process_ep_group

_STOP = "__loraplex_ep_stop__"


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the rendezvous store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ep_backend(device: str, world_size: int) -> str:
    """The torch.distributed backend for `world_size` ranks computing on `device`.

    gloo for CPU tensors (even on a host with GPUs); NCCL for CUDA, one rank per GPU: fewer
    visible GPUs than ranks is refused (NCCL cannot share one GPU between ranks).
    """
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"expert parallelism: unknown device {device!r}") from exc
    if kind == "cpu":
        return "gloo"
    if kind != "cuda":
        raise ValueError(f"expert parallelism runs on cpu or cuda devices, not {device!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < world_size:
        raise ValueError(
            f"expert parallelism with {world_size} ranks on {device!r} needs {world_size} GPUs "
            f"(one rank per GPU), but this host shows {gpus}: lower --ep-size to at most "
            f"{gpus} or use --device cpu"
        )
    return "nccl"


def init_ep_rank(rank: int, world_size: int, port: int, backend: str) -> ExpertParallelGroup:
    """Join the group as `rank` (for NCCL on GPU `rank`); it becomes the process's EP group."""
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one rank per GPU (`ep_backend` checked there are enough)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
    )
    ep = ExpertParallelGroup()
    set_process_ep_group(ep)
    return ep


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        ep = init_ep_rank(rank, world_size, port, backend)
        try:
            # Plain pickle: tensors travel by value, not as shared fds that die with the rank.
            results.put((rank, True, pickle.dumps(fn(ep, *args))))
        finally:
            set_process_ep_group(None)
            dist.destroy_process_group()
    except BaseException:  # report every failure to the parent, which re-raises
        results.put((rank, False, traceback.format_exc()))


def run_ep_group(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    backend: str | None = None,
    device: str = "cpu",
    timeout_s: float = 120.0,
) -> list[Any]:
    """Run `fn(ep, *args)` on `world_size` spawned ranks; return results ordered by rank.

    `fn` and `args` must be picklable (a module-level function). Any rank's exception is
    re-raised here as RuntimeError with that rank's traceback.
    """
    if world_size < 1:
        raise ValueError(f"ep size must be >= 1, got {world_size}")
    backend = backend or ep_backend(device, world_size)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_loopback_port()
    procs = [
        ctx.Process(
            target=_rank_main, args=(r, world_size, port, backend, fn, args, results), daemon=True
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    failures: list[str] = []
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                failures.append(f"no answer from some rank within {timeout_s}s")
                break
            if ok:
                out[rank] = pickle.loads(value)
            else:
                failures.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        # The first rank to crash is usually the cause; peers then see closed connections.
        raise RuntimeError("expert-parallel group failed:\n" + "\n".join(failures))
    return [out[r] for r in range(world_size)]


class StepChannel:
    """Leader -> followers broadcast of each step's inputs (any picklable object)."""

    def __init__(self, ep: ExpertParallelGroup, leader: int = 0) -> None:
        self.ep = ep
        self.leader = leader

    def send(self, step: Any) -> None:
        """Leader: hand this step's inputs to every follower."""
        dist.broadcast_object_list([step], src=self.leader, group=self.ep.group)

    def send_each(self, items: list[Any]) -> None:
        """Leader: hand rank r `items[r]` (the leader's own entry is ignored); point to point,
        so a follower receives only its own."""
        out: list[Any] = [None]
        dist.scatter_object_list(out, items, src=self.leader, group=self.ep.group)

    def receive_own(self) -> Any:
        """Follower: what the leader's `send_each` holds for this rank."""
        out: list[Any] = [None]
        dist.scatter_object_list(out, None, src=self.leader, group=self.ep.group)
        return out[0]

    def stop(self) -> None:
        """Leader: tell followers to leave their loop."""
        self.send(_STOP)

    def follow(self, execute: Callable[[Any], Any]) -> int:
        """Follower: run `execute(step)` for every step the leader sends; returns steps run."""
        steps = 0
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=self.leader, group=self.ep.group)
            if isinstance(box[0], str) and box[0] == _STOP:
                return steps
            execute(box[0])
            steps += 1
