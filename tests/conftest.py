"""Every test sees an empty host calibration home (``HEXISCALE_HOME``), never the developer's
``~/.hexiscale``: plans and estimates must not depend on what the machine running the suite
has calibrated. Tests that calibrate point ``HEXISCALE_HOME`` at their own folder."""

from __future__ import annotations

import os
import tempfile

os.environ["HEXISCALE_HOME"] = tempfile.mkdtemp(prefix="hexiscale-home-")
