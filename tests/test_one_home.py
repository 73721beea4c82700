"""Each name in ``src/quantdbg`` means one thing, and each fact read from a graph is read in one place."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "quantdbg"


def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}


def _shared_class_names(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    homes: dict[str, list[str]] = defaultdict(list)
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(f"{path}:{node.lineno}")
    return {name: found for name, found in homes.items() if len(found) > 1}


def test_no_two_classes_share_a_name():
    """Private ones too: a traceback or a FormatError names the class, and two of one name mislead."""
    assert _shared_class_names(_trees()) == {}


def test_the_class_name_check_sees_a_shared_name():
    trees = {"a.py": ast.parse("class QParams:\n    pass\n"),
             "b.py": ast.parse("def f():\n    class QParams:\n        pass\n")}
    assert _shared_class_names(trees) == {"QParams": ["a.py:1", "b.py:2"]}


def _readers(trees: dict[str, ast.Module], attribute: str) -> list[str]:
    return sorted({path for path, tree in trees.items() for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and node.value == attribute})


def test_gemm_trans_b_is_read_in_one_place():
    """Whether a Gemm's weight is ``[N, K]`` decides its channel axis for placement, smoothing, the
    lint and the evidence: one reader (:func:`quantdbg.model.graph.trans_b`) for both node forms."""
    assert _readers(_trees(), "transB") == ["model/graph.py"]
