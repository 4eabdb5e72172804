"""A reverse proxy that mounts a server under a path prefix, as the chart's ingress-nginx Ingress does
(path `PREFIX(/|$)(.*)`, rewrite to `/$2`, `X-Forwarded-Prefix: PREFIX`): it takes `/PREFIX/rest` or
`/PREFIX`, asks the server for `/rest` or `/`, and streams the answer back (HTTP/1.0: the body ends when
the connection closes, so server-sent events pass as they come). Anything else is a 404."""
import contextlib
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def handler_for(upstream: str, prefix: str):
    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args):  # quiet: the test reads the browser's side
            pass

        def do_GET(self):
            self.forward()

        def do_POST(self):
            self.forward()

        def forward(self):
            path, _, query = self.path.partition("?")
            if path != prefix and not path.startswith(f"{prefix}/"):
                self.send_error(404)
                return
            rest = path[len(prefix):] or "/"
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["X-Forwarded-Prefix"] = prefix
            upstream_connection = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
            try:
                upstream_connection.request(self.command, f"{rest}?{query}" if query else rest, body=body,
                                            headers=headers)
                answer = upstream_connection.getresponse()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.end_headers()
                while chunk := answer.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser left (Stop): closing our upstream connection tells the server
            finally:
                upstream_connection.close()

    return Forward


@contextlib.contextmanager
def prefix_proxy(upstream: str, prefix: str):
    """Yields the proxy's base URL, `http://127.0.0.1:PORT/PREFIX`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(upstream, prefix))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{prefix}"
    finally:
        server.shutdown()
        server.server_close()
