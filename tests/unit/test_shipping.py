"""Packing objects for nodes that cannot see the driver's disk, without a cluster: a dict plays the
object store, another folder the node's temporary folder, and the driver's folder is moved away
before the object arrives (so reading from it would fail)."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import stat
import sys
import time

import models_sensitivity as ms
import numpy as np
import pytest

pytest.importorskip("ray")  # the packer pickles with Ray's cloudpickle

from quantdbg._fingerprint import digest  # noqa: E402
from quantdbg.errors import BackendError, ConfigError  # noqa: E402
from quantdbg.evaluation import CommandMetric  # noqa: E402
from quantdbg.execution import RayExecutor, node_cache  # noqa: E402
from quantdbg.execution.shipping import Packer, local_path, pack, unpack  # noqa: E402
from quantdbg.model import SaveConfig, load_model, save_model  # noqa: E402
from quantdbg.model.external import base_of, is_external, tensor_array  # noqa: E402


class Store:
    """The object store: put keeps a copy, get counts the reads."""

    def __init__(self) -> None:
        self.objects: dict[int, bytes] = {}
        self.gets = 0

    def put(self, array: np.ndarray) -> int:
        self.objects[len(self.objects)] = array.tobytes()
        return len(self.objects) - 1

    def get(self, ref: int) -> bytes:
        self.gets += 1
        return self.objects[ref]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The node's temporary folder (the cache lives there)."""
    folder = tmp_path / "node-tmp"
    folder.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    return folder


@pytest.fixture
def lazy(tmp_path):
    """small_cnn saved with its weights in a data file, loaded lazily, and its weights' values."""
    driver = tmp_path / "driver"
    driver.mkdir()
    save_model(ms.small_cnn(), driver / "m.onnx", SaveConfig(external_data=True, location="w.bin",
                                                            size_threshold=0))
    model = load_model(driver / "m.onnx")
    values = {t.name: tensor_array(t) for t in model.graph.initializer}
    assert any(is_external(t) for t in model.graph.initializer)
    return driver, model, values


def _external(model):
    return [t for t in model.graph.initializer if is_external(t)]


def _hide(folder):
    """Moves the driver's folder away: from now on only the node's copy can be read."""
    hidden = folder.with_name(folder.name + "-hidden")
    folder.rename(hidden)
    return hidden


def test_a_lazy_model_arrives_reading_the_nodes_copy_of_its_data_file(lazy, node):
    driver, model, values = lazy
    before = model.SerializeToString()
    store = Store()
    packer = Packer(store.put, "driver-node", {})
    parcel = pack({"model": model}, packer)
    assert model.SerializeToString() == before  # the driver's model is left as it was
    size = (driver / "w.bin").stat().st_size
    assert packer.new_bytes == size == sum(len(b) for b in store.objects.values())
    assert len(parcel.payload) < size  # the weights travel as the file's pieces, not in the pickle
    _hide(driver)
    arrived, folders = unpack(parcel, store.get, "worker-node")
    copy = node_cache.cache_root() / parcel.folders[0].digest
    assert folders == (copy,) and (copy / "w.bin").read_bytes() == (driver.with_name("driver-hidden")
                                                                    / "w.bin").read_bytes()
    assert {base_of(t) for t in _external(arrived["model"])} == {str(copy)}
    for tensor in arrived["model"].graph.initializer:
        np.testing.assert_array_equal(tensor_array(tensor), values[tensor.name])


def test_files_travel_once_per_executor_and_are_written_once_per_node(lazy, node):
    driver, model, _ = lazy
    store, known = Store(), {}
    first = pack(model, Packer(store.put, "driver-node", known))
    again = Packer(store.put, "driver-node", known)
    second = pack([model, model], again)  # a later map of the same executor
    assert again.new_bytes == 0 and len(store.objects) == 1  # one piece, put once
    assert second.pieces == first.pieces
    unpack(first, store.get, "worker-node")
    reads = store.gets
    copy = node_cache.cache_root() / first.folders[0].digest / "w.bin"
    written = copy.stat().st_mtime_ns
    one, other = unpack(second, store.get, "worker-node")[0]
    assert store.gets == reads == 1  # the node's copy serves every later arrival
    assert copy.stat().st_mtime_ns == written
    assert {base_of(t) for t in _external(one) + _external(other)} == {str(copy.parent)}


