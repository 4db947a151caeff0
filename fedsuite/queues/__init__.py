"""Queues of runs: sweeps, Ray Tune searches, the papers' reproductions."""
