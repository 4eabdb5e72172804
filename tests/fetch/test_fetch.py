"""fetch_bytes / fetch_to_file against real servers on 127.0.0.1: the address rule, redirects, limits."""
import shutil
import socket
import ssl
import time

import pytest

from appliance.errors import InputError
from appliance.fetch import FetchPolicy, fetch_bytes, fetch_to_file

from .conftest import BODY, CHUNKED_TOTAL, LocalServer, make_certificate, wait_for

FIELD = "messages[0].content[1].image_url.url"
LOOPBACK = ("127.0.0.1",)


def policy(**overrides):
    return FetchPolicy(**{"max_bytes": 1 << 20, "total_timeout_s": 30, **overrides})


def refused(url, pol, field=FIELD, **kwargs):
    """The InputError message fetch_bytes raises for `url`."""
    with pytest.raises(InputError) as e:
        fetch_bytes(url, pol, field, **kwargs)
    message = str(e.value)
    assert message.startswith(f"{field}: "), message
    return message


# --- the address rule --------------------------------------------------------------------------

def test_loopback_is_refused_by_default_and_allowed_by_name(server):
    message = refused(server.url("/body"), policy())
    assert f"host 127.0.0.1:{server.port} resolves to 127.0.0.1, a loopback address" in message
    assert "only public addresses are fetched" in message and "server.allowed_media_domains" in message
    assert server.requests == []  # refused before connecting
    assert fetch_bytes(server.url("/body"), policy(allowed_domains=LOOPBACK), FIELD) == BODY


@pytest.mark.parametrize("addresses,shown,reason", [
    (["10.0.0.5"], "10.0.0.5", "a private address"),
    (["169.254.169.254"], "169.254.169.254", "a cloud metadata address"),
    (["::ffff:127.0.0.1"], "::ffff:7f00:1", "a loopback address (as 127.0.0.1 inside IPv6)"),
    (["::ffff:169.254.169.254"], "::ffff:a9fe:a9fe", "a cloud metadata address (as 169.254.169.254"),
    (["fd00:ec2::254"], "fd00:ec2::254", "a cloud metadata address"),
    (["0.0.0.0"], "0.0.0.0", "an unspecified address"),
    (["93.184.216.34", "192.168.1.1"], "192.168.1.1", "a private address"),  # any one address refuses
])
def test_a_public_name_that_resolves_to_a_refused_address(server, dns, addresses, shown, reason):
    dns.names["media.example.com"] = addresses
    message = refused(f"http://media.example.com:{server.port}/body", policy())
    assert f"host media.example.com:{server.port} resolves to {shown}, {reason}" in message, message
    assert server.requests == []


def test_an_allowed_name_may_resolve_to_loopback_and_the_host_header_is_the_name(server, dns):
    dns.names.update({"media.test": ["127.0.0.1"], "cdn.media.test": ["127.0.0.1"]})
    pol = policy(allowed_domains=("MEDIA.Test.",))  # case and a trailing dot do not matter
    assert fetch_bytes(f"http://media.test:{server.port}/host", pol, FIELD) == f"media.test:{server.port}".encode()
    assert fetch_bytes(f"http://Media.TEST:{server.port}/body", pol, FIELD) == BODY
    # exact match: a subdomain is another host
    assert "resolves to 127.0.0.1, a loopback" in refused(f"http://cdn.media.test:{server.port}/body", pol)


