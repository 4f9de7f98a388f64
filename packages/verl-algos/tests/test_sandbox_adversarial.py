"""Runs the code sandbox's adversarial table (tests/adversarial/sandbox_cases.py): every attack a
program can try, and what must happen, checked with real processes."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox is Linux-only")

if sys.platform.startswith("linux"):
    from adversarial.sandbox_cases import CASES, LIMITS, Env, markdown_table

    from verl.algos.rewards.code import CodeReward
    from verl.algos.rewards.sandbox import Sandbox
else:  # pragma: no cover
    CASES = []


@pytest.fixture(scope="module")
def shared():
    sandbox = Sandbox(LIMITS)
    sandbox.check()
    return sandbox, CodeReward(LIMITS, max_workers=2)


@pytest.fixture
def env(shared):
    """A fresh world-writable directory, and a private scratch root so that leftovers are this
    case's own (other tests may run sandboxes at the same time)."""
    open_dir = tempfile.mkdtemp(prefix="verl-sandbox-attack-")
    os.chmod(open_dir, 0o777)
    scratch_root = tempfile.mkdtemp(prefix="verl-sandbox-scratch-")
    os.chmod(scratch_root, 0o711)
    previous, tempfile.tempdir = tempfile.tempdir, scratch_root
    try:
        yield Env(*shared, open_dir=open_dir, scratch_root=scratch_root)
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(open_dir, ignore_errors=True)
        shutil.rmtree(scratch_root, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_attack(case, env):
    case.check(env)
    assert env.leftovers() == [], f"{case.name} left a scratch folder behind"


def test_the_table_says_what_is_tried_and_what_must_happen():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) >= 25
    for c in CASES:
        assert c.tried.strip() and c.must.strip(), c.name
    table = markdown_table()
    assert all(f"`{name}`" in table for name in names)