def test_a_file_of_several_pieces_is_joined_in_order(tmp_path, node, monkeypatch):
    monkeypatch.setattr("quantdbg.execution.shipping.PIECE_BYTES", 1000)
    data = np.random.default_rng(0).integers(0, 256, 4500, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(data)
    store = Store()
    packer = Packer(store.put, "driver-node", {})
    folder = packer.folder({"sub/blob": tmp_path / "blob"}, tmp_path)
    assert len(store.objects) == 5  # 4 pieces of 1000 bytes and one of 500

    class Reader:  # a rebuilt object that asks for its folder's local path on arrival
        def __reduce__(self):
            return local_path, (folder,)

    path = unpack(pack(Reader(), packer), store.get, "worker-node")[0]
    assert (path / "sub" / "blob").read_bytes() == data


def test_a_damaged_piece_is_refused_and_leaves_no_folder(lazy, node):
    driver, model, _ = lazy
    store = Store()
    parcel = pack(model, Packer(store.put, "driver-node", {}))
    store.objects[0] = b"\0" + store.objects[0][1:]
    with pytest.raises(BackendError, match=r"^File 'w\.bin' arrived on this node damaged \(its digest "
                                           r"differs from the driver's\); run the command again\.$"):
        unpack(parcel, store.get, "worker-node")
    assert [p.name for p in node_cache.cache_root().iterdir() if p.is_dir()] == []


def test_on_the_drivers_node_files_are_read_in_place(lazy, node):
    driver, model, _ = lazy
    store = Store()
    packer = Packer(None, "driver-node", {})  # no other node in the cluster: nothing is put
    parcel = pack(model, packer)
    assert store.objects == {} and packer.new_bytes == 0 and parcel.pieces == {}
    arrived, folders = unpack(parcel, store.get, "driver-node")
    assert folders == () and {base_of(t) for t in _external(arrived)} == {str(driver.resolve())}
    with pytest.raises(BackendError, match=r"were not sent to this node: it joined the cluster after the "
                                           r"work started; run the command again\.$"):
        unpack(parcel, store.get, "late-node")


def _materialise_slowly(content: str, pieces: list[bytes], log, start) -> None:
    """In a child process: the node's copy of a one-file folder, each piece read slowly and logged."""
    def get(index: int) -> bytes:
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(0.05)
        return pieces[index]

    start.wait()
    node_cache.materialise("folder", [("w.bin", content, 0o644)], {content: range(len(pieces))}, get)


def test_workers_of_one_node_write_a_folder_once_and_the_others_wait_for_it(tmp_path, node):
    pieces = [b"a" * 10, b"b" * 10, b"c" * 10]
    context = multiprocessing.get_context("fork")
    start, log = context.Barrier(3), tmp_path / "reads.log"
    args = (digest(b"".join(pieces)), pieces, log, start)
    workers = [context.Process(target=_materialise_slowly, args=args) for _ in range(2)]
    for worker in workers:
        worker.start()
    start.wait()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0]
    readers = log.read_text().split()
    assert len(readers) == len(pieces) and len(set(readers)) == 1  # one worker wrote, the other waited
    assert (node_cache.cache_root() / "folder" / "w.bin").read_bytes() == b"".join(pieces)

def test_a_stale_cached_folder_goes_when_another_is_written(lazy, node, tmp_path):
    driver, model, _ = lazy
    old = node_cache.cache_root() / "0123456789abcdef"
    old.mkdir()
    os.utime(old, (0, 0))
    store = Store()
    unpack(pack(model, Packer(store.put, "driver-node", {})), store.get, "worker-node")
    assert not old.exists()


def test_a_name_leaving_its_folder_cannot_travel(tmp_path):
    (tmp_path / "f").write_text("x")
    packer = Packer(Store().put, "driver-node", {})
    for name in ("../f", "/abs/f", ""):
        with pytest.raises(ConfigError, match=r"cannot travel to a cluster node: name it by a path inside "
                                              r"its folder\.$"):
            packer.folder({name: tmp_path / "f"}, tmp_path)


@pytest.fixture
def command_folder(tmp_path):
    """A working directory with an executable script and a data file the script reads."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "score.sh").write_text("#!/bin/sh\necho 1\n")
    (work / "score.sh").chmod(0o750)
    (work / "data" / "labels.txt").write_text("3 1 4\n")
    (work / "helper.py").write_text("X = 1\n")
    return work


def test_an_evaluation_command_arrives_with_its_files(command_folder, node):
    work = command_folder
    metric = CommandMetric(f"./score.sh {{model}} --labels={work}/data/labels.txt", cwd=work,
                           deps=["helper.py"])
    store = Store()
    parcel = pack(metric, Packer(store.put, "driver-node", {}))
    _hide(work)
    arrived, (copy,) = unpack(parcel, store.get, "worker-node")
    assert arrived.cwd == str(copy) and arrived.command == metric.command
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == [
        "data/labels.txt", "helper.py", "score.sh"]
    assert (copy / "data" / "labels.txt").read_text() == "3 1 4\n"
    assert stat.S_IMODE((copy / "score.sh").stat().st_mode) == 0o750  # still executable
    assert list(arrived.argv) == ["./score.sh", "{model}", f"--labels={copy}/data/labels.txt"]
    assert arrived.from_model(copy / "unused.onnx") == 1.0  # runs the node's copy of the script


def test_a_command_file_outside_its_folder_must_be_on_the_node(command_folder, tmp_path, node):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "table.npy").write_bytes(b"x")
    metric = CommandMetric(f"{sys.executable} score.py {{model}} {elsewhere}/table.npy", cwd=command_folder)
    store = Store()
    parcel = pack(metric, Packer(store.put, "driver-node", {}))
    arrived, _ = unpack(parcel, store.get, "worker-node")  # the interpreter and the table are here
    assert arrived.argv[0] == sys.executable and arrived.argv[-1] == f"{elsewhere}/table.npy"
    _hide(elsewhere)
    with pytest.raises(ConfigError, match=(
            rf"^Evaluation command '.*' reads '{elsewhere}/table\.npy', which cluster node '.+' does not "
            rf"have: only files under the command's working directory '{command_folder}' travel to the "
            r"nodes; move it there and name it relative to it \(or install it at the same path on every "
            r"node\)\.$")):
        unpack(parcel, store.get, "worker-node")


def test_an_executor_travels_without_its_object_store_references():
    executor = RayExecutor("auto")
    executor._files[("/m.onnx.data", 3, 4)] = ("digest", ("a reference",))
    copy = pickle.loads(pickle.dumps(executor))
    assert copy._files == {} and copy.address == "auto" and len(executor._files) == 1
