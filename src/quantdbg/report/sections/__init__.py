"""What a report says about each kind of result, as format-neutral sections: one module per kind.

:func:`~quantdbg.report.sections.registry.sections_of` dispatches on the result's class; the
builders only format what a result holds (rendering never runs an analysis).
"""

__all__: list[str] = []
