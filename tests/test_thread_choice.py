"""thread_choice: a product runs parallel or serial, whichever its recent calls found faster."""
from __future__ import annotations

from ggflow.backends_builtin.cpu import thread_choice
from ggflow.backends_builtin.cpu.thread_choice import PROBE_EVERY, ThreadChoice


def run_calls(choice: ThreadChoice, n: int, seconds: dict[bool, float]) -> list[bool]:
    """n calls where a parallel call takes seconds[True] and a serial one seconds[False]; the ways taken."""
    taken = []
    for _ in range(n):
        way = choice.parallel_now()
        choice.record(way, seconds[way])
        taken.append(way)
    return taken


def test_the_first_calls_try_parallel_then_serial_not_counting_either_first_call():
    choice = ThreadChoice()
    assert run_calls(choice, 4, {True: 1.0, False: 2.0}) == [True, True, False, False]
    assert choice.seconds == [2.0, 1.0]


def test_parallel_runs_while_it_is_faster_and_serial_is_probed_once_in_probe_every():
    taken = run_calls(ThreadChoice(), 4 + 4 * PROBE_EVERY, {True: 1.0, False: 2.0})[4:]
    assert taken.count(False) == 4


def test_a_busy_second_core_turns_the_choice_to_serial_and_a_free_one_back():
    choice = ThreadChoice()
    run_calls(choice, 8, {True: 1.0, False: 2.0})
    busy = run_calls(choice, 4 * PROBE_EVERY, {True: 5.0, False: 2.0})
    assert busy[-2 * PROBE_EVERY:].count(True) <= 2          # serial, but for the probes
    free = run_calls(choice, 8 * PROBE_EVERY, {True: 1.0, False: 2.0})
    assert free[-2 * PROBE_EVERY:].count(False) <= 2         # the probes saw parallel get fast again


def test_adaptive_calls_the_way_chosen_and_shares_the_choice_per_key():
    calls = []
    key = ("test", object())
    run = thread_choice.adaptive(key, lambda: calls.append("parallel"), lambda: calls.append("serial"))
    for _ in range(4):
        run()
    assert calls[:2] == ["parallel", "parallel"] and "serial" in calls[2:]
    assert thread_choice.choice_for(key).calls == 4
