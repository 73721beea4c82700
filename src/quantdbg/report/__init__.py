"""Reports: every result as self-contained HTML, Markdown, JSON, a DataFrame or notebook display."""
from quantdbg.report.render import ReportBundle, load_result, write_report

__all__ = ["ReportBundle", "load_result", "write_report"]
