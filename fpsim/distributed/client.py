"""The Dask client the executors run on: a local cluster of worker processes, or yours.

:func:`local_client` (what ``scheduler="local"`` uses) starts worker processes with glibc
malloc settings that let each chunk's temporaries reuse the heap instead of being mapped and
faulted in afresh (Dask's default ``MALLOC_TRIM_THRESHOLD_=65536`` made the analysis 3x
slower here, see :data:`MALLOC_ENV`); for a cluster of your own, put the same variables in
``distributed.nanny.pre-spawn-environ``. dask is imported only when a function here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

__all__ = ["MALLOC_ENV", "as_completed", "connect", "local_client", "total_threads"]

_PRE_SPAWN = "distributed.nanny.pre-spawn-environ"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 64 << 20}
"""glibc malloc settings of the workers :func:`local_client` starts (see there)."""


def local_client(
    n_workers: int = 2, threads_per_worker: int = 1, memory_limit: str | int | float | None = None
) -> Client:
    """A client of the LocalCluster that ``analyze_distributed(scheduler="local")`` starts.

    Use it to keep one cluster for several analyses (pass it as ``scheduler``); close it with
    ``client.close(); client.cluster.close()``.

    Args:
        n_workers: worker processes.
        threads_per_worker: threads per worker process.
        memory_limit: per-worker memory limit (``"2GiB"``, bytes, 0 for none); None keeps
            Dask's default (the machine's memory shared evenly).

    Raises:
        ValueError: ``n_workers`` or ``threads_per_worker`` is not a positive int.
        ImportError: dask.distributed is not installed.
    """
    distributed = _import_distributed()
    import dask

    for name, v in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    # Dask spawns workers with MALLOC_TRIM_THRESHOLD_=65536, which also pins glibc's mmap
    # threshold at 128 KiB: every large numpy temporary of a chunk (a few MiB each) is then
    # mapped and faulted in afresh, and the kernel's page zeroing costs as much CPU as the
    # measurement (3x slower here). Serve them from the heap and keep up to 64 MiB of freed
    # heap: the temporaries of the next chunk reuse it (about +10 MiB resident per worker).
    with dask.config.set({_PRE_SPAWN: {**dask.config.get(_PRE_SPAWN), **MALLOC_ENV}}):
        cluster = distributed.LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            memory_limit="auto" if memory_limit is None else memory_limit,
            dashboard_address=":0",
        )
    try:
        return distributed.Client(cluster)
    except BaseException:
        cluster.close()
        raise


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("analyze_distributed needs dask.distributed: pip install 'fpsim[dask]'") from e
    return distributed


def connect(
    scheduler: Any, n_workers: int, threads_per_worker: int, memory_limit: Any
) -> tuple[Client, Callable[[], None]]:
    """A client for ``scheduler`` and how to release what was started for it.

    Args:
        scheduler: ``"local"`` (a :func:`local_client`, closed with its cluster by the
            returned function), the address of a running scheduler, or a
            ``distributed.Client`` (used as is, not closed).
        n_workers, threads_per_worker, memory_limit: as for :func:`local_client`.

    Raises:
        TypeError: ``scheduler`` is none of these.
    """
    distributed = _import_distributed()
    if isinstance(scheduler, distributed.Client):
        return scheduler, lambda: None
    if not isinstance(scheduler, str) or not scheduler:
        raise TypeError(
            f"scheduler must be 'local', a scheduler address or a distributed.Client, got {scheduler!r}"
        )
    if scheduler == "local":
        client = local_client(n_workers, threads_per_worker, memory_limit)

        def close() -> None:
            cluster = client.cluster
            client.close()
            cluster.close()

        return client, close
    client = distributed.Client(scheduler)
    return client, client.close


def as_completed(client: Client, futures: Sequence[Any] = ()) -> Any:
    """``distributed.as_completed`` with results, on ``client``'s own event loop.

    Not the default client's: the caller's client may be another. Iterate over it for
    (future, result) pairs as they finish; ``add`` more futures meanwhile.
    """
    from distributed import as_completed as completed

    return completed(list(futures), loop=client.loop, with_results=True)


def total_threads(client: Client) -> int:
    """The threads of all of ``client``'s workers (at least 1)."""
    return sum(client.nthreads().values()) or 1
