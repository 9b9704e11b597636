"""The ``shardfuse`` command line."""
