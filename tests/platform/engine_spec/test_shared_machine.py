"""A CPU replica that shares its machine with the API (`loraplex up`, its launcher, `bench
serve`) leaves one core to the rest unless told otherwise; GPU replicas and replicas with an
explicit thread count are left alone."""

from __future__ import annotations

from loraplex.platform.engine_spec import EngineConfig, on_a_shared_machine


def test_a_shared_cpu_replica_leaves_one_core() -> None:
    base = EngineConfig(model="m")
    assert base.cpu_threads is None
    assert on_a_shared_machine(base, cores=2).cpu_threads == 1
    assert on_a_shared_machine(base, cores=16).cpu_threads == 15
    assert on_a_shared_machine(base, cores=1).cpu_threads == 1


def test_explicit_threads_and_gpus_are_kept() -> None:
    assert on_a_shared_machine(EngineConfig(model="m", cpu_threads=2), cores=8).cpu_threads == 2
    gpu = EngineConfig(model="m", device="cuda:0")
    assert on_a_shared_machine(gpu, cores=8) == gpu
