"""Tests that need no Plover server: header and error parsing, and the
requests the client sends, against a stub HTTP server in this process.

    cd clients/python && python3 -m unittest discover -s tests -v
"""

import base64
import json
import os
import select
import socket
import struct
import stat
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import plover  # noqa: E402
from plover import PloverError, parse_error, parse_server_timing  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None

# What the server writes (httpapi writeMeta).
TIMING = "queue;dur=0.012, sched;dur=0.001, load;dur=0.000, copyin;dur=0.004, kernels;dur=1.250, copyout;dur=0.003, resolve;dur=0.002, dispatch;dur=0.029, handoff;dur=0.011, handback;dur=0.009, total;dur=1.301"


def raw_server(test, answer):
    """A loopback server that reads each request once, writes answer (b"":
    nothing) and closes; returns its URL and the list of what it read.
    It closes its side only (a FIN), then reads to the client's close:
    closed with the request's body still unread (it may come in a second
    segment), the socket sent a reset instead, which could reach the
    client before the answer's bytes (ECONNRESET, no answer read)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    got = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            got.append(conn.recv(65536))
            if answer:
                conn.sendall(answer)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(5)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    test.addCleanup(srv.close)
    return "http://127.0.0.1:%d" % srv.getsockname()[1], got


class ParseServerTiming(unittest.TestCase):
    def test_server_format(self):
        self.assertEqual(parse_server_timing(TIMING), {
            "queue": 0.012, "sched": 0.001, "load": 0.0, "copyin": 0.004, "kernels": 1.25, "copyout": 0.003,
            "resolve": 0.002, "dispatch": 0.029, "handoff": 0.011, "handback": 0.009, "total": 1.301})

    def test_every_name(self):
        self.assertEqual(set(parse_server_timing(TIMING)), set(plover.client.TIMING_NAMES))

    def test_empty(self):
        self.assertEqual(parse_server_timing(None), {})
        self.assertEqual(parse_server_timing(""), {})

    def test_other_forms(self):
        # Any order and spacing, quoted durs, a desc, metrics without a dur.
        h = 'cache;desc="Cache Read";dur=23.2,db;dur="53" , app ;dur=47.2, miss, bad;dur=x'
        self.assertEqual(parse_server_timing(h), {"cache": 23.2, "db": 53.0, "app": 47.2})

    def test_case_of_dur(self):
        self.assertEqual(parse_server_timing("total;DUR=2"), {"total": 2.0})


class ParseError(unittest.TestCase):
    def test_error_object(self):
        e = parse_error(404, b'{"error":{"code":"not_found","message":"function nosuch is not deployed"}}\n')
        self.assertIsInstance(e, Exception)
        self.assertEqual((e.status, e.code, e.message), (404, "not_found", "function nosuch is not deployed"))
        self.assertIn("404 not_found", str(e))

    def test_str_body(self):
        e = parse_error(429, '{"error":{"code":"busy","message":"queue full"}}')
        self.assertEqual((e.status, e.code, e.message), (429, "busy", "queue full"))

    def test_not_json(self):
        e = parse_error(502, b"<html>Bad Gateway</html>\n")
        self.assertEqual((e.status, e.code, e.message), (502, "http", "<html>Bad Gateway</html>"))

    def test_json_without_error(self):
        e = parse_error(503, b'{"status":"unhealthy","devices":[]}')
        self.assertEqual((e.status, e.code), (503, "http"))
        self.assertIn("unhealthy", e.message)

    def test_bad_utf8(self):
        e = parse_error(500, b"\xff\xfe")
        self.assertEqual((e.status, e.code), (500, "http"))


class Stub(BaseHTTPRequestHandler):
    """Answers as a Plover server would, and records each request."""

    protocol_version = "HTTP/1.1"
    requests = []  # (method, path, headers, body)
    peers = []  # the client's address of each request: its connection

    def log_message(self, *args):
        pass

    def _answer(self, code, body, ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code, name, msg):
        self._answer(code, json.dumps({"error": {"code": name, "message": msg}}).encode() + b"\n")

    def _handle(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        Stub.requests.append((self.command, self.path, self.headers, body))
        Stub.peers.append(self.client_address)
        if self.path.startswith("http://plover.invalid:8080/"):
            # Asked of a proxy: the absolute URL's answer.
            return self._answer(200, b'{"functions":[]}')
        if self.path == "/v1/functions/drop/invoke":
            # Answers, then closes the connection without saying so, as a
            # server does when a kept connection's idle timeout passes.
            self._answer(200, body, "application/octet-stream")
            self.close_connection = True
            return
        if self.headers.get("Authorization") != "Bearer secret":
            return self._error(401, "unauthenticated", "this server needs a token")
        meta = [("Server-Timing", TIMING), ("X-Plover-Start", "cold"), ("X-Plover-Version", "v123")]
        if self.path == "/v1/functions/slow/invoke":
            # Answers after the deadline the request asked for (or 1.5 s).
            ms = int(self.headers.get("X-Plover-Timeout-Ms") or 1500)
            time.sleep(min(ms, 1500) / 1000)
            if self.headers.get("Content-Type") == "application/json":
                return self._answer(200, b'{"output": ""}', headers=meta)
            return self._answer(200, body, "application/octet-stream", meta)
        if self.path == "/v1/functions/version/invoke":
            # The version that ran is the input: each caller can tell its own.
            return self._answer(200, body, "application/octet-stream",
                                [("X-Plover-Version", body.decode()), ("X-Plover-Start", "hot")])
        if self.path == "/v1/functions/limited/invoke":
            self._answer(429, json.dumps({"error": {"code": "rate_limited", "message": "retry in 5 s"}}).encode(),
                         headers=[("Retry-After", "5")])
            return
        if self.path.startswith("/moved/"):
            self.send_response(307)
            self.send_header("Location", Stub.elsewhere + self.path[len("/moved"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/v1/functions/echo/invoke" and self.command == "POST":
            if self.headers.get("Content-Type") == "application/json":
                req = json.loads(body)
                out = base64.b64decode(req["inputs"])[: req["output_size"]]
                resp = {"output": base64.b64encode(out).decode(), "cold": True, "start": "cold", "version": "v123"}
                return self._answer(200, json.dumps(resp).encode(), headers=meta)
            return self._answer(200, body, "application/octet-stream", meta)
        if self.path == "/v1/functions" and self.command == "GET":
            return self._answer(200, b'{"functions":[{"name":"echo","version":"v123"}]}')
        if self.path == "/v1/functions/echo/rollback" and self.command == "POST":
            return self._answer(200, json.dumps({"name": "echo", "version": json.loads(body)["version"]}).encode())
        if self.path.startswith("/v1/functions/echo") and self.command == "PUT":
            return self._answer(201, b'{"name":"echo","version":"v124"}')
        if self.path.startswith("/v1/functions/used") and self.command == "DELETE":
            if self.path.endswith("?force=true"):
                return self._answer(200, b'{"deleted":"used"}')
            return self._error(409, "conflict", "function used is named by pipeline p")
        if self.path == "/v1/functions/a%2Fb":
            return self._error(404, "not_found", "function a/b is not deployed")
        if self.path == "/gateway":
            return self._answer(502, b"bad gateway", "text/plain")
        return self._error(404, "not_found", "no route for " + self.path)

    do_GET = do_POST = do_PUT = do_DELETE = _handle


class Elsewhere(BaseHTTPRequestHandler):
    """Another host, where a redirect points: records what reached it."""

    protocol_version = "HTTP/1.1"
    requests = []

    def log_message(self, *args):
        pass

    def _handle(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        Elsewhere.requests.append((self.command, self.path, self.headers, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PUT = do_DELETE = _handle


class AgainstStub(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
        cls.thread = threading.Thread(target=cls.srv.serve_forever, daemon=True)
        cls.thread.start()
        cls.url = "http://127.0.0.1:%d" % cls.srv.server_address[1]
        cls.other = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
        threading.Thread(target=cls.other.serve_forever, daemon=True).start()
        Stub.elsewhere = "http://localhost:%d" % cls.other.server_address[1]  # another host name

    @classmethod
    def tearDownClass(cls):
        cls.srv.shutdown()
        cls.srv.server_close()
        cls.other.shutdown()
        cls.other.server_close()

    def setUp(self):
        Stub.requests.clear()
        Stub.peers.clear()
        self.c = plover.Client(self.url, token="secret", timeout=10)
        self.addCleanup(self.c.close)

    def test_keeps_its_connection(self):
        # One connection for a thread's requests (no handshake each), an
        # error answer included; close() ends it and the next opens another.
        for _ in range(3):
            self.c.invoke("echo", b"x")
        with self.assertRaises(PloverError):
            self.c.function("a/b")
        self.c.functions()
        self.assertEqual(len(set(Stub.peers)), 1, Stub.peers)
        self.c.close()
        self.c.functions()
        self.assertEqual(len(set(Stub.peers)), 2, Stub.peers)

    @unittest.skipUnless(hasattr(os, "fork"), "no fork here")
    def test_fork_makes_its_own_connection(self):
        # A child forked after a request must not use the parent's socket:
        # the two would read each other's answers.
        self.assertEqual(self.c.invoke("echo", b"parent"), b"parent")
        pid = os.fork()
        if pid == 0:
            ok = False
            try:
                ok = self.c.invoke("echo", b"child") == b"child"
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        # Not os.waitstatus_to_exitcode: that is Python 3.9's, and the client supports 3.8.
        self.assertTrue(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status)
        self.assertEqual(self.c.invoke("echo", b"again"), b"again")
        self.assertEqual([r[3] for r in Stub.requests], [b"parent", b"child", b"again"])
        self.assertEqual(Stub.peers[0], Stub.peers[2])  # the parent kept its own
        self.assertNotEqual(Stub.peers[0], Stub.peers[1])

    def closed_by_server(self):
        # Wait until the server's close of this thread's kept connection
        # has reached the client (its socket reads EOF).
        sock = self.c._local.conn.sock
        self.assertIsNotNone(sock, "no kept connection")
        r, _, _ = select.select([sock], [], [], 10)
        self.assertTrue(r, "the server did not close the connection within 10 s")

    def test_server_closed_kept_connection(self):
        # The server closed the kept connection after its answer, while
        # idle: the client sees it closed before sending, and the next
        # request (a POST) goes on a new connection, reaching the server once.
        self.assertEqual(self.c.invoke("drop", b"a"), b"a")
        self.closed_by_server()
        self.assertEqual(self.c.invoke("echo", b"b"), b"b")
        self.assertEqual(self.c.invoke("drop", b"c"), b"c")
        self.closed_by_server()
        self.assertEqual(self.c.invoke("drop", b"d"), b"d")
        self.assertEqual([r[3] for r in Stub.requests], [b"a", b"b", b"c", b"d"])
        self.assertEqual(len(set(Stub.peers)), 3, Stub.peers)

    def test_no_answer_is_not_sent_again(self):
        # A new connection closed without an answer: unreachable, the request
        # sent once (only a kept connection's request is sent again).
        url, got = raw_server(self, b"")
        with plover.Client(url, timeout=5) as c:
            with self.assertRaises(PloverError) as cm:
                c.invoke("echo", b"once")
        self.assertEqual((cm.exception.status, cm.exception.code), (None, "unreachable"), cm.exception)
        self.assertEqual(len(got), 1, got)

    def test_proxy_from_environment(self):
        # $http_proxy as urllib reads it: the request goes to the proxy, by
        # its absolute URL; $no_proxy sends it straight.
        keys = ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")
        old = {k: os.environ.get(k) for k in keys}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in old.items()])
        for k in keys:
            os.environ.pop(k, None)
        os.environ["http_proxy"] = self.url
        with plover.Client("http://plover.invalid:8080", timeout=5) as c:
            self.assertEqual(c.functions(), [])
        self.assertEqual(Stub.requests[-1][1], "http://plover.invalid:8080/v1/functions")
        os.environ["no_proxy"] = "plover.invalid"
        with plover.Client("http://plover.invalid:8080", timeout=5) as c:
            with self.assertRaises(PloverError) as cm:
                c.functions()
        self.assertEqual(cm.exception.code, "unreachable")
        # A server on this machine goes straight, $no_proxy or not, as Go's
        # clients do: the proxy would read the token and could not reach it.
        os.environ.pop("no_proxy")
        for host in ("127.0.0.1", "localhost", "[::1]"):
            # The stub is the proxy: a request through it would be one more
            # it saw; straight to port 1, the client finds nobody there.
            seen = len(Stub.requests)
            with plover.Client("http://%s:1" % host, token="t", timeout=5) as c:
                with self.assertRaises(PloverError, msg=host) as cm:
                    c.functions()
            self.assertEqual((cm.exception.code, len(Stub.requests)), ("unreachable", seen), host)

    def test_pyplover_inputs_are_bytes(self):
        # bytes(3) is three zero bytes: an int was sent as such.
        with self.assertRaises(TypeError):
            self.c.invoke_pyplover("echo", 3, ["k"], [1], [1], 3)
        out = self.c.invoke_pyplover("echo", b"\x01\x02\x03", ["k"], [1], [1], 3)
        self.assertEqual(out, b"\x01\x02\x03")

    def test_delete_force(self):
        with self.assertRaises(PloverError) as cm:
            self.c.delete("used")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))
        self.assertEqual(self.c.delete("used", force=True), {"deleted": "used"})
        self.assertEqual(Stub.requests[-1][:2], ("DELETE", "/v1/functions/used?force=true"))

    def test_invoke_bytes(self):
        out = self.c.invoke("echo", b"\x01\x02\x03", timeout_ms=250)
        self.assertEqual(out, b"\x01\x02\x03")
        method, path, hdrs, body = Stub.requests[-1]
        self.assertEqual((method, path, body), ("POST", "/v1/functions/echo/invoke", b"\x01\x02\x03"))
        self.assertEqual(hdrs["Content-Type"], "application/octet-stream")
        self.assertEqual(hdrs["X-Plover-Timeout-Ms"], "250")
        self.assertEqual(hdrs["Authorization"], "Bearer secret")
        self.assertEqual(self.c.last_timing["kernels"], 1.25)
        self.assertEqual(self.c.last_start, "cold")
        self.assertEqual(self.c.last_version, "v123")

    def test_invoke_buffer_types(self):
        self.assertEqual(self.c.invoke("echo", bytearray(b"ab")), b"ab")
        self.assertEqual(self.c.invoke("echo", memoryview(b"cd")), b"cd")
        self.assertEqual(self.c.invoke("echo", b""), b"")
        with self.assertRaises(TypeError):
            self.c.invoke("echo", "a str")
        with self.assertRaises(ValueError):
            self.c.invoke("echo", b"ab", shape=(2,))

    @unittest.skipIf(np is None, "NumPy is not installed")
    def test_invoke_numpy(self):
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        out = self.c.invoke("echo", a.T, dtype=np.float32, shape=(4, 3))  # a.T: not C-contiguous
        np.testing.assert_array_equal(out, a.T)
        self.assertEqual(Stub.requests[-1][3], np.ascontiguousarray(a.T).astype("<f4").tobytes())
        out[0, 0] = 7  # writable
        big = np.arange(3, dtype=">i4")
        got = self.c.invoke("echo", big, dtype=">i4")
        self.assertEqual(Stub.requests[-1][3], np.arange(3, dtype="<i4").tobytes())  # little-endian on the wire
        np.testing.assert_array_equal(got, big)
        self.assertEqual(got.dtype, np.dtype(">i4"))
        with self.assertRaises(ValueError):
            self.c.invoke("echo", b"\x00" * 5, dtype=np.float32)

    def test_invoke_pyplover(self):
        out = self.c.invoke_pyplover("echo", b"hello", ["echo"], [1], [64], 3, timeout_ms=1000)
        self.assertEqual(out, b"hel")
        _, _, hdrs, body = Stub.requests[-1]
        self.assertEqual(hdrs["Content-Type"], "application/json")
        self.assertEqual(json.loads(body), {
            "name": "echo", "inputs": base64.b64encode(b"hello").decode(), "func_names": ["echo"],
            "grid_sizes": [1], "block_sizes": [64], "output_size": 3, "tmp_size": 0, "timeout_ms": 1000})
        self.assertEqual(self.c.last_start, "cold")
        self.assertEqual(self.c.last_timing["total"], 1.301)
        with self.assertRaises(ValueError):
            self.c.invoke_pyplover("echo", b"", ["echo", "add_one"], [1], [1], 1)

    def test_errors(self):
        with self.assertRaises(PloverError) as cm:
            self.c.function("a/b")  # the name is one path segment
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        self.assertEqual(cm.exception.message, "function a/b is not deployed")
        with self.assertRaises(PloverError) as cm:
            self.c._request("GET", "/gateway")
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.message), (502, "http", "bad gateway"))

    def test_no_token(self):
        c = plover.Client(self.url, token="", timeout=10)
        self.addCleanup(c.close)
        with self.assertRaises(PloverError) as cm:
            c.functions()
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))
        self.assertIn("no token was sent", cm.exception.message)
        self.assert_args_agree(cm.exception)
        self.assertNotIn("Authorization", Stub.requests[-1][2])

    def test_control_plane(self):
        self.assertEqual(self.c.functions(), [{"name": "echo", "version": "v123"}])
        self.assertEqual(self.c.rollback("echo", "v1")["version"], "v1")
        self.assertEqual(json.loads(Stub.requests[-1][3]), {"version": "v1"})
        self.assertEqual(self.c.deploy_bundle("echo", b"\x28\xb5\x2f\xfd", force=True)["version"], "v124")
        method, path, hdrs, body = Stub.requests[-1]
        self.assertEqual((method, path, body), ("PUT", "/v1/functions/echo?force=true", b"\x28\xb5\x2f\xfd"))
        self.assertEqual(hdrs["Content-Type"], "application/vnd.plover.bundle+zstd")

    def test_timeout_ms_longer_than_timeout(self):
        # A deadline past the client's own timeout: the client waits for the
        # server's answer (up to the deadline and a grace), as plover invoke
        # --timeout does, rather than give up first as "unreachable".
        c = plover.Client(self.url, token="secret", timeout=0.5)
        self.addCleanup(c.close)
        self.assertEqual(c.invoke("slow", b"late", timeout_ms=1500), b"late")
        self.assertEqual(Stub.requests[-1][2]["X-Plover-Timeout-Ms"], "1500")
        self.assertEqual(c.invoke_pyplover("slow", b"x", ["echo"], [1], [1], 1, timeout_ms=1500), b"")
        with self.assertRaises(PloverError) as cm:  # without a deadline, its timeout holds
            c.invoke("slow", b"x")
        # a timeout, not "unreachable": the server was reached
        self.assertEqual((cm.exception.status, cm.exception.code), (None, "timeout"), cm.exception)
        self.assertIn("within 0.5 s", cm.exception.message)

    def test_timeout_ms_wait_capped(self):
        # The server cuts a deadline to its --max-timeout (max_timeout, 600 s
        # by default): the client's wait follows timeout_ms no further,
        # rather than some 50 days for timeout_ms=1e12.
        self.assertEqual(plover.Client(self.url, timeout=10)._wait(10**12), 602.0)
        self.assertEqual(plover.Client(self.url, timeout=10)._wait(5000), 10)
        self.assertEqual(plover.Client(self.url, timeout=10, max_timeout=None)._wait(900000), 902.0)
        old = plover.client.INVOKE_GRACE
        plover.client.INVOKE_GRACE = 0.1  # a short test: the stub answers after 1.5 s
        self.addCleanup(setattr, plover.client, "INVOKE_GRACE", old)
        c = plover.Client(self.url, token="secret", timeout=0.2, max_timeout=0.3)
        self.addCleanup(c.close)
        start = time.monotonic()
        with self.assertRaises(PloverError) as cm:
            c.invoke("slow", b"x", timeout_ms=1e12)
        self.assertLess(time.monotonic() - start, 1.4)
        self.assertEqual((cm.exception.status, cm.exception.code), (None, "timeout"), cm.exception)
        self.assertIn("within 0.4 s", cm.exception.message)
        self.assertEqual(Stub.requests[-1][2]["X-Plover-Timeout-Ms"], str(2**32 - 1))  # sent as asked
        # With no cap, the wait stays one a socket keeps: 2**32-1 ms and the
        # grace wrapped to 0.1 s (poll's milliseconds are a C int), and the
        # answer after 1.5 s was missed.
        c = plover.Client(self.url, token="secret", timeout=0.2, max_timeout=None)
        self.addCleanup(c.close)
        self.assertEqual(c.invoke("slow", b"late", timeout_ms=1e12), b"late")
        for bad, err in ((0, ValueError), (-1, ValueError), (float("inf"), ValueError), (True, TypeError)):
            with self.assertRaises(err, msg=bad):
                plover.Client(self.url, max_timeout=bad)
            # timeout=0 made every socket non-blocking: each request failed
            # with a bare BlockingIOError.
            with self.assertRaises(err, msg=bad):
                plover.Client(self.url, timeout=bad)
        self.assertIsNone(plover.Client(self.url, timeout=None).timeout)

    def test_long_timeout_waits(self):
        # A timeout past the longest wait a socket keeps (poll's C int of
        # milliseconds) wrapped to a short one: 4294967.4 s timed out after
        # 0.1 s. It is cut to that longest wait instead.
        c = plover.Client(self.url, token="secret", timeout=4294967.4, max_timeout=None)
        self.addCleanup(c.close)
        self.assertLessEqual(c.timeout, 2147483.0)
        self.assertEqual(c.invoke("slow", b"late"), b"late")

    def test_connect_waits_timeout(self):
        # Connecting waits the client's timeout, not an invoke's stretched
        # wait (602 s for a 10-minute deadline); the answer gets that.
        waits = []
        real = socket.create_connection

        def create_connection(address, timeout=None, *args, **kw):
            waits.append(timeout)
            return real(address, timeout, *args, **kw)

        socket.create_connection = create_connection  # read by http.client as a connection is made
        self.addCleanup(setattr, socket, "create_connection", real)
        c = plover.Client(self.url, token="secret", timeout=0.5)
        self.addCleanup(c.close)
        self.assertEqual(c.invoke("echo", b"x", timeout_ms=600000), b"x")
        self.assertEqual(waits, [0.5])
        self.assertEqual(c._local.conn.sock.gettimeout(), 602.0)
        c.functions()  # the kept connection's next request waits timeout again
        self.assertEqual(c._local.conn.sock.gettimeout(), 0.5)
        self.assertEqual(waits, [0.5])

    def test_timeout_ms_bool(self):
        # float(True) is 1.0: a 1 ms deadline nobody meant.
        n = len(Stub.requests)
        for bad in (True, False):
            with self.assertRaises(TypeError, msg=bad) as cm:
                self.c.invoke("echo", b"x", timeout_ms=bad)
            self.assertIn("timeout_ms", str(cm.exception))
            with self.assertRaises(TypeError, msg=bad):
                self.c.invoke_pyplover("echo", b"x", ["echo"], [1], [1], 1, timeout_ms=bad)
        self.assertEqual(len(Stub.requests), n)  # nothing sent

    def test_timeout_ms_rounding(self):
        # Whole milliseconds, rounded up as plover invoke --timeout rounds: a
        # fraction is never cut to a shorter deadline, or to 0 (which the
        # server refuses with 400).
        self.c.invoke("echo", b"x", timeout_ms=0.5)
        self.assertEqual(Stub.requests[-1][2]["X-Plover-Timeout-Ms"], "1")
        self.c.invoke("echo", b"x", timeout_ms=1.2)
        self.assertEqual(Stub.requests[-1][2]["X-Plover-Timeout-Ms"], "2")
        self.c.invoke_pyplover("echo", b"x", ["echo"], [1], [1], 1, timeout_ms=2.5)
        self.assertEqual(json.loads(Stub.requests[-1][3])["timeout_ms"], 3)
        n = len(Stub.requests)
        for bad in (0, -5, float("nan"), float("inf")):
            with self.assertRaises(ValueError):
                self.c.invoke("echo", b"x", timeout_ms=bad)
        self.assertEqual(len(Stub.requests), n)  # nothing sent

    def test_retry_after(self):
        with self.assertRaises(PloverError) as cm:
            self.c.invoke("limited", b"x")
        e = cm.exception
        self.assertEqual((e.status, e.code, e.retry_after), (429, "rate_limited", 5.0))
        self.assertEqual(e.headers["Retry-After"], "5")
        with self.assertRaises(PloverError) as cm:
            self.c.function("a/b")
        self.assertIsNone(cm.exception.retry_after)

    def test_no_redirect(self):
        # A redirect to another host must not carry the token there (urllib
        # would follow it with Authorization, and turn a POST into a
        # bodiless GET on a 301, 302 or 303).
        Elsewhere.requests.clear()
        with self.assertRaises(PloverError) as cm:
            self.c._request("GET", "/moved/v1/functions")
        self.assertEqual([r[2].get("Authorization") for r in Elsewhere.requests], [])
        self.assertEqual(cm.exception.status, 307)
        self.assertIn(Stub.elsewhere, cm.exception.message)
        self.assert_args_agree(cm.exception)

    def assert_args_agree(self, e):
        # The message the client completed is the one in args, and so in
        # repr (pytest, %r logging), not the server's bare one.
        self.assertEqual(e.args, (e.status, e.code, e.message))
        self.assertIn(repr(e.message), repr(e))
        self.assertEqual(str(e), "%d %s: %s" % e.args)

    def test_threads_own_last(self):
        # Threads sharing a Client each read their own invoke's last_*.
        barrier = threading.Barrier(2, timeout=10)
        got = {}

        def call(v):
            self.c.invoke("version", v.encode())
            barrier.wait()
            got[v] = self.c.last_version
            self.c.close()  # this thread's connection

        ts = [threading.Thread(target=call, args=(v,)) for v in ("va", "vb")]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(got, {"va": "va", "vb": "vb"})

    def test_unreachable(self):
        c = plover.Client("http://127.0.0.1:1", timeout=5)
        with self.assertRaises(PloverError) as cm:
            c.health()
        self.assertIsNone(cm.exception.status)
        self.assertEqual(cm.exception.code, "unreachable")


class Resetter:
    """A server that answers GET /healthz (keeping the connection) and
    reads every other request in full, records it, then resets the
    connection without an answer: a server killed, or a proxy cutting the
    connection, after the request arrived. A GET of a path in answer_again
    is answered (404) when it comes a second time."""

    answer_again = ("/v1/functions/twice",)

    def __init__(self):
        self.arrived = []  # "METHOD PATH" of each request read
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.url = "http://127.0.0.1:%d" % self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.srv.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _answer(self, conn, status, body):
        conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (status, len(body), body))

    def _serve(self, conn):
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                conn.close()
                return
            n = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b""):
                    break
                k, _, v = h.decode().partition(":")
                if k.strip().lower() == "content-length":
                    n = int(v)
            f.read(n)
            method, path = line.decode().split()[:2]
            with self.lock:
                self.arrived.append("%s %s" % (method, path))
                count = self.arrived.count("%s %s" % (method, path))
            if path == "/healthz":
                self._answer(conn, b"200 OK", b'{"status":"ok","devices":[]}')
            elif path in self.answer_again and count > 1:
                self._answer(conn, b"404 Not Found", b'{"error":{"code":"not_found","message":"no twice"}}')
            else:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # a reset (RST), no answer
                return


class CutAfterTheRequest(unittest.TestCase):
    """A kept connection cut after the request reached the server: the
    request may have run, and only a GET is sent again."""

    def setUp(self):
        self.srv = Resetter()
        self.addCleanup(self.srv.close)
        self.c = plover.Client(self.srv.url, timeout=10)
        self.addCleanup(self.c.close)

    def test_not_sent_twice(self):
        calls = [
            ("POST /v1/functions/fn/invoke", lambda: self.c.invoke("fn", b"x" * 16)),
            ("POST /v1/functions/fn/invoke", lambda: self.c.invoke_pyplover("fn", b"x", ["k"], [1], [1], 1)),
            ("DELETE /v1/functions/fn", lambda: self.c.delete("fn")),
            ("DELETE /v1/functions/fn?force=true", lambda: self.c.delete("fn", force=True)),
            ("PUT /v1/functions/fn?force=true", lambda: self.c.deploy_bundle("fn", b"b" * 10, force=True)),
            ("POST /v1/functions/fn/rollback", lambda: self.c.rollback("fn", "abcdef12")),
        ]
        for want, call in calls:
            with self.subTest(want):
                self.srv.arrived.clear()
                self.assertEqual(self.c.health()["status"], "ok")  # the connection is a kept one now
                with self.assertRaises(PloverError) as cm:
                    call()
                self.assertEqual(self.srv.arrived, ["GET /healthz", want])  # once
                e = cm.exception
                self.assertEqual((e.status, e.code), (None, "unreachable"), e)
                self.assertIn("closed the connection before answering", e.message)
                self.assertIn("may have run", e.message)

    def test_get_is_sent_again(self):
        # A GET changes nothing: cut on a kept connection, it goes once more
        # on a new one (whose answer, here a 404, is the caller's).
        self.c.health()
        with self.assertRaises(PloverError) as cm:
            self.c.function("twice")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"), cm.exception)
        self.assertEqual(self.srv.arrived, ["GET /healthz", "GET /v1/functions/twice", "GET /v1/functions/twice"])

    def test_answer_cut_short(self):
        # An answer cut in its body (Content-Length 10, 3 bytes, then a
        # close): the request reached the server and may have run, and is
        # said so, not as a bare "unreachable" IncompleteRead.
        url, got = raw_server(self, b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                    b"Content-Length: 10\r\n\r\nabc")
        with plover.Client(url, timeout=5) as c:
            for method, call in (("POST", lambda: c.invoke("fn", b"x")), ("GET", c.functions)):
                with self.assertRaises(PloverError, msg=method) as cm:
                    call()
                e = cm.exception
                self.assertEqual((e.status, e.code), (None, "unreachable"), e)
                self.assertIn("in the middle of its answer", e.message)
                self.assertIn("the %s request was sent and may have run" % method, e.message)
                self.assertIn("3 bytes read", e.message)
        self.assertEqual(len(got), 2, got)  # each sent once

    def test_new_connection_get_not_sent_again(self):
        # Cut on a new connection: nothing to blame on an idle close; once.
        with self.assertRaises(PloverError) as cm:
            self.c.function("twice")
        self.assertEqual(cm.exception.code, "unreachable")
        self.assertEqual(self.srv.arrived, ["GET /v1/functions/twice"])


class Defaults(unittest.TestCase):
    def test_env(self):
        old = {k: os.environ.get(k) for k in ("PLOVER_SERVER", "PLOVER_TOKEN")}
        try:
            os.environ["PLOVER_SERVER"] = "example.com:9000/"
            os.environ["PLOVER_TOKEN"] = "t0k"
            c = plover.Client()
            self.assertEqual((c.url, c.token), ("http://example.com:9000", "t0k"))
            self.assertEqual(plover.Client(token="other").token, "other")
            del os.environ["PLOVER_SERVER"], os.environ["PLOVER_TOKEN"]
            c = plover.Client()
            self.assertEqual((c.url, c.token), ("http://127.0.0.1:8080", None))
            self.assertEqual(plover.Client("https://h:8443/base/").url, "https://h:8443/base")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


    def test_bad_url(self):
        # As the CLI's --server check: no other scheme (file:// would read
        # local files), no query or fragment (paths would go after it).
        for bad in ("file:///etc", "ftp://h", "http://h:8080/?a=1", "http://h#x", "http://", "http://h:99999"):
            with self.assertRaises(ValueError, msg=bad):
                plover.Client(bad)
        # Credentials in the URL would be sent to no one but printed in
        # every error: refused, and not echoed.
        for bad in ("http://alice:hunter2@h:8080", "ftp://u:hunter2@h", "http://u:hunter2@:8080", "http://u:hunter2@h/?q", "http://u:hunter2/x@h:1", "http://u:hun?ter2@h:1"):
            with self.assertRaises(ValueError, msg=bad) as cm:
                plover.Client(bad)
            self.assertNotIn("hunter2", str(cm.exception), bad)

    def test_token_is_one_word(self):
        # Read from a file, a token ends with a newline: taken off. One with
        # white space or a control character inside is refused unechoed
        # (http.client's own error printed the header, token and all).
        self.assertEqual(plover.Client("http://h:1", token="s3cr3t\n").token, "s3cr3t")
        self.assertIsNone(plover.Client("http://h:1", token=" \n").token)
        for bad in ("s3 cr3t", "s3\rcr3t", "s3\x00cr3t"):
            with self.assertRaises(ValueError) as cm:
                plover.Client("http://h:1", token=bad)
            self.assertNotIn("cr3t", str(cm.exception))

    def test_token_is_ascii(self):
        # A character outside ASCII is refused as the Client is made, the
        # token unechoed: http.client's UnicodeEncodeError held the whole
        # Authorization header ('Bearer s3cr3t€'), and a Latin-1 one would go
        # as a byte the CLI (UTF-8) does not send.
        for bad in ("s3cr3t\u20ac", "s3cr3t\xe9", "\u00a0s3cr3t\u3000x"):
            with self.assertRaises(ValueError, msg=ascii(bad)) as cm:
                plover.Client("http://h:1", token=bad)
            self.assertNotIn("cr3t", str(cm.exception))
            self.assertNotIn("cr3t", repr(cm.exception))
            self.assertIn("outside ASCII", str(cm.exception))
        self.assertEqual(plover.Client("http://h:1", token="a-Z_0.9~+/=!").token, "a-Z_0.9~+/=!")


class DeployViaCLI(unittest.TestCase):
    """deploy runs the plover CLI: here a fake one that echoes what it got."""

    def fake(self, script):
        d = tempfile.mkdtemp()
        self.addCleanup(lambda: __import__("shutil").rmtree(d))
        p = os.path.join(d, "plover")
        with open(p, "w") as f:
            f.write("#!/bin/sh\n" + script)
        os.chmod(p, os.stat(p).st_mode | stat.S_IEXEC)
        return p

    @unittest.skipIf(os.name != "posix", "a shell script stands in for the CLI")
    def test_deployed(self):
        cli = self.fake('echo "args: $*" >&2\n'
                        'echo "{\\"name\\": \\"echo\\", \\"version\\": \\"0123456789abcdef\\", \\"created\\": true, \\"bytes\\": 42, \\"sha256\\": \\"token=$PLOVER_TOKEN\\"}"\n')
        c = plover.Client("http://127.0.0.1:1", token="tk")
        r = c.deploy("/some/dir", force=True, plover=cli)
        # Parsed fields only, no raw JSON string; the token reached the CLI
        # (the fake echoes it in sha256).
        self.assertEqual(r, {"name": "echo", "version": "0123456789abcdef", "unchanged": False,
                             "sha256": "token=tk", "bytes": 42})

    @unittest.skipIf(os.name != "posix", "a shell script stands in for the CLI")
    def test_args(self):
        cli = self.fake('echo "$*" | grep -qx -- "deploy /some/dir --server http://127.0.0.1:1 --json --force" || exit 3\n'
                        'echo \'{"name": "echo", "version": "0123", "created": false}\'\n')
        r = plover.Client("http://127.0.0.1:1", token="tk").deploy("/some/dir", force=True, plover=cli)
        self.assertEqual((r["name"], r["version"], r["unchanged"]), ("echo", "0123", True))

    @unittest.skipIf(os.name != "posix", "a shell script stands in for the CLI")
    def test_failure(self):
        cli = self.fake('echo "plover deploy: server said 403 forbidden: token \\"app\\" lacks deploy" >&2\nexit 1\n')
        with self.assertRaises(PloverError) as cm:
            plover.Client("http://127.0.0.1:1").deploy("/d", plover=cli)
        self.assertEqual((cm.exception.status, cm.exception.code), (403, "forbidden"))
        self.assertEqual(cm.exception.message, 'token "app" lacks deploy')
        cli = self.fake('echo "plover deploy: plover.json: no such file" >&2\nexit 1\n')
        with self.assertRaises(PloverError) as cm:
            plover.Client("http://127.0.0.1:1").deploy("/d", plover=cli)
        self.assertEqual((cm.exception.status, cm.exception.code), (None, "deploy_failed"))
        self.assertIn("plover.json", cm.exception.message)

    @unittest.skipIf(os.name != "posix", "a shell script stands in for the CLI")
    def test_timeout(self):
        # A CLI that never ends is stopped at deploy's timeout, and said
        # as a timeout; the client's own (for its requests) is not deploy's.
        cli = self.fake("exec sleep 20\n")
        for client, kw, wait in [(plover.Client("http://127.0.0.1:1", timeout=0.01), {"timeout": 0.3}, "0.3"),
                                 (plover.Client("http://127.0.0.1:1", timeout=None), {"timeout": 0.2}, "0.2")]:
            start = time.monotonic()
            with self.assertRaises(PloverError) as cm:
                client.deploy("/d", plover=cli, **kw)
            self.assertLess(time.monotonic() - start, 10, "the CLI was not stopped")
            self.assertEqual((cm.exception.status, cm.exception.code), (None, "timeout"), cm.exception)
            self.assertIn("plover deploy /d did not finish within %s s" % wait, cm.exception.message)

    @unittest.skipIf(os.name != "posix", "a shell script stands in for the CLI")
    def test_retry_after(self):
        cli = self.fake('echo "plover deploy: server said 429 rate_limited: token app is over its rate (retry after 7 s)" >&2\nexit 1\n')
        with self.assertRaises(PloverError) as cm:
            plover.Client("http://127.0.0.1:1").deploy("/d", plover=cli)
        e = cm.exception
        self.assertEqual((e.status, e.code, e.message, e.retry_after), (429, "rate_limited", "token app is over its rate", 7.0))

    def test_no_cli(self):
        with self.assertRaises(FileNotFoundError):
            plover.Client().deploy("/d", plover="plover-no-such-binary-here")


if __name__ == "__main__":
    unittest.main()
