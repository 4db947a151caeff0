"""The Ray actor that hosts ClientApps in a simulation: Flower's ``ClientAppActor``, importable cheaply.

Flower's Ray backend (``flwr.server.superlink.fleet.vce.backend.raybackend.RayBackend``) creates
its actors from ``flwr.simulation.ray_transport.ray_actor.ClientAppActor``. A Ray worker that
becomes such an actor imports the module that defines the class, and with it the package
``flwr.simulation``, whose ``__init__`` imports Flower's SuperLink state (SQLAlchemy, Alembic and
its database dialects): about 1 CPU-second per actor that no client uses, paid on the critical path
of every run's start (the handshake waits for the actors' imports; 2 actors on 2 cores).

:class:`ClientAppActor` here is the same actor, defined in a module that imports only Ray and the
ClientApp's own classes; ``fedsuite.launch.simulation.use_light_actor`` makes the backend create it. Its
``run`` is Flower's ``VirtualClientEngineActor.run`` line for line (load the app, pass it the
message and context, wrap what it raises in ``ClientAppException``), so the engine sees no
difference: ``tests/test_upstream.py`` fails when Flower's ``run`` is no longer this one (a Flower
upgrade that changed it), ``tests/test_core.py`` checks that both answer alike and what a worker
imports. Flower's ``ClientAppActor``, the two exceptions and the backend's module are
non-public names, listed in ``fedsuite.upstream``.
"""

from __future__ import annotations

from typing import Callable

import ray
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedsuite.upstream import ClientAppException, LoadClientAppError


@ray.remote
class ClientAppActor:
    """Runs a ClientApp on one message, in a Ray worker."""

    def __init__(self, on_actor_init_fn: Callable[[], None] | None = None) -> None:
        if on_actor_init_fn:  # Flower's backend passes one only for TensorFlow clients
            on_actor_init_fn()

    def run(self, client_app_fn: Callable[[], ClientApp], message: Message, cid: str,
            context: Context) -> tuple[str, Message, Context]:
        """The reply of ``client_app_fn()`` to ``message``, with ``cid`` and the updated ``context``."""
        try:
            app: ClientApp = client_app_fn()
            out_message = app(message=message, context=context)
        except LoadClientAppError as load_ex:
            raise load_ex
        except Exception as ex:
            raise ClientAppException(str(ex)) from ex
        return cid, out_message, context

    def terminate(self) -> None:
        """End this actor (Flower's pool calls it when the simulation ends)."""
        ray.actor.exit_actor()
