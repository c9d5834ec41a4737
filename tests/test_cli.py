"""The command line: subcommands, exit codes, and the demo's check against numpy."""
from __future__ import annotations

import io
import subprocess
import sys

import lightspeed as ls
from lightspeed import cli, demo


def test_version(capsys):
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"lightspeed {ls.__version__}"


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_demo_on_the_reference_backend_checks_against_numpy():
    out = io.StringIO()
    assert demo.run(backend="reference", sizes=(1, 5), out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("backend: reference")
    assert [line.split()[0] for line in lines[1:]] == ["seq=1", "seq=5"]
    assert all(line.endswith("OK") for line in lines[1:])


def test_demo_numpy_reference_is_a_softmax():
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, demo.HIDDEN)).astype(np.float32)
    g = np.ones(demo.HIDDEN, np.float32)
    w = np.eye(demo.HIDDEN, dtype=np.float32)
    y = demo.numpy_reference(x, g, w)
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-6)
    assert (np.argmax(y, -1) == np.argmax(x, -1)).all()   # identity weights keep the order of x


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "lightspeed", "version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("lightspeed ")
