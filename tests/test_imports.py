"""Every module imports without the optional extras, and `import quantdbg` stays light."""
from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import quantdbg

OPTIONAL = ("tensorrt", "polygraphy", "numba", "matplotlib", "pandas", "tqdm", "modelopt", "cuda")
_BLOCKER = f"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {OPTIONAL!r}:
            raise ImportError('blocked for test: ' + name)
sys.meta_path.insert(0, _Block())
"""


def _modules() -> list[str]:
    root = Path(quantdbg.__file__).parent
    names = (m.name for m in pkgutil.walk_packages([str(root)], prefix="quantdbg."))
    return sorted(n for n in names if not n.endswith("__main__"))  # __main__ runs the CLI


def test_every_module_imports_without_optional_dependencies():
    code = _BLOCKER + "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in _modules())
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_import_quantdbg_loads_no_heavy_module():
    code = ("import sys, quantdbg\n"
            "heavy = [m for m in ('onnx', 'onnxruntime', 'onnx_graphsurgeon', 'scipy', 'numba', "
            "'matplotlib', 'tensorrt') if m in sys.modules]\n"
            "print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_optional_import_names_the_extra():
    code = _BLOCKER + (
        "from quantdbg._optional import lazy_import\n"
        "from quantdbg.errors import MissingDependencyError\n"
        "trt = lazy_import('tensorrt', 'tensorrt')\n"
        "try:\n    trt.Builder\nexcept MissingDependencyError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "install `quantdbg[tensorrt]`" in result.stdout


def test_public_names_are_their_packages_documented_objects():
    """Each name of ``quantdbg.__all__`` is the very object the package (or top-level module) that
    defines it exports under that name, with a docstring: no stale mapping, no copy, no stand-in."""
    for name in quantdbg.__all__:
        obj = getattr(quantdbg, name)
        stage = ".".join(obj.__module__.split(".")[:2])  # quantdbg.<package or top-level module>
        home = importlib.import_module(stage)
        assert getattr(home, name) is obj, f"quantdbg.{name} is not {stage}.{name}"
        if hasattr(home, "__path__"):  # a package: the name is part of its declared API
            assert name in home.__all__, f"{stage} does not list {name} in __all__"
        assert obj.__name__ == name and (obj.__doc__ or "").strip(), name
    assert sorted(quantdbg.__all__) == sorted(set(quantdbg.__all__))
    assert set(quantdbg.__all__) <= set(dir(quantdbg))


def test_unknown_public_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match=r"^module 'quantdbg' has no attribute 'no_such_name'$"):
        quantdbg.no_such_name  # noqa: B018
