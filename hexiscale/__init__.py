"""The top layer: the ``hexiscale`` command line and the launcher, the only code that imports both
:mod:`planner` (torch-free) and :mod:`executor` (torch). Nothing below imports it."""
