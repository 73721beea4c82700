"""What the sensitivity and fallback sections say about the output-space ranking and the search's phases,
and that the HTML and Markdown reports show it."""
from __future__ import annotations

from quantdbg.fallback import FallbackTarget, search_fallback
from quantdbg.report import render_html, render_markdown
from quantdbg.report.sections.base import Section
from quantdbg.report.sections.fallback import phases_paragraph
from quantdbg.report.sections.registry import sections_of
from quantdbg.sensitivity import LayerSensitivity, SensitivityReport
from quantdbg.sensitivity.output_space import OutputSpace


def _report() -> SensitivityReport:
    nodes = ("box0", "box1", "box2", "cls0", "cls1", "box3")
    layers = tuple(LayerSensitivity(n, "MatMul", (), i + 1, -20.0 - i, 20.0 + i) for i, n in enumerate(nodes))
    values = {"box0": 1.0, "box1": 1.0, "box2": 1.0, "cls0": 0.9, "cls1": 0.95, "box3": 1.0}
    sqnr = {"box0": 30.0, "box1": 31.0, "box2": 32.0, "cls0": 50.0, "cls1": 51.0, "box3": 29.0}
    space = OutputSpace("decision_agreement", True, 2, 32, values, sqnr,
                        ("cls0", "cls1", "box3", "box0", "box1", "box2"))
    return SensitivityReport("local", "local sqnr (dB)", True, layers, output_space=space)


def _agreement_section(sections: list[Section]) -> Section:
    (section,) = [s for s in sections if s.title == "Local vs output-space ranking"]
    return section


def test_the_disagreement_section_names_both_top_lists_and_the_fused_order():
    report = _report()
    section = _agreement_section(sections_of(report))
    assert section.level == 3
    agreement = report.agreement
    assert agreement is not None and agreement.only_mode == ("box2",) and agreement.only_output == ("box3",)
    assert section.paragraphs == (
        "Output space: each layer alone in INT8 on the first 2 batch(es) (32 sample(s)), scored by "
        f"decision_agreement. Spearman rank correlation with the local ranking: {agreement.spearman:.2f}.",
        "The rankings disagree on their top 5: only in the local top 5: box2; only in the output-space "
        "top 5: box3.",
        "The fallback search walks the fused ranking (reciprocal-rank fusion of both), so the top layers of "
        "either are tried first.")
    (table,) = section.tables
    assert table.css_id == "sensitivity-agreement"
    assert table.columns == ("fused rank", "node", "op", "local rank", "output-space rank",
                             "decision_agreement with only this layer in INT8", "output SQNR (dB)",
                             "only in the top 5 of")
    mode_rank = {n: i + 1 for i, n in enumerate(report.ranking)}
    space_rank = {n: i + 1 for i, n in enumerate(report.output_space.ranking)}
    only = {"box2": "local", "box3": "output space"}
    assert table.rows == tuple(
        (i + 1, n, "MatMul", mode_rank[n], space_rank[n], report.output_space.values[n],
         report.output_space.sqnr_db[n], only.get(n, "")) for i, n in enumerate(report.fused_ranking))


def test_agreeing_rankings_say_so_and_reports_without_output_space_have_no_such_section():
    report = _report()
    same = OutputSpace("sqnr", True, 1, 4, report.output_space.values, report.output_space.sqnr_db,
                       report.ranking)
    agreeing = SensitivityReport("local", "x", True, report.layers, output_space=same)
    assert _agreement_section(sections_of(agreeing)).paragraphs[1] == \
        "Both rankings put the same 5 layer(s) on top."
    plain = SensitivityReport("local", "x", True, report.layers)
    assert all("output-space" not in s.title for s in sections_of(plain))


def test_html_and_markdown_show_the_disagreement():
    report = _report()
    markdown = render_markdown(report)
    assert "### Local vs output-space ranking" in markdown
    assert "only in the output-space top 5: box3." in markdown
    html = render_html(report, plots=False)
    assert "Local vs output-space ranking" in html and 'id="sensitivity-agreement"' in html


def test_the_fallback_section_counts_the_search_phases():
    names = [f"n{i}" for i in range(16)]
    target = FallbackTarget.min_metric(0.5)
    plan = search_fallback(names, lambda exclude: float({"n14", "n15"} <= exclude), target)
    phases = plan.phases
    assert list(phases) == ["search", "group", "verify"] and phases["search"] == 4 and phases["verify"] == 1
    assert phases_paragraph(plan) == (f"Evaluations by phase: 4 search (ranked prefixes), {phases['group']} "
                                      "group (group testing), 1 verify (verification).")
    (section,) = [s for s in sections_of(plan) if not s.lead]
    assert phases_paragraph(plan) in section.paragraphs
    bisect = search_fallback(names, lambda exclude: float("n0" in exclude), target, "bisect")
    assert phases_paragraph(bisect) == \
        "Evaluations by phase: 2 search (ranked prefixes), 1 verify (verification)."
