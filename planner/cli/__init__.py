"""The ``hexiscale`` command line. Each sub-command lives in ``cmd_<name>.py`` with a
``register(subparsers)`` function; :func:`planner.cli.main.main` discovers them."""
