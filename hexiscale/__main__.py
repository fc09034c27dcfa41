"""``python -m hexiscale ...`` is the ``hexiscale`` command (the launchers start ranks this way)."""

import sys

from hexiscale.cli.main import main

sys.exit(main())
