"""Pipelines without an engine stage (`POST /predict`): each request runs the whole pipeline on its
record on a preparer thread, and answers with the JSON-readable fields of the records it yields."""
import math
import time
from typing import Any, Callable, Dict

from appliance.pipeline import Pipeline, Record
from appliance.serving.messages import Done, PredictJob
from appliance.serving.engine_process.inbox import Finished, Unanswerable
from appliance.serving.engine_process.driver import Driver


class PlainDriver(Driver):
    def message_handlers(self) -> Dict[type, Callable[[Any], None]]:
        return {**super().message_handlers(), Finished: self.on_finished}

    def start(self) -> None:
        self.pipeline = Pipeline(self.online.head, ready=True)
        self.requests: Dict[str, float] = {}  # uid -> arrival

    def admit(self, uid: str, arrival: float, job: PredictJob) -> None:
        self.requests[uid] = arrival
        self.shared.set_running(len(self.requests))
        self.executor.submit(self._run, uid, job.record)

    def _run(self, uid: str, record: Record) -> None:
        try:
            results = [jsonable(out) for out in self.pipeline.run([record])]
            self.post(Finished(uid, {"results": results}))
        except Exception as e:  # noqa: BLE001 - every failure becomes the client's answer
            self.post(Unanswerable(uid, self.failure(e, "running the pipeline")))

    def on_finished(self, message: Finished) -> None:
        arrival = self.requests.pop(message.uid, None)
        if arrival is not None:
            self.metrics.e2e.observe(time.monotonic() - arrival)
            self.metrics.success("stop").inc()
            self.emit(message.uid, Done(message.result))
        self.shared.set_running(len(self.requests))

    def abort(self, uid: str) -> None:
        self.forget(uid)  # the pipeline runs to its end; its answer is dropped

    def forget(self, uid: str) -> bool:
        found = self.requests.pop(uid, None) is not None
        self.shared.set_running(len(self.requests))
        return found

    def fail_all(self, failure) -> None:
        for uid in list(self.requests):
            self.fail(uid, failure)


def jsonable(record: Record) -> Dict[str, Any]:
    """The fields a client can read; tensors and arrays stay on the server."""
    return {k: v for k, v in record.items() if isinstance(v, (str, int, bool, type(None))) or
            (isinstance(v, float) and math.isfinite(v))}
