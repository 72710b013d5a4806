"""A pool replica's vLLM engine processes end with that replica, however the replica ends.

The replica (Ray Serve LLM's `LLMServer`) spawns vLLM's EngineCore process, which spawns its
workers. vLLM ends them only when asked (`AsyncLLM.shutdown`, which Ray Serve LLM's own shutdown
path never calls), and its EngineCore never watches its parent (only the workers watch the
EngineCore, through a pipe). Ray ends them for us only while it is there to: the replica's core
worker kills its direct children when it exits (`kill_child_processes_on_worker_exit`), and the
raylet kills a dead worker's process group (`process_group_cleanup_enabled`). A replica killed by
SIGKILL while its raylet is gone, or with the process-group cleanup off, leaves an EngineCore and
its workers reparented to init, holding their memory until the machine runs out of it.

So the engine watches its replica itself: a thread blocks on a pidfd of the replica process (the
kernel wakes it when that exact process exits: no polling, no pid reuse), then kills the engine's
workers and the engine. `prctl(PR_SET_PDEATHSIG)` would need no thread, but it fires when the
*thread* that spawned the engine exits, so it would tie the engine to whichever replica thread
happens to start it, not to the replica. Nothing is left to shut down in order: the replica was
the engine's only client, so SIGKILL loses nothing, and it cannot hang. Killing the workers here
too covers their start-up, when they do not watch their pipe yet.

Installed from the replica, before it starts its engine (a Ray Serve LLM callback): the EngineCore
process target becomes `_run_engine_core`, which arms the watch and runs vLLM's own target.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading

from ray.llm._internal.common.callbacks.base import CallbackBase


class EngineLifetime(CallbackBase):
    """`LLMConfig.callback_config`'s class: runs in the replica before it starts its engine."""

    async def on_before_node_init(self) -> None:
        from vllm.v1.engine.core import EngineCoreProc

        EngineCoreProc.run_engine_core = staticmethod(_run_engine_core)


def _run_engine_core(*args, **kwargs):
    """The EngineCore process's target: vLLM's own, once the watch on the replica is armed.

    The engine is spawned (vLLM always spawns inside a Ray actor), so vLLM is imported afresh here
    and `EngineCoreProc.run_engine_core` is vLLM's own target again.
    """
    _watch_replica()
    from vllm.v1.engine.core import EngineCoreProc

    EngineCoreProc.run_engine_core(*args, **kwargs)


def _watch_replica() -> None:
    replica = multiprocessing.parent_process().pid
    pidfd = os.pidfd_open(replica)
    if os.getppid() != replica:  # reparented: the replica ended before the watch began
        _end_engine()
    threading.Thread(target=_end_engine_after, args=(pidfd,), name="replica-watch", daemon=True).start()


def _end_engine_after(pidfd: int) -> None:
    select.select([pidfd], [], [])  # readable once the replica has exited
    _end_engine()


def _end_engine() -> None:
    for worker in multiprocessing.active_children():
        worker.kill()
    os.kill(os.getpid(), signal.SIGKILL)
