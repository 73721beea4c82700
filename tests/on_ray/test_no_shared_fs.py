"""Ray on a cluster whose worker node cannot see the driver's disk (see ``noshare.py``): the model's
data file and an evaluation command's files travel through the object store, and the results equal
one process's. Skipped, with the reason, where ``unshare --mount`` is not permitted."""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys

import models_sensitivity as ms
import noshare
import numpy as np
import pytest

ray = pytest.importorskip("ray")

from quantdbg.backends import OnnxrtRunnerFactory, OrtConfig  # noqa: E402
from quantdbg.cli import main  # noqa: E402
from quantdbg.config import CalibConfig  # noqa: E402
from quantdbg.execution import RayExecutor, node_cache  # noqa: E402
from quantdbg.model import SaveConfig, save_model  # noqa: E402
from quantdbg.qdq import quantize  # noqa: E402
from quantdbg.sensitivity import SensitivityConfig, SensitivityReport, analyze_sensitivity  # noqa: E402

# The worker node cannot import this module (the tests folder is hidden from it): its functions
# travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PY = shlex.quote(sys.executable)
# Reads scale.txt, which it does not name (hence --evaluate-deps), and scores the variant by its size.
SCORE = ("import os, sys\nscale = float(open('scale.txt').read())\n"
         "print(os.path.getsize(sys.argv[1]) * scale)\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    refusal = noshare.unshare_refusal()
    if refusal is not None:
        pytest.skip(f"the worker node cannot be given its own mounts here: {refusal}")
    assert not ray.is_initialized()
    with noshare.cluster(noshare.hidden_folders(tmp_path_factory.getbasetemp())) as address:
        yield address


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """small_cnn with its weights in a data file, its data, and an evaluation script: the driver's
    files, in a folder the worker node cannot see."""
    folder = tmp_path_factory.mktemp("driver")
    save_model(ms.small_cnn(), folder / "model.onnx", SaveConfig(external_data=True, size_threshold=0))
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", x=rng.standard_t(3, size=(40, 3, 8, 8)).astype(np.float32))
    np.savez(folder / "eval.npz", x=rng.standard_normal((24, 3, 8, 8)).astype(np.float32))
    (folder / "score.py").write_text(SCORE)
    (folder / "scale.txt").write_text("0.5\n")
    return folder


def _where(_shared, path: str) -> tuple[bool, str]:
    return os.path.exists(path), ray.get_runtime_context().get_node_id()


def _cached(_shared, _item) -> list[tuple[str, int, int]]:
    """The files of this node's cache: (path inside the cache, size, modification time)."""
    root = node_cache.cache_root()
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def test_tasks_run_on_a_node_that_cannot_see_the_drivers_files(cluster, work):
    found = RayExecutor(cluster).map(_where, [str(work / "model.onnx"), str(noshare.TESTS / "conftest.py")])
    driver = ray.get_runtime_context().get_node_id()
    assert [seen for seen, _ in found] == [False, False]
    assert all(node != driver for _, node in found)


def test_sharded_calibration_of_a_lazy_model_is_byte_identical(cluster, work):
    serial = quantize(work / "model.onnx", work / "calib.npz", CalibConfig(method="entropy"), batch_size=8)
    executor = RayExecutor(cluster)
    calib = CalibConfig(method="entropy", executor=executor, shards=2)
    sharded = quantize(work / "model.onnx", work / "calib.npz", calib, batch_size=8)
    assert sharded.model.SerializeToString() == serial.model.SerializeToString()
    assert sharded.calibration.stats == serial.calibration.stats
    (shipped,) = executor.shipments
    size = (work / "model.onnx.data").stat().st_size
    assert shipped.tasks == 2 and shipped.files == shipped.new_files == size  # the data file, once


def _sweep(work, executor=None):
    model, data = str(work / "model.onnx"), str(work / "eval.npz")
    qmodel = quantize(model, work / "calib.npz", CalibConfig(method="minmax"), batch_size=8)
    config = SensitivityConfig(mode="isolated", evidence=False, executor=executor)
    report = analyze_sensitivity(model, qmodel, data, config,
                                 runner_factory=OnnxrtRunnerFactory(OrtConfig(intra_op_num_threads=1)))
    return dataclasses.replace(report, seconds=0.0, footprint=None)  # this run's wall time and memory


def test_an_isolated_sweep_equals_one_process_and_each_node_writes_the_data_file_once(cluster, work):
    executor = RayExecutor(cluster)
    serial = _sweep(work)
    assert _sweep(work, executor) == serial
    cached = executor.map(_cached, [0])[0]
    assert _sweep(work, executor) == serial  # a second run: the files are neither put nor written again
    size = (work / "model.onnx.data").stat().st_size
    assert [s.new_files for s in executor.shipments if s.tasks > 1] == [size, 0]
    assert executor.map(_cached, [0])[0] == cached
    assert [n for name, n, _ in cached if name.endswith("/model.onnx.data")] == [size]


def _analyze(capsys, work, out, command, *extra):
    argv = ["analyze", "model.onnx", "--data", "calib.npz", "--eval", "eval.npz", "--method", "minmax",
            "--mode", "isolated", "--evaluate", command, "--out", out, *extra]
    code = main(argv)
    return code, capsys.readouterr().err


def test_an_evaluation_script_only_the_driver_has_travels_with_its_files(cluster, work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    command = f"{PY} score.py {{model}}"
    assert _analyze(capsys, work, "here.json", command, "--evaluate-deps", "scale.txt")[0] == 0
    code, err = _analyze(capsys, work, "ray.json", command, "--evaluate-deps", "scale.txt", "--ray", cluster)
    assert (code, err) == (0, "")
    here, spread = SensitivityReport.read(work / "here.json"), SensitivityReport.read(work / "ray.json")
    assert spread.ranking == here.ranking
    assert [layer.value for layer in spread.layers] == [layer.value for layer in here.layers]
    assert len({layer.value for layer in here.layers}) > 1  # the variants' sizes differ: each was scored


def test_a_file_outside_the_commands_folder_is_refused_in_one_line(cluster, work, capsys, monkeypatch,
                                                                    tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "table.txt"
    elsewhere.write_text("1\n")
    monkeypatch.chdir(work)
    code, err = _analyze(capsys, work, "refused.json", f"{PY} score.py {{model}} {elsewhere}",
                         "--evaluate-deps", "scale.txt", "--ray", cluster)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(
        f"quantdbg analyze: error: Evaluation command {PY} score.py {{model}} {elsewhere}"[:40])
    assert (f"reads '{elsewhere}', which cluster node" in err and f"only files under the command's working "
            f"directory '{work}' travel to the nodes; move it there and name it relative to it" in err)
