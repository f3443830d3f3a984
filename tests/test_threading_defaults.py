"""ggflow's default OpenMP wait policy: a bounded spin unless the user chose one, set before libgomp loads."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ggflow import _numba_setup


@pytest.fixture
def no_wait_variables(monkeypatch):
    for name in _numba_setup.OPENMP_WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_bounded_spin_is_set_when_the_user_set_no_wait_variable(no_wait_variables):
    assert _numba_setup.choose_omp_wait_policy() == _numba_setup.SPIN_COUNT
    assert os.environ["GOMP_SPINCOUNT"] == _numba_setup.SPIN_COUNT
    assert "OMP_WAIT_POLICY" not in os.environ


def test_the_users_wait_policy_is_kept(no_wait_variables):
    no_wait_variables.setenv("OMP_WAIT_POLICY", "active")
    assert _numba_setup.choose_omp_wait_policy() is None
    assert os.environ["OMP_WAIT_POLICY"] == "active"
    assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name", ["GOMP_SPINCOUNT", "KMP_BLOCKTIME"])
def test_a_spin_setting_of_the_users_is_kept(no_wait_variables, name):
    no_wait_variables.setenv(name, "1000")
    assert _numba_setup.choose_omp_wait_policy() is None
    assert os.environ[name] == "1000"
    assert "OMP_WAIT_POLICY" not in os.environ


def test_importing_ggflow_sets_it_before_numba_loads_its_openmp_runtime():
    # libgomp reads its wait variables once, when loaded: the setting only counts if it comes first.
    code = ("import os, sys, ggflow; import ggflow.backends_builtin.cpu.products.quant_matmul; "
            "print(os.environ.get('GOMP_SPINCOUNT'), 'numba.np.ufunc.omppool' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in _numba_setup.OPENMP_WAIT_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [_numba_setup.SPIN_COUNT, "False"]


def test_numbas_openmp_runtime_spins_as_set():
    code = """
import ctypes, ggflow, numba, numpy as np
@numba.njit(parallel=True)
def bump(a):
    for i in numba.prange(a.size):
        a[i] += 1
bump(np.zeros(8))
if numba.threading_layer() != "omp":
    print("SKIP numba runs the", numba.threading_layer(), "layer, not OpenMP")
elif not hasattr(ctypes.CDLL("libgomp.so.1"), "omp_display_env"):
    print("SKIP this libgomp has no omp_display_env to report its settings")
else:
    ctypes.CDLL("libgomp.so.1").omp_display_env(1)
"""
    env = {k: v for k, v in os.environ.items() if k not in _numba_setup.OPENMP_WAIT_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout[5:].strip())
    # libgomp's own default would be 300000 (300 where threads outnumber CPUs); passive would be 0.
    assert f"GOMP_SPINCOUNT = '{_numba_setup.SPIN_COUNT}'" in out.stderr, out.stderr
