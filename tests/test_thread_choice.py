"""thread_choice: a product runs parallel or serial, whichever its recent calls found faster."""
from __future__ import annotations

from ggflow.backends_builtin.cpu import thread_choice
from ggflow.backends_builtin.cpu.thread_choice import FIRST_PROBE_AFTER, LAST_PROBE_AFTER, OUTLIER, ThreadChoice


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
    assert choice.seconds == [2.0, 1.0] and choice.faster


def test_probes_that_keep_losing_come_less_and_less_often():
    choice = ThreadChoice()
    taken = run_calls(choice, 4 + 2000, {True: 1.0, False: 2.0})[4:]
    probes = [i for i, way in enumerate(taken) if not way]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[0] == FIRST_PROBE_AFTER * 2 and gaps[-1] == LAST_PROBE_AFTER
    assert gaps == sorted(gaps)


def test_a_busy_second_core_turns_the_choice_to_serial_and_one_winning_probe_turns_it_back():
    choice = ThreadChoice()
    run_calls(choice, 8, {True: 1.0, False: 2.0})
    run_calls(choice, 40, {True: 5.0, False: 2.0})
    assert not choice.faster                                  # busy: serial
    busy = run_calls(choice, 200, {True: 5.0, False: 2.0})
    assert busy.count(True) <= 200 // FIRST_PROBE_AFTER       # but for the probes
    free = run_calls(choice, 2 * LAST_PROBE_AFTER, {True: 1.0, False: 2.0})
    assert free[-LAST_PROBE_AFTER // 2:].count(False) <= 1    # the first probe saw parallel fast again


def test_one_preempted_call_does_not_turn_the_choice_but_a_run_of_them_does():
    choice = ThreadChoice()
    run_calls(choice, 8, {True: 1.0, False: 1.4})
    run_calls(choice, 1, {True: 10.0, False: 1.4})           # a parallel call that lost its core for a slice
    assert choice.faster and choice.seconds[1] <= 1.0 + 0.25 * (OUTLIER - 1) + 1e-9
    run_calls(choice, 20, {True: 1.0, False: 1.4})
    assert choice.faster
    run_calls(choice, 3, {True: 10.0, False: 1.4})           # the neighbour stays: three slow calls in a row
    assert not choice.faster


def run_until_probe_in(choice: ThreadChoice, calls: int, seconds: dict[bool, float]) -> None:
    """Calls of the way in use until the next probe is ``calls`` calls away."""
    for _ in range(10 * LAST_PROBE_AFTER):
        if choice.until_probe == calls:
            return
        run_calls(choice, 1, seconds)
    raise AssertionError("no probe came")


def test_a_probe_must_beat_the_way_in_use_now_not_its_time_from_a_slower_moment():
    # the memory's rate moves: one-token products take 1.5x longer for a while, then speed up again
    choice = ThreadChoice()
    run_calls(choice, 40, {True: 1.5, False: 2.4})           # a slow moment: parallel 1.5, serial 2.4
    run_until_probe_in(choice, 2, {True: 1.5, False: 2.4})
    fast = {True: 1.0, False: 1.3}                            # then a fast one
    assert run_calls(choice, 2, fast) == [True, False]        # one parallel call, then the probe of serial
    assert choice.faster                  # 1.3 beat parallel's running time (1.375), not its last call (1.0)
    assert choice.seconds[0] >= choice.seconds[1]
    assert run_calls(choice, 4 * FIRST_PROBE_AFTER, fast).count(False) <= 1


def test_the_way_in_use_slowing_past_the_others_time_probes_the_other_at_once_and_only_once():
    choice = ThreadChoice()
    run_calls(choice, 4 + 3 * LAST_PROBE_AFTER, {True: 1.0, False: 1.6})   # probes every LAST_PROBE_AFTER calls now
    slow = {True: 1.8, False: 2.9}                                         # everything slower, parallel still ahead
    taken = run_calls(choice, 100, slow)
    first_probe = taken.index(False)
    assert first_probe < 10                        # parallel's running time passed serial's 1.6: tried at once
    assert taken.count(False) == 1 and choice.faster   # it lost, so serial's 2.9 stands and no probe follows
    busy = {True: 5.0, False: 2.9}                 # a busy neighbour: the same path turns it to serial
    taken = run_calls(choice, 20, busy)
    assert taken.index(False) < 6 and not choice.faster


def test_adaptive_calls_the_way_chosen_with_the_arguments_and_shares_the_choice_per_key():
    calls = []
    key = ("test", object())
    run = thread_choice.adaptive(key, lambda v: calls.append(("parallel", v)), lambda v: calls.append(("serial", v)))
    for i in range(4):
        run(i)
    assert calls[:2] == [("parallel", 0), ("parallel", 1)] and calls[2:] == [("serial", 2), ("serial", 3)]
    assert thread_choice.choice_for(key).seen == [2, 2]
