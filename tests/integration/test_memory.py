"""Memory is bounded: a process calibrating 512 samples peaks at most a tenth of the extra
activations' size above one calibrating 32 samples of the same model (its baseline, measured in
the same test, so the bound does not depend on what the interpreter and libraries take here)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from quantdbg.calibration import _kernels as _kernels

CHILD = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import onnx, onnx_graphsurgeon as gs
    import onnxruntime as ort
    from quantdbg.calibration import _kernels
    from quantdbg.calibration.ranges import calibrate
    from quantdbg.config import CalibConfig

    n_samples, batch, channels = int(sys.argv[1]), 16, 64

    def build():
        rng = np.random.default_rng(0)
        def w(name):
            weights = rng.standard_normal((channels, channels, 1, 1)) * 0.2
            return gs.Constant(name, weights.astype(np.float32))
        x = gs.Variable("x", np.float32, ("N", channels, 32, 32))
        c1, r1 = gs.Variable("c1", np.float32), gs.Variable("r1", np.float32)
        y = gs.Variable("y", np.float32, ("N", channels, 32, 32))
        nodes = [gs.Node("Conv", "conv1", inputs=[x, w("w1")], outputs=[c1]),
                 gs.Node("Relu", "relu1", inputs=[c1], outputs=[r1]),
                 gs.Node("Conv", "conv2", inputs=[r1, w("w2")], outputs=[y])]
        model = gs.export_onnx(gs.Graph(nodes, [x], [y]))
        model.ir_version = 8
        del model.opset_import[:]
        model.opset_import.append(onnx.helper.make_opsetid("", 17))
        return model

    class Generated:
        # Batches are made on the fly, so the data itself is never resident all at once.
        def __iter__(self):
            rng = np.random.default_rng(1)
            for start in range(0, n_samples, batch):
                yield {"x": rng.standard_normal((min(batch, n_samples - start), channels, 32, 32),
                                                dtype=np.float32)}

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if _kernels.numba_available():  # loaded up front in both children, not past a data threshold in one
        _kernels.preload_numba()
    result = calibrate(build(), Generated(), CalibConfig(method="entropy"), session_options=options)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_kib": peak_kib, "n_samples": result.n_samples,
                      "tensors": sorted(result.ranges)}))
""")

BYTES_PER_SAMPLE = 2 * 64 * 32 * 32 * 4  # the two calibrated tensors, x and r1, of one sample


def _peak(n_samples: int, tmp_path: Path) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = subprocess.run([sys.executable, str(script), str(n_samples)], capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_peak_rss_does_not_grow_with_sample_count(tmp_path):
    if _kernels.numba_available():  # compile the cached kernel here first, so no child compiles it
        _kernels.preload_numba()
    small, large = _peak(32, tmp_path), _peak(512, tmp_path)
    assert (small["n_samples"], large["n_samples"]) == (32, 512)
    assert small["tensors"] == large["tensors"] == ["r1", "x"]
    # Keeping the extra samples' activations would add all of this; streaming adds none of it.
    retained_kib = (512 - 32) * BYTES_PER_SAMPLE / 1024
    growth_kib = large["peak_kib"] - small["peak_kib"]
    assert growth_kib < 0.10 * retained_kib, (
        f"peak RSS grew by {growth_kib / 1024:.0f} MiB from 32 to 512 samples; keeping the extra "
        f"activations would add {retained_kib / 1024:.0f} MiB, streaming should add under a tenth of it")
