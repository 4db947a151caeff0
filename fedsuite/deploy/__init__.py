"""Flower's Deployment Engine: the SuperLink and its runs, the gateway, the federation's credentials."""