def test_an_ipv6_literal_is_judged_and_sent_with_brackets():
    try:
        server = LocalServer(host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        url = f"http://[::1]:{server.port}/host"
        assert f"host [::1]:{server.port} resolves to ::1, a loopback address" in refused(url, policy())
        assert fetch_bytes(url, policy(allowed_domains=("[::1]",)), FIELD) == f"[::1]:{server.port}".encode()
    finally:
        server.close()


def test_the_connection_goes_to_the_vetted_address_not_a_second_lookup(server, dns):
    """DNS rebinding: the first answer is checked and used; a later, different answer is never asked for."""
    dns.names["media.test"] = [["127.0.0.1"], ["10.255.255.1"]]
    pol = policy(allowed_domains=("media.test",), connect_timeout_s=0.5)
    assert fetch_bytes(f"http://media.test:{server.port}/body", pol, FIELD) == BODY
    assert dns.lookups == ["media.test"]
    dns.lookups.clear()
    dns.names["rebind.example.com"] = [["93.184.216.34"], ["127.0.0.1"]]  # public first, loopback after
    with pytest.raises(InputError):  # whatever 93.184.216.34 does here, the local server is never reached
        fetch_bytes(f"http://rebind.example.com:{server.port}/body", policy(connect_timeout_s=0.3, total_timeout_s=1),
                    FIELD)
    assert dns.lookups == ["rebind.example.com"] and len(server.requests) == 1


def test_dns_failure(dns):
    dns.names["nowhere.example.com"] = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    message = refused("https://nowhere.example.com/a.png", policy())
    assert "could not resolve host nowhere.example.com (Name or service not known)" in message


# --- schemes and redirects ---------------------------------------------------------------------

@pytest.mark.parametrize("url,fragment", [
    ("file:///etc/passwd", "unsupported URL scheme 'file'"),
    ("ftp://example.com/a.png", "unsupported URL scheme 'ftp' (host example.com)"),
    ("gopher://example.com:70/_GET", "unsupported URL scheme 'gopher' (host example.com)"),
    ("example.com/a.png", "unsupported URL scheme 'missing'"),
    ("http:///a.png", "URL has no host"),
    ("http://example.com:99999/a.png", "not a valid URL"),
])
def test_only_http_and_https_urls(url, fragment):
    message = refused(url, policy())
    assert fragment in message, message
    assert "only http:// and https:// URLs are fetched" in message or "give an http:// or https:// URL" in message


def _redirect(server, to, status=302):
    return server.url(f"/redirect?to={to}&status={status}")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_followed_within_allowed_places(server, status):
    assert fetch_bytes(_redirect(server, "/body", status), policy(allowed_domains=LOOPBACK), FIELD) == BODY


@pytest.mark.parametrize("target,names,fragment", [
    ("http://127.0.0.1:{port}/body", {}, "host 127.0.0.1:{port} (redirected from media.test:{port}) resolves to "
                                         "127.0.0.1, a loopback address"),
    ("http://internal.example.com/x", {"internal.example.com": ["10.0.0.5"]},
     "host internal.example.com (redirected from media.test:{port}) resolves to 10.0.0.5, a private address"),
    ("http://[::ffff:169.254.169.254]/latest/meta-data", {}, "resolves to ::ffff:a9fe:a9fe, a cloud metadata"),
    ("file:///etc/passwd", {}, "a redirect from media.test:{port} led to a file: URL"),
    ("gopher://127.0.0.1:6379/_FLUSHALL", {}, "a redirect from media.test:{port} led to a gopher: URL"),
])
def test_a_redirect_to_a_refused_place_is_refused(server, dns, target, names, fragment):
    dns.names.update({"media.test": ["127.0.0.1"], **names})
    pol = policy(allowed_domains=("media.test",))
    message = refused(f"http://media.test:{server.port}/redirect?to={target.format(port=server.port)}", pol)
    assert fragment.format(port=server.port) in message, message
    assert len(server.requests) == 1  # only the allowed first hop reached the server


@pytest.mark.parametrize("max_redirects", [0, 3])
def test_a_redirect_chain_over_the_limit(server, max_redirects):
    message = refused(server.url("/loop/0"), policy(allowed_domains=LOOPBACK, max_redirects=max_redirects))
    assert f"127.0.0.1:{server.port} redirected more than {max_redirects} times; at most {max_redirects}" in message
    assert [path for path, _ in server.requests] == [f"/loop/{n}" for n in range(max_redirects + 1)]


def test_a_redirect_without_a_location(server):
    assert "answered HTTP 302 without a Location" in refused(
        server.url("/redirect?to=&status=302"), policy(allowed_domains=LOOPBACK))


# --- status, timeouts and size -----------------------------------------------------------------

@pytest.mark.parametrize("path,status", [("/missing", 404), ("/error", 500)])
def test_a_status_other_than_200(server, path, status):
    message = refused(server.url(path), policy(allowed_domains=LOOPBACK))
    assert f"127.0.0.1:{server.port} answered HTTP {status}; the URL must answer 200" in message


@pytest.mark.parametrize("path,overrides,fragment", [
    ("/stall-headers", {"read_timeout_s": 0.3}, "waiting for the response from 127.0.0.1:{port} timed out after 0.3 s"),
    ("/stall-body", {"read_timeout_s": 0.3}, "reading the body from 127.0.0.1:{port} timed out after 0.3 s"),
    ("/drip", {"read_timeout_s": 1, "total_timeout_s": 0.5},
     "fetching from 127.0.0.1:{port} took longer than 0.5 s; the whole transfer must finish within 0.5 s"),
    ("/stall-body", {"read_timeout_s": 5, "total_timeout_s": 0.4}, "took longer than 0.4 s"),  # one long read
])
def test_timeouts(server, path, overrides, fragment):
    started = time.monotonic()
    message = refused(server.url(path), policy(allowed_domains=LOOPBACK, **overrides))
    assert time.monotonic() - started < 4  # the client's limit, not the server's 5 s stall, ended it
    assert fragment.format(port=server.port) in message, message


def test_connect_timeout():
    """A listening socket whose accept queue is full: the SYN goes unanswered (Linux)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler = socket.create_connection(("127.0.0.1", port), timeout=1)
        probe = socket.socket()
        probe.settimeout(0.2)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("this kernel accepts past a full backlog; cannot provoke a connect timeout")
        except TimeoutError:
            pass
        finally:
            probe.close()
        try:
            message = refused(f"http://127.0.0.1:{port}/", policy(allowed_domains=LOOPBACK, connect_timeout_s=0.3))
        finally:
            filler.close()
    assert f"connecting to 127.0.0.1:{port} timed out after 0.3 s" in message


def test_connection_refused():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening
        message = refused(f"http://127.0.0.1:{port}/", policy(allowed_domains=LOOPBACK))
    assert f"could not connect to 127.0.0.1:{port} (Connection refused)" in message


def test_content_length_over_the_cap_is_refused_before_reading(server):
    message = refused(server.url("/big"), policy(allowed_domains=LOOPBACK, max_bytes=1000))
    assert f"127.0.0.1:{server.port} sends 10000 bytes; the limit is 1000 bytes" in message
    assert fetch_bytes(server.url("/big"), policy(allowed_domains=LOOPBACK, max_bytes=10_000), FIELD) == b"b" * 10_000


def test_a_chunked_body_over_the_cap_stops_early(server):
    message = refused(server.url("/chunked"), policy(allowed_domains=LOOPBACK, max_bytes=100_000))
    assert "sent more than 100000 bytes; the limit is 100000 bytes" in message
    assert wait_for(server.chunked_done.is_set)
    assert not server.chunked_finished and server.chunked_sent < CHUNKED_TOTAL // 4


def test_a_body_shorter_than_its_content_length(server):
    message = refused(server.url("/short"), policy(allowed_domains=LOOPBACK))
    assert "closed the connection after 50 of 100 bytes" in message


def test_messages_never_show_the_query_string_or_userinfo(server, dns):
    dns.names["media.example.com"] = ["10.0.0.5"]
    for url, pol in [
        (f"http://alice:hunter2@127.0.0.1:{server.port}/missing?token=SECRET", policy(allowed_domains=LOOPBACK)),
        (f"http://alice:hunter2@127.0.0.1:{server.port}/body?token=SECRET", policy()),
        ("http://alice:hunter2@media.example.com/a.png?token=SECRET", policy()),
        ("ftp://alice:hunter2@media.example.com/a.png?token=SECRET", policy()),
        (f"http://127.0.0.1:{server.port}/loop/0?token=SECRET", policy(allowed_domains=LOOPBACK, max_redirects=1)),
    ]:
        message = refused(url, pol)
        assert "SECRET" not in message and "hunter2" not in message and "alice" not in message, message


# --- fetch_to_file -----------------------------------------------------------------------------

def test_fetch_to_file_writes_the_body(server, tmp_path):
    target = tmp_path / "scene.tif"
    assert fetch_to_file(server.url("/body"), target, policy(allowed_domains=LOOPBACK), "data.data") == len(BODY)
    assert target.read_bytes() == BODY and sorted(p.name for p in tmp_path.iterdir()) == ["scene.tif"]


@pytest.mark.parametrize("path,pol", [
    ("/chunked", policy(allowed_domains=LOOPBACK, max_bytes=200_000)),  # fails after writing 196608 bytes
    ("/missing", policy(allowed_domains=LOOPBACK)),
    ("/body", policy()),  # refused address
    ("/drip", policy(allowed_domains=LOOPBACK, total_timeout_s=0.3)),
])
def test_fetch_to_file_leaves_nothing_on_failure(server, tmp_path, path, pol):
    target = tmp_path / "scene.tif"
    with pytest.raises(InputError, match=r"^data\.data: "):
        fetch_to_file(server.url(path), target, pol, "data.data")
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"earlier")
    with pytest.raises(InputError):
        fetch_to_file(server.url(path), str(target), pol, "data.data")
    assert target.read_bytes() == b"earlier" and list(tmp_path.iterdir()) == [target]


def test_fetch_to_an_open_file_truncates_back_on_failure(server, tmp_path):
    with open(tmp_path / "out.bin", "w+b") as f:
        f.write(b"header")
        assert fetch_to_file(server.url("/body"), f, policy(allowed_domains=LOOPBACK), "data.data") == len(BODY)
        with pytest.raises(InputError):
            fetch_to_file(server.url("/chunked"), f, policy(allowed_domains=LOOPBACK, max_bytes=200_000), "data.data")
    assert (tmp_path / "out.bin").read_bytes() == b"header" + BODY


# --- https -------------------------------------------------------------------------------------

@pytest.fixture
def tls_server(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = make_certificate(tmp_path, "media.test")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    names = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    running = LocalServer(ssl_context=context)
    running.sni_names = names
    running.trust = ssl.create_default_context(cafile=str(cert))
    yield running
    running.close()


def test_https_uses_the_host_name_for_sni_host_and_certificate(tls_server, dns):
    dns.names["media.test"] = ["127.0.0.1"]
    dns.names["other.test"] = ["127.0.0.1"]
    pol = policy(allowed_domains=("media.test", "other.test"))
    url = f"https://media.test:{tls_server.port}/host"
    assert fetch_bytes(url, pol, FIELD, ssl_context=tls_server.trust) == f"media.test:{tls_server.port}".encode()
    assert tls_server.sni_names == ["media.test"]
    message = refused(f"https://other.test:{tls_server.port}/body", pol, ssl_context=tls_server.trust)
    assert f"TLS certificate check failed for other.test:{tls_server.port}" in message
    message = refused(url, pol)  # the default trust store does not know the test certificate
    assert "TLS certificate check failed" in message and "valid certificate for its name" in message
