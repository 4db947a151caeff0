"""fedsuite's ServerApp under its public name: ``fedsuite.server_app:app`` (a Flower app's
``serverapp`` component) and :func:`method_strategy` (a fedsuite method as a Flower ``Strategy`` in a
ServerApp of one's own, ``docs/flower-app.md``). Both live in ``fedsuite.engine.server_app``."""

from fedsuite.engine.server_app import app, method_strategy

__all__ = ["app", "method_strategy"]
