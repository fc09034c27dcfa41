"""The ``hexiscale`` command line. Each sub-command lives in ``cmd_<name>.py`` with a
``register(subparsers)`` function; :func:`hexiscale.cli.main.main` discovers them."""
