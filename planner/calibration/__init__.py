"""Measured profiles and cost-model calibration (no torch).

The measured tables themselves (``hexiscale.measured/1``, written by ``executor/profiler``) are read by
:mod:`planner.cost.measured`; :class:`planner.cost.ProfileSet` uses them whenever a catalog entry has them.
* :mod:`planner.calibration.fit` — least-squares fits of the named physical terms of
  :class:`planner.cost.CostParams` to measurements (compute efficiencies and per-kernel overhead to layer
  tables; link efficiency to p2p/all-reduce sweeps; gradient-sync overlap and memory overheads to
  measured steps). There is no global fudge factor: each fitted value is one documented term.
* :mod:`planner.calibration.store` — the calibrated-parameters file (``planner/profiles/calibration/*.json``).
"""
