"""fedsuite's ClientApp under its public name: ``fedsuite.client_app:app`` (a Flower app's
``clientapp`` component). It lives in ``fedsuite.engine.client_app``."""

from fedsuite.engine.client_app import app

__all__ = ["app"]
