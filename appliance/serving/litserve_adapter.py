"""Every contact with LitServe beyond its public API, in one place (docs/serving.md, "LitServe").

`appliance serve` needs two things LitServe 0.2.19 does not offer through its arguments:

- **No worker monitor.** LitServe's monitor thread shuts the server down when an inference worker dies
  (or restarts it, with `restart_workers=True`), then `run()` returns normally. We must exit 1 when the
  engine dies, and drain on SIGTERM, so `Supervisor` (server.py) watches the engine instead; two
  watchers would race to shut down the same processes.
- **Stopping `run()` from another thread.** `run()` blocks on its shutdown event; its only public stops
  are Ctrl-C in the main thread and the optional `/shutdown` route. The supervisor sets the event.

tests/serving/test_litserve_adapter.py fails when a LitServe release changes either.
"""
import time


def without_worker_monitor(server) -> None:
    """Call before `server.run()`: LitServe starts no monitor thread for its inference workers."""
    server._monitor_workers = False


def request_stop(server, poll_s: float = 0.05) -> None:
    """Make `server.run()` shut its processes down and return; waits while the server is still starting
    (the event exists once `run()` made its process manager)."""
    while getattr(server, "_shutdown_event", None) is None:
        time.sleep(poll_s)
    server._shutdown_event.set()
