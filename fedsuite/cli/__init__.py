"""The ``fedsuite`` command."""
