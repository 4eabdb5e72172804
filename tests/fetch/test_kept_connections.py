"""One request's kept-alive connections (fetch/kept_connections.py) against real servers on 127.0.0.1: many range
GETs share one connection, and reuse never gets round the address rule, the host match or redirects."""
import pytest

from appliance.errors import InputError
from appliance.fetch import FetchPolicy, fetch_bytes
from appliance.fetch.client import fetch_range
from appliance.fetch.kept_connections import KeptConnections
from tests.geo.hls import RangeServer

from .conftest import BODY, wait_for

FIELD = "data.data"
LOOPBACK = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 20, total_timeout_s=30)


@pytest.fixture
def blob(tmp_path):
    data = bytes(range(256)) * 1024  # 256 KiB
    (tmp_path / "scene.tif").write_bytes(data)
    return tmp_path, data


def test_range_gets_through_one_pool_share_one_connection(blob):
    root, data = blob
    with RangeServer(root) as server, KeptConnections() as pool:
        url = f"{server.url}/scene.tif"
        for start in range(0, len(data), 8192):
            got, size = fetch_range(url, start, start + 8191, LOOPBACK, FIELD, connections=pool)
            assert got == data[start:start + 8192] and size == len(data)
        assert wait_for(lambda: server.requests == 32) and server.connections == 1  # counted after the body


def test_without_a_pool_every_get_opens_and_closes_its_own_connection(blob):
    root, _ = blob
    with RangeServer(root) as server:
        for start in range(0, 5 * 8192, 8192):
            fetch_range(f"{server.url}/scene.tif", start, start + 8191, LOOPBACK, FIELD)
        assert wait_for(lambda: server.requests == 5) and server.connections == 5


def test_a_connection_the_server_closed_while_idle_is_replaced(server):
    with KeptConnections() as pool:
        for _ in range(3):  # /hangup closes each connection after answering, without saying so
            assert fetch_bytes(server.url("/hangup"), LOOPBACK, FIELD, connections=pool) == BODY
    assert len(server.requests) == 3 and server.connections == 3


def test_a_kept_connection_serves_only_its_own_host_name_and_port(server, dns):
    other = type(server)()  # a second server: another port
    dns.names["files.test"] = ["127.0.0.1"]
    policy = FetchPolicy(allowed_domains=("127.0.0.1", "files.test"), max_bytes=1 << 20, total_timeout_s=30)
    try:
        with KeptConnections() as pool:
            for _ in range(3):
                for url in (server.url("/body"), server.url("/body", host="files.test"), other.url("/body")):
                    assert fetch_bytes(url, policy, FIELD, connections=pool) == BODY
        # the same address under two names is two connections: a name's check never covers another's
        assert server.connections == 2 and other.connections == 1 and len(server.requests) == 6
        assert sorted({host for _, host in server.requests}) == [f"127.0.0.1:{server.port}",
                                                                 f"files.test:{server.port}"]
    finally:
        other.close()


def test_reuse_judges_the_kept_address_under_the_callers_policy(server):
    with KeptConnections() as pool:
        fetch_bytes(server.url("/body"), LOOPBACK, FIELD, connections=pool)
        with pytest.raises(InputError, match="resolves to 127.0.0.1, a loopback address"):
            fetch_bytes(server.url("/body"), FetchPolicy(max_bytes=1 << 20, total_timeout_s=30), FIELD,
                        connections=pool)
    assert len(server.requests) == 1  # refused before anything was sent


def test_a_redirect_from_a_kept_host_is_judged_on_its_own(server, dns):
    dns.names["internal.test"] = ["127.0.0.1"]  # the same address as the kept connection, another name
    target = server.url("/body", host="internal.test")
    with KeptConnections() as pool:
        fetch_bytes(server.url("/body"), LOOPBACK, FIELD, connections=pool)
        with pytest.raises(InputError) as e:
            fetch_bytes(server.url(f"/redirect?to={target}"), LOOPBACK, FIELD, connections=pool)
    assert (f"host internal.test:{server.port} (redirected from 127.0.0.1:{server.port}) resolves to "
            "127.0.0.1, a loopback address") in str(e.value)
    assert [path for path, _ in server.requests] == ["/body", f"/redirect?to={target}"]


def test_a_failed_transfer_does_not_keep_its_connection(server):
    small = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=100, total_timeout_s=30)
    with KeptConnections() as pool:
        with pytest.raises(InputError, match="sends 10000 bytes; the limit is 100 bytes"):
            fetch_bytes(server.url("/big"), small, FIELD, connections=pool)
        assert wait_for(lambda: server.closed == 1)  # its body was never read: the connection is closed
        assert fetch_bytes(server.url("/body"), LOOPBACK, FIELD, connections=pool) == BODY
    assert server.connections == 2


def test_closing_the_pool_closes_its_connections(server):
    pool = KeptConnections()
    fetch_bytes(server.url("/body"), LOOPBACK, FIELD, connections=pool)
    assert server.closed == 0  # kept open for the request's next GET
    pool.close()
    assert wait_for(lambda: server.closed == 1)
    fetch_bytes(server.url("/body"), LOOPBACK, FIELD, connections=pool)  # a late fetch: not kept
    assert wait_for(lambda: server.closed == 2) and server.connections == 2
