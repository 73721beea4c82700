"""Every command of README.md runs as written: in an empty folder, after `quantdbg demo --export .`,
each exits 0 and writes the files its flags name (they are deleted first, so the command made them).

The set-up lines that create virtual environments are the only ones left out.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from quantdbg.demo import load_embedded

README = Path(__file__).resolve().parents[1] / "README.md"
# Flags whose value is a file the command writes ("-" for --md prints instead).
_WRITES = {"--out", "-o", "--output", "--plan", "--html", "--md", "--json", "--cache", "--calibration-cache",
           "--calib", "--scales"}
_EXPORTED = ("model.onnx", "calib.npz", "eval.npz", "score.py")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def readme_commands() -> list[str]:
    """The shell commands of README.md's bash blocks (continuation lines joined), minus venv set-up."""
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.startswith("python3 -m venv"):
                commands.append(" ".join(line.split()))
    return commands


def written_by(command: str) -> list[str]:
    """The files ``command`` says it writes: the values of its output flags, the files of --export."""
    words = shlex.split(command)
    files = [value for flag, value in zip(words, words[1:], strict=False) if flag in _WRITES and value != "-"]
    if "--export" in words:
        folder = words[words.index("--export") + 1]
        files += [os.path.join(folder, name) for name in _EXPORTED]
    return files


def test_the_readme_lists_the_commands_it_documents():
    commands = readme_commands()
    assert commands[0] == "quantdbg demo --export ."
    subcommands = {c.split()[1] for c in commands if c.startswith("quantdbg ")}
    assert subcommands == {"demo", "calibrate", "analyze", "fallback", "auto", "apply", "lint", "doctor",
                           "report"}
    assert written_by("quantdbg calibrate m.onnx --data c.npz -o a.onnx --calib c.cache") == [
        "a.onnx", "c.cache"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    # The commands run as a user types them: `quantdbg` and `python` from this environment.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, shell=True, executable="/bin/bash", cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_every_readme_command_runs_as_written(folder):
    for command in readme_commands():
        outputs = [folder / name for name in written_by(command)]
        for path in outputs:
            path.unlink(missing_ok=True)
        done = _run(command, folder)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        missing = [str(path.name) for path in outputs if not path.is_file() or path.stat().st_size == 0]
        assert not missing, f"{command} did not write {missing}"
        if command == "python score.py model.onnx":
            # one number: the FP32 model's top-1 accuracy on the 540 evaluation images
            assert re.fullmatch(r"0\.99\d*\n", done.stdout), done.stdout


def test_exported_data_has_the_layout_the_readme_describes(folder):
    if not (folder / "eval.npz").is_file():
        assert _run("quantdbg demo --export .", folder).returncode == 0
    embedded = load_embedded()
    with np.load(folder / "calib.npz") as calib, np.load(folder / "eval.npz") as evals:
        assert calib.files == ["input"] and calib["input"].dtype == np.float32
        assert calib["input"].shape == (256, 1, 16, 16)
        np.testing.assert_array_equal(calib["input"], embedded.calib["input"])
        assert sorted(evals.files) == ["input", "labels"] and evals["input"].shape == (540, 1, 16, 16)
        np.testing.assert_array_equal(evals["labels"], embedded.labels)
    assert (folder / "model.onnx").read_bytes() == embedded.model_path.read_bytes()


def test_the_readme_python_runs_as_written(folder):
    python, _ = _blocks("python")  # the second, Scaling out, has its own test
    written = re.findall(r"\.(?:save|write)\(\"([^\"]+)\"\)", python)
    assert written == ["model_int8.onnx", "plan.json"]
    if not (folder / "eval.npz").is_file():
        assert _run("quantdbg demo --export .", folder).returncode == 0
    for name in written:
        (folder / name).unlink(missing_ok=True)
    (folder / "snippet.py").write_text(python)
    done = _run(f"{shlex.quote(sys.executable)} snippet.py", folder)
    assert done.returncode == 0, done.stderr
    assert all((folder / name).is_file() for name in written)
    assert "relative loss <= 1 %" in done.stdout  # the verdict it prints


def test_the_scaling_out_python_runs_as_written_and_matches_one_process(folder):
    pytest.importorskip("ray")
    _, scaling_out = _blocks("python")
    if not (folder / "eval.npz").is_file():
        assert _run("quantdbg demo --export .", folder).returncode == 0
    # The same analysis in this process: the Ray run ranks the layers identically, with the same scores
    # up to ONNX Runtime's thread count (one per Ray worker, every core here: summation order).
    check = ("\nserial = analyze_sensitivity('model.onnx', quantize('model.onnx', 'calib.npz', "
             "CalibConfig(method='entropy')), 'eval.npz', SensitivityConfig(mode='isolated'))\n"
             "import numpy as np\n"
             "assert [x.node for x in report.layers] == [x.node for x in serial.layers]\n"
             "np.testing.assert_allclose([x.score for x in report.layers], [x.score for x in serial.layers], "
             "rtol=1e-6)\n"
             "print('same as one process')\n")
    (folder / "scaling_out.py").write_text(scaling_out + check)
    done = _run(f"{shlex.quote(sys.executable)} scaling_out.py", folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("same as one process")


def test_every_test_the_readme_points_at_exists():
    """The guarantees point at the tests that hold them: each named test is a test function there."""
    root = README.parent
    pointed = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", README.read_text())
    assert len(pointed) >= 6
    for path, name in pointed:
        assert re.search(rf"^def {name}\(", (root / path).read_text(), flags=re.M), f"{path}::{name}"
    anchors = re.findall(r"\(benchmarks/RESULTS\.md#([\w-]+)\)", README.read_text())
    results = (root / "benchmarks" / "RESULTS.md").read_text()
    headings = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", results, flags=re.M)}
    assert set(anchors) <= headings
