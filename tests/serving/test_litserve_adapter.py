"""The LitServe internals appliance/serving/litserve_adapter.py relies on are still there (in-process,
no server started): a LitServe release that renames or drops them fails here, not in production."""
import inspect

import litserve as ls
from litserve.server import LitServer


class Api(ls.LitAPI):
    def setup(self, device):
        pass

    def predict(self, x):
        return x


def test_the_worker_monitor_is_a_flag_that_run_reads():
    server = LitServer(Api(), accelerator="cpu")
    assert server._monitor_workers is True  # on by default; the adapter turns it off
    run = inspect.getsource(LitServer.run)
    assert "if self._monitor_workers:" in run and "self._start_worker_monitoring(" in run


def test_run_blocks_on_a_shutdown_event_made_with_its_manager():
    server = LitServer(Api(), accelerator="cpu")
    assert server._shutdown_event is None  # until run() makes the manager
    assert "self._shutdown_event = manager.Event()" in inspect.getsource(LitServer._init_manager)
    run = inspect.getsource(LitServer.run)
    assert "self._shutdown_event.wait()" in run
    # ... inside the try whose finally shuts the processes down
    assert run.index("try:") < run.index("self._shutdown_event.wait()") < run.index("_perform_graceful_shutdown")
