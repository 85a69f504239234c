"""The device pool read from the replica's event loop (`/state`, `/metrics`) while the step
thread reorders it (issue 23): the totals never raise mid-iteration."""

from __future__ import annotations

import sys
import threading
import time

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.targets import ResolvedTargets
from loraplex.adapters.weights import LoadedAdapter, ModuleLora

SPEC = LoraLinearSpec(0, ("q_proj",), 16, (16,))


def _adapter(i: int) -> LoadedAdapter:
    m = ModuleLora(a=torch.ones(2, 16), b=torch.ones(16, 2), scale=1.0)
    return LoadedAdapter(key=f"{i:064x}", targets=ResolvedTargets(), modules={(0, "q_proj"): m})


def test_totals_read_while_another_thread_touches_the_lru() -> None:
    pool = DevicePool([SPEC], capacity_bytes=DevicePool.bytes_per_row([SPEC], torch.float32) * 64,
                      max_lora_rank=2)  # fmt: skip
    keys = [pool.load(_adapter(i)).key for i in range(24)]
    for k in keys[:12]:
        pool.acquire(k)
    stop = threading.Event()
    errors: list[BaseException] = []

    def step_thread() -> None:
        i = 0
        while not stop.is_set():
            pool.touch(keys[i % len(keys)])
            i += 1

    def reader() -> None:
        try:
            while not stop.is_set():
                pool.used_bytes, pool.references(), pool.evictable_rows(), pool.keys()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=step_thread), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(10)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
