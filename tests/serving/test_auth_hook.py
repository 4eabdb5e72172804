"""LitServe makes `LitAPI.authorize` a dependency of every route it adds. FastAPI runs a plain-function
dependency on a worker thread for each request (a thread hand-off per request), a coroutine on the event
loop: the server's hook must stay a coroutine, and LitServe must keep using it (in-process, no server)."""
import inspect

import litserve as ls
from fastapi.routing import APIRoute
from litserve.server import LitServer
from litserve.specs.base import LitSpec
from starlette.requests import Request

from appliance.serving.engine_process.api import EngineAPI


class Spec(LitSpec):
    def __init__(self):
        super().__init__()
        self.add_endpoint("/v1/completions", self.answer, ["POST"])

    async def answer(self, request: Request):
        return None


class Api(ls.LitAPI):
    authorize = EngineAPI.authorize

    def setup(self, device):
        pass

    def predict(self, x):
        return x


def test_the_server_auth_hook_is_a_coroutine():
    assert inspect.iscoroutinefunction(EngineAPI.authorize)


def test_litserve_makes_the_hook_the_route_dependency():
    server = LitServer(Api(spec=Spec()), accelerator="cpu")
    route = next(r for r in server.app.routes if isinstance(r, APIRoute) and r.path == "/v1/completions")
    calls = [dependency.call for dependency in route.dependant.dependencies]
    assert calls and all(inspect.iscoroutinefunction(call) for call in calls), calls
    assert any(getattr(call, "__func__", None) is EngineAPI.authorize for call in calls)
