"""Highwater's command line: the ``highwater`` group in ``main``, one module per subcommand."""
