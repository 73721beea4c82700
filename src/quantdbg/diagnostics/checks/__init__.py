"""The doctor's checks, one module per check: each measures one classic PTQ problem and judges it.

:mod:`~quantdbg.diagnostics.checks.registry` maps every check name to its ``Check``, in the
order the doctor runs them; :mod:`~quantdbg.diagnostics.checks.base` holds what they share.
"""

__all__: list[str] = []
