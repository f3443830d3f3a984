"""The CPU backend's thread count follows the load: other processes' busy cores are taken out of a plan's threads."""
from __future__ import annotations

import os

import pytest

from ggflow.backends_builtin.cpu import spare_cores, thread_choice
from ggflow.backends_builtin.cpu.spare_cores import INTERVAL, SpareCores, cpu_seconds

TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def stat_text(per_cpu_busy_idle: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat with the given (busy, idle) ticks per CPU: busy split over user and system, a little iowait
    and steal, so that the parser has to know which fields are which."""
    lines = ["cpu  1 2 3 4 5 6 7 8 9 10"]
    for cpu, (busy, idle) in per_cpu_busy_idle.items():
        user, system, steal = busy // 2, busy - busy // 2 - 1, 1
        lines.append(f"cpu{cpu} {user} 0 {system} {idle} 3 0 0 {steal} 0 0")
    lines += ["intr 12345 0 1", "ctxt 999", "btime 1700000000"]
    return "\n".join(lines) + "\n"


class FakeHost:
    """A clock, /proc/stat and the process's own CPU time that a test moves forward."""

    def __init__(self, cpus=(0, 1)):
        self.now = 100.0
        self.ticks = {c: [0, 0] for c in cpus}   # busy, idle (iowait counted apart in stat_text)
        self.own = 0.0

    def advance(self, seconds: float, others: dict[int, float], own: dict[int, float]) -> None:
        """Each CPU busy with others' work for others[cpu] of the time and with ours for own[cpu]."""
        self.now += seconds
        for cpu, t in self.ticks.items():
            busy = others.get(cpu, 0.0) + own.get(cpu, 0.0)
            t[0] += round(busy * seconds / TICK)
            t[1] += round((1 - busy) * seconds / TICK)
        self.own += sum(own.values()) * seconds

    def stat(self) -> str:
        return stat_text({c: (b, i) for c, (b, i) in self.ticks.items()})

    def cores(self, cpus=frozenset({0, 1})) -> SpareCores:
        return SpareCores(read_stat=self.stat, own_cpu_seconds=lambda: self.own, clock=lambda: self.now, cpus=cpus)


def test_cpu_seconds_reads_busy_and_total_of_the_chosen_cpus_only():
    text = stat_text({0: (40, 60), 1: (10, 90), 2: (100, 0)})
    busy, total = cpu_seconds(text, frozenset({0, 1}), TICK)
    # busy: user + system + steal (+ the 3 ticks of iowait are idle); total adds idle and iowait.
    assert busy == pytest.approx((40 + 10) * TICK)
    assert total == pytest.approx((40 + 60 + 3 + 10 + 90 + 3) * TICK)


def test_a_quiet_machine_keeps_every_thread_and_a_busy_core_takes_one_back():
    host = FakeHost()
    cores = host.cores()
    assert cores.threads(2) == 2                      # no reading yet: what was asked
    host.advance(0.2, others={}, own={0: 1.0, 1: 0.9})  # our two threads (spinning ones too) are not others
    assert cores.threads(2) == 2
    host.advance(0.2, others={1: 0.8}, own={0: 1.0, 1: 0.2})
    assert cores.threads(2) == 1
    assert cores.threads(4) == 1 and cores.threads(1) == 1
    host.advance(0.2, others={}, own={0: 1.0})        # the neighbour stopped: the core comes back
    assert cores.threads(2) == 2


def test_a_little_load_does_not_cost_a_thread_and_two_busy_cores_leave_one():
    host = FakeHost(cpus=(0, 1, 2, 3))
    cores = host.cores(frozenset({0, 1, 2, 3}))
    host.advance(0.5, others={2: 0.2}, own={0: 1.0})
    assert cores.threads(4) == 4                      # 0.2 of a core is under BUSY_FRACTION
    host.advance(0.5, others={1: 1.0, 2: 0.9}, own={0: 1.0})
    assert cores.threads(4) == 2
    host.advance(0.5, others={c: 1.0 for c in range(4)}, own={})
    assert cores.threads(4) == 1                      # never fewer than one


def test_readings_wait_for_the_interval():
    host = FakeHost()
    cores = host.cores()
    host.advance(INTERVAL / 2, others={1: 1.0}, own={0: 1.0})
    assert cores.threads(2) == 2                      # too soon to read again: the last answer stands
    host.advance(INTERVAL, others={1: 1.0}, own={0: 1.0})
    assert cores.threads(2) == 1


def test_cpus_outside_the_affinity_mask_do_not_count():
    host = FakeHost(cpus=(0, 1, 2))
    cores = host.cores(frozenset({0, 1}))
    host.advance(0.5, others={2: 1.0}, own={0: 1.0, 1: 1.0})
    assert cores.threads(2) == 2


def test_without_proc_stat_the_plan_keeps_its_threads():
    cores = SpareCores(read_stat=lambda: None, own_cpu_seconds=lambda: 0.0, cpus=frozenset({0, 1}))
    assert cores.threads(2) == 2 and cores.threads(7) == 7


def test_without_an_affinity_mask_or_proc_stat_the_plan_keeps_its_threads(monkeypatch):
    # macOS: no os.sched_getaffinity and no /proc/stat; making the reader must not fail there
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(spare_cores, "_read_proc_stat", lambda: None)
    cores = SpareCores()
    assert cores.cpus == frozenset(range(os.cpu_count() or 1))
    assert cores.threads(2) == 2 and cores.threads(5) == 5


def test_threads_now_can_be_turned_off_and_records_the_count_in_use(monkeypatch):
    monkeypatch.setattr(spare_cores, "ENABLED", False)
    assert spare_cores.threads_now(3) == 3 and spare_cores.in_use == 3
    monkeypatch.setattr(spare_cores, "ENABLED", True)
    assert spare_cores.threads_now(1) == 1 and spare_cores.in_use == 1


def test_a_product_that_chooses_its_way_runs_serially_while_the_plan_has_one_thread(monkeypatch):
    calls = []
    run = thread_choice.adaptive(("test_spare_cores", 1), lambda: calls.append("parallel"),
                                 lambda: calls.append("serial"))
    monkeypatch.setattr(spare_cores, "in_use", 1)
    for _ in range(40):
        run()
    assert calls == ["serial"] * 40
    monkeypatch.setattr(spare_cores, "in_use", 2)
    run()
    assert calls[-1] == "parallel"                    # a new size tries parallel first


def test_a_plan_runs_on_the_threads_the_load_leaves(monkeypatch):
    numba = pytest.importorskip("numba")
    from ggflow.backends_builtin.cpu.backend import CPUPlan
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here: nothing to take back")
    seen = []
    monkeypatch.setattr(spare_cores, "threads_now", lambda wanted: 1)
    CPUPlan([lambda: seen.append(numba.get_num_threads())], n_threads=2)()
    monkeypatch.setattr(spare_cores, "threads_now", lambda wanted: wanted)
    CPUPlan([lambda: seen.append(numba.get_num_threads())], n_threads=2)()
    assert seen == [1, 2]
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS   # restored after the plan
    assert spare_cores.in_use == 0                                     # and no plan is running
