"""Real HTTP(S) servers on 127.0.0.1 (random ports) and a stand-in for DNS; nothing leaves the machine."""
import http.server
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

BODY = bytes(range(256)) * 40  # 10240 bytes
CHUNK = b"x" * 65536
CHUNKED_TOTAL = 64 * 1024 * 1024  # far more than loopback socket buffers hold


class LocalServer:
    """A threaded HTTP server with a fixed set of routes. Records each request's path and Host header."""

    def __init__(self, ssl_context=None, host="127.0.0.1"):
        self.requests = []                   # (path, Host header)
        self.connections = self.closed = 0   # TCP connections accepted, and ended
        self.stop = threading.Event()        # set at teardown: stalling handlers give up
        self.chunked_sent = 0
        self.chunked_finished = False
        self.chunked_done = threading.Event()
        server_class = _IPv6Server if ":" in host else http.server.ThreadingHTTPServer
        self.httpd = server_class((host, 0), self._handler_class())
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path, host="127.0.0.1", scheme="http"):
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler_class(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked responses need 1.1

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Host")))
                route = urllib.parse.urlsplit(self.path).path.strip("/").split("/")[0]
                getattr(server, f"route_{route.replace('-', '_')}", server.route_missing)(self)

            def log_message(self, *args):
                pass

            def setup(self):  # once per connection (HTTP/1.1 keeps one open for many requests)
                super().setup()
                server.connections += 1

            def finish(self):
                super().finish()
                server.closed += 1

        return Handler

    # --- routes: /<name>[/...] -> route_<name>(handler) ------------------------------------

    @staticmethod
    def _send(h, status, body=b"", headers=()):
        h.send_response(status)
        for name, value in headers:
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def route_body(self, h):
        self._send(h, 200, BODY)

    def route_host(self, h):
        """Echoes the Host header the client sent."""
        self._send(h, 200, h.headers.get("Host", "").encode())

    def route_missing(self, h):
        self._send(h, 404, b"not here")

    def route_error(self, h):
        self._send(h, 500, b"boom")

    def route_redirect(self, h):
        """/redirect?to=<url>&status=<3xx>; an empty `to` sends no Location."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(h.path).query, keep_blank_values=True)
        to = query["to"][0]
        self._send(h, int(query.get("status", ["302"])[0]), headers=[("Location", to)] if to else [])

    def route_loop(self, h):
        """/loop/N redirects to /loop/N+1 for ever."""
        n = int(h.path.split("/")[2])
        self._send(h, 302, headers=[("Location", f"/loop/{n + 1}")])

    def route_stall_headers(self, h):
        self.stop.wait(5)

    def route_stall_body(self, h):
        h.send_response(200)
        h.send_header("Content-Length", "10")
        h.end_headers()
        h.wfile.write(b"abc")
        self.stop.wait(5)

    def route_drip(self, h):
        """One byte every 50 ms: each read is quick, the whole transfer is not."""
        h.send_response(200)
        h.send_header("Content-Length", "200")
        h.end_headers()
        try:
            for _ in range(200):
                h.wfile.write(b"d")
                if self.stop.wait(0.05):
                    return
        except OSError:
            pass

    def route_hangup(self, h):
        """Answers in full, then closes the connection without saying so (as an idle timeout does)."""
        self._send(h, 200, BODY)
        h.close_connection = True

    def route_big(self, h):
        self._send(h, 200, b"b" * 10_000)

    def route_short(self, h):
        """Promises 100 bytes, sends 50, hangs up."""
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b"s" * 50)
        h.close_connection = True

    def route_chunked(self, h):
        """64 MiB in 64 KiB chunks, no Content-Length; records how far it got."""
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            while self.chunked_sent < CHUNKED_TOTAL:
                h.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                self.chunked_sent += len(CHUNK)
            h.wfile.write(b"0\r\n\r\n")
            self.chunked_finished = True
        except OSError:
            h.close_connection = True
        finally:
            self.chunked_done.set()


class _IPv6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def server():
    running = LocalServer()
    yield running
    running.close()


class FakeDNS:
    """getaddrinfo with some names answered from a table; others go to the real resolver.
    A table value is a list of IP strings, a list of such lists (one per lookup, the last repeats), or an
    exception to raise."""

    def __init__(self, real):
        self.real, self.names, self.lookups = real, {}, []

    def __call__(self, host, port, family=0, type=0, proto=0, flags=0):
        self.lookups.append(host)
        if host not in self.names:
            return self.real(host, port, family, type, proto, flags)
        answer = self.names[host]
        if isinstance(answer, Exception):
            raise answer
        if answer and isinstance(answer[0], list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port, 0, 0)) if ":" in ip
                else (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port)) for ip in answer]


@pytest.fixture
def dns(monkeypatch):
    fake = FakeDNS(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


def make_certificate(directory, name):
    """A self-signed certificate for `name` (openssl CLI); returns (cert path, key path)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}"], check=True, capture_output=True, timeout=30)
    return cert, key


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()
