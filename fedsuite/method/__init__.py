"""The method contract: everything a method (``strategies/``, ``clients/``) and a plug-in may import."""
