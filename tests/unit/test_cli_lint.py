"""`quantdbg lint MODEL [--json OUT] [--fail-on ...]`: output, exit status, JSON file."""
from __future__ import annotations

import json

import models_lint
import onnx
import pytest

from quantdbg.cli import main
from quantdbg.cli.lint import render_text
from quantdbg.diagnostics import lint


@pytest.fixture
def save(tmp_path):
    def write(model: onnx.ModelProto, name: str = "model.onnx"):
        path = tmp_path / name
        onnx.save(model, str(path))
        return path
    return write


def test_clean_model_prints_zero_findings_and_exits_0(save, capsys):
    path = save(models_lint.clean_conv_block())
    assert main(["lint", str(path), "--fail-on", "info"]) == 0
    assert capsys.readouterr().out == f"{path}: 0 findings (0 high, 0 medium, 0 info)\n"


@pytest.mark.parametrize("fail_on, status", [("error", 0), ("high", 0), ("warning", 1), ("medium", 1),
                                             ("low", 1), ("info", 1), ("never", 0)])
def test_exit_status_follows_fail_on_for_a_medium_finding(save, capsys, fail_on, status):
    path = save(models_lint.per_tensor_weight())
    assert main(["lint", str(path), "--fail-on", fail_on]) == status
    out = capsys.readouterr().out
    assert out.startswith("MEDIUM    per-tensor-weight  [conv]\n"
                          "          Conv 'conv' quantizes its 16-channel")
    assert "fix: Quantize the weight per output channel" in out
    assert out.endswith(f"{path}: 1 finding (0 high, 1 medium, 0 info)\n")


def test_unknown_fail_on_is_refused_by_the_parser(save, capsys):
    path = save(models_lint.per_tensor_weight())
    with pytest.raises(SystemExit) as exit_info:
        main(["lint", str(path), "--fail-on", "fatal"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fatal'" in capsys.readouterr().err


def test_a_high_finding_fails_by_default_and_never_overrides(save, capsys):
    path = save(models_lint.nonzero_zero_point())
    assert main(["lint", str(path)]) == 1
    assert main(["lint", str(path), "--fail-on", "never"]) == 0
    first, second = capsys.readouterr().out.split(f"{path}: 1 finding (1 high, 0 medium, 0 info)\n")[:2]
    assert first == second and first.startswith("HIGH      nonzero-zero-point  [x.dequantize]\n")


def test_json_report_equals_the_api_report(save, tmp_path, capsys):
    path = save(models_lint.quantized_conv("two", zero_point=3, weight_axis=None), "my model.onnx")
    out = tmp_path / "report.json"
    main(["lint", str(path), "--json", str(out), "--fail-on", "never"])
    assert json.loads(out.read_text()) == lint(path).to_dict()


def test_markdown_output(save, capsys):
    path = save(models_lint.concat_scale_mismatch())
    main(["lint", str(path), "--markdown"])
    out = capsys.readouterr().out
    assert out == lint(path).to_markdown()
    assert "| severity | rule | node | finding | fix |" in out
    assert "\n| medium | concat-scale-mismatch | concat | Concat 'concat' joins inputs" in out
    assert f"TensorRT Q/DQ lint of {path}: 0 high, 1 medium, 0 info." in out


def test_skip_leaves_the_rule_out_of_the_output(save, capsys):
    path = save(models_lint.nonzero_zero_point())
    assert main(["lint", str(path), "--skip", "nonzero-zero-point"]) == 0
    assert capsys.readouterr().out == f"{path}: 0 findings (0 high, 0 medium, 0 info)\n"


@pytest.mark.parametrize("argv, message", [
    (["lint", "{missing}"], "does not exist"),
    (["lint", "{model}", "--skip", "nope-rule"], "No lint rule named 'nope-rule'"),
    (["lint", "{model}", "--json", "{missing_dir}/r.json"], "does not exist"),
])
def test_bad_input_prints_one_line_and_exits_2(save, tmp_path, capsys, argv, message):
    model = save(models_lint.clean_conv_block())
    values = {"missing": tmp_path / "nope.onnx", "model": model, "missing_dir": tmp_path / "no_dir"}
    assert main([arg.format(**values) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quantdbg lint: error: ") and message in err


def test_md_writes_the_markdown_file_as_doctor_and_report_do(save, capsys, tmp_path):
    path = save(models_lint.concat_scale_mismatch())
    out = tmp_path / "lint.md"
    main(["lint", str(path), "--md", str(out), "--fail-on", "never"])
    assert out.read_text() == lint(path).to_markdown()
    assert capsys.readouterr().out == render_text(lint(path))
    main(["lint", str(path), "--md", "-", "--fail-on", "never"])
    assert capsys.readouterr().out == lint(path).to_markdown()
