"""The Plover HTTP API client (see the server's README, "HTTP API")."""

import base64
import json
import math
import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import http.client
import ipaddress
import urllib.parse
import urllib.request

DEFAULT_SERVER = "http://127.0.0.1:8080"
BUNDLE_MEDIA_TYPE = "application/vnd.plover.bundle+zstd"
OCTET_STREAM = "application/octet-stream"

# Server-Timing names, in the order the server writes them; handoff and
# handback (parts of dispatch) come only from a run in a worker process.
TIMING_NAMES = ("queue", "sched", "load", "copyin", "kernels", "copyout", "resolve", "dispatch", "handoff", "handback",
                "total")


class PloverError(Exception):
    """A request the server refused or failed (any non-2xx answer).

    status: the HTTP status (None when the server could not be reached or
    the plover CLI failed without saying one); code: the error object's code
    ("not_found", "unauthenticated", "bad_request", ...; "http" for an
    answer without an error object, "unreachable" for no answer, "timeout"
    with status None for none within the client's wait: the server's own
    deadline answers 504 "timeout");
    message: the error object's message; headers: the answer's headers
    (None without an answer; for deploy, which runs the CLI, only the
    Retry-After its message reported); retry_after: the seconds its Retry-After
    header asks the caller to wait before sending again (429 busy and
    rate_limited carry one, at least 1), else None. The client does not
    retry by itself. args is (status, code, message), kept so when any of
    the three is set, so that repr says what str says.
    """

    def __init__(self, status, code, message, headers=None):
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.retry_after = _retry_after(headers)

    # status, code and message are kept in args too, whenever one is set
    # (the client adds to a message after parse_error made it), so that
    # repr, pickling and %r logging say what str says.
    def _field(name):
        def get(self):
            return self.__dict__.get(name)

        def set_(self, v):
            self.__dict__[name] = v
            self.args = (self.status, self.code, self.message)

        return property(get, set_)

    status = _field("status")
    code = _field("code")
    message = _field("message")
    del _field

    def __str__(self):
        if self.status is None:
            return "%s: %s" % (self.code, self.message)
        return "%d %s: %s" % (self.status, self.code, self.message)


def _retry_after(headers):
    """Retry-After in seconds (delay-seconds; an HTTP date is read as
    seconds from now), or None."""
    if headers is None:
        return None
    v = headers.get("Retry-After")
    if not v:
        return None
    v = v.strip()
    try:
        return max(0.0, float(int(v)))
    except ValueError:
        pass
    try:
        import email.utils
        import time

        return max(0.0, email.utils.parsedate_to_datetime(v).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def parse_error(status, body, headers=None):
    """Return the PloverError for an answer with this status and body
    (and headers, for Retry-After).

    The server's errors are {"error": {"code": ..., "message": ...}}; any
    other body becomes code "http" with the body's text as the message.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        body = bytes(body).decode("utf-8", "replace")
    try:
        obj = json.loads(body)
        err = obj["error"]
        code, message = err["code"], err.get("message", "")
        if isinstance(code, str) and code:
            return PloverError(status, code, message if isinstance(message, str) else str(message), headers)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return PloverError(status, "http", body.strip(), headers)


def parse_server_timing(header):
    """Parse a Server-Timing header into {name: milliseconds}.

    "queue;dur=0.012, load;dur=0.000, kernels;dur=1.5" ->
    {"queue": 0.012, "load": 0.0, "kernels": 1.5}. Metrics without a dur
    (or with one that is no number) are left out; None or "" gives {}.
    """
    out = {}
    if not header:
        return out
    for metric in header.split(","):
        parts = [p.strip() for p in metric.split(";")]
        name = parts[0]
        if not name:
            continue
        for p in parts[1:]:
            key, sep, val = p.partition("=")
            if sep and key.strip().lower() == "dur":
                try:
                    out[name] = float(val.strip().strip('"'))
                except ValueError:
                    pass
                break
    return out


def _is_ndarray(x):
    # No import of NumPy unless the caller already has an array.
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "tobytes")


def _array_bytes(arr):
    """An array's raw bytes: C order, little-endian."""
    import numpy as np

    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes(order="C")


def _timed_out(err, wait):
    """Whether err is the socket's own timeout of a wait the client set
    (socket.timeout is TimeoutError from Python 3.10 on, a plain OSError
    before); not the kernel's (ETIMEDOUT, a connect never answered), nor
    any with no wait set."""
    return wait is not None and isinstance(err, (socket.timeout, TimeoutError)) and err.errno is None


def _input_bytes(data, what):
    """An input's bytes: bytes-like as they are, a NumPy array as invoke
    sends it (C order, little-endian). Anything else is a TypeError: bytes()
    of an int is that many zero bytes, of a list its values as bytes."""
    if _is_ndarray(data):
        return _array_bytes(data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError("%s must be bytes, bytearray, memoryview or a NumPy array, not %s"
                    % (what, type(data).__name__))


def _to_array(body, dtype, shape):
    import numpy as np

    dt = np.dtype(dtype)
    if dt.byteorder in ("=", ">") and dt.itemsize > 1:
        dt = dt.newbyteorder("<")  # the wire is little-endian
    if len(body) % dt.itemsize:
        raise ValueError("the output is %d bytes, not a whole number of %s (%d bytes each)"
                         % (len(body), dt, dt.itemsize))
    a = np.frombuffer(bytearray(body), dtype=dt)  # a bytearray: the array is writable
    if dt != np.dtype(dtype):
        a = a.astype(np.dtype(dtype))  # back to the native order asked for
    if shape is not None:
        a = a.reshape(shape)
    return a


# A connection cut under a request: the server reset or closed it.
_CUT = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _closed(sock):
    """Whether a kept connection can no longer take a request, checked
    without blocking: readable while no answer is awaited means the server
    closed it (EOF, a reset) or sent what nobody asked for; either way it
    is not used again."""
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True
        if hasattr(select, "poll"):
            p = select.poll()
            p.register(sock, select.POLLIN | select.POLLPRI)
            return bool(p.poll(0))  # POLLHUP and POLLERR are always reported
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


# Forks this process has made, as seen in the child: a connection made
# before a fork belongs to the parent (Client._conn).
_forks = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def _loopback(host):
    """Whether host names this machine: localhost, or a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _proxy_for(u):
    """The proxy for server URL u (split), as urllib would choose it from
    $http_proxy / $https_proxy and $no_proxy: (its split URL, or None;
    the Proxy-Authorization header for its user and password, or None).
    A server on this machine is never reached through a proxy, as Go's
    clients (the plover CLI) do: the proxy cannot reach it, and would
    read the token on the way."""
    proxy = urllib.request.getproxies().get(u.scheme)
    if not proxy or _loopback(u.hostname) or urllib.request.proxy_bypass(u.netloc):
        return None, None
    if "://" not in proxy:
        proxy = "http://" + proxy
    p = urllib.parse.urlsplit(proxy)
    auth = None
    if p.username is not None:
        cred = "%s:%s" % (urllib.parse.unquote(p.username), urllib.parse.unquote(p.password or ""))
        auth = {"Proxy-Authorization": "Basic " + base64.b64encode(cred.encode()).decode("ascii")}
    return p, auth


def _check_url(url):
    """The server's base URL, checked as the CLI checks --server: http or
    https, a host, no query or fragment."""
    u = urllib.parse.urlsplit(url)
    if "@" in url:
        # First, and not echoed: it may hold a password (one with a / in
        # it ends the URL's authority before its @).
        raise ValueError("server URL: an @ in it, a user or password: the server takes a token (token= or $PLOVER_TOKEN), not credentials in the URL")
    if u.scheme not in ("http", "https"):
        raise ValueError("server URL %r: want http:// or https://, not %s://" % (url, u.scheme))
    if not u.hostname:
        raise ValueError("server URL %r: no host (want http://HOST:PORT)" % url)
    if u.query or u.fragment or url.endswith("?"):
        raise ValueError("server URL %r: a query or fragment: give the server's base URL (http://HOST:PORT)" % url)
    try:
        u.port
    except ValueError:
        raise ValueError("server URL %r: bad port (want 1..65535)" % url) from None
    return url


def _check_token(token):
    """The token with surrounding white space taken off (a token read from
    a file ends with a newline), or None for none; one with a space or a
    control character inside, or any character outside ASCII, is refused,
    without echoing it. (http.client would send a Latin-1 one as bytes the
    CLI does not send, and fail on any other with a UnicodeEncodeError
    that holds the whole Authorization header, token and all.)"""
    if token is None:
        return None
    token = token.strip()
    if any(c <= " " or c == "\x7f" for c in token):
        raise ValueError("token: a space or control character inside it (a token is one word; check where it was read from)")
    if any(c > "\x7f" for c in token):
        raise ValueError("token: a character outside ASCII inside it (a token is printable ASCII, as plover token "
                         "makes them; check where it was read from)")
    return token or None


# How long invoke waits past the deadline it sends (timeout_ms) for the
# server's answer (a 504 saying why), as plover invoke --timeout does.
INVOKE_GRACE = 2.0

# plover serve's --max-timeout, in seconds: the longest deadline the server
# keeps (a longer timeout_ms is cut to it), so the longest an invoke's wait
# follows timeout_ms unless the Client is told otherwise (max_timeout=).
DEFAULT_MAX_TIMEOUT = 600.0

# The longest socket wait that holds: CPython hands poll() a C int of
# milliseconds, and a longer wait wraps (4294967.4 s times out after 0.1 s)
# or never ends.
_LONGEST_WAIT = 2147483.0


def _seconds(name, v):
    """v, a Client's wait in seconds named name, as a float (None for None);
    a bool, zero (a socket that never waits), a negative, an infinite or a
    NaN one refused."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise TypeError("%s must be a number of seconds or None, not a bool" % name)
    f = float(v)
    if not f > 0 or math.isinf(f):
        raise ValueError("%s must be a positive, finite number of seconds or None, not %r" % (name, v))
    return f


def _timeout_header(timeout_ms):
    """X-Plover-Timeout-Ms for timeout_ms: whole milliseconds, rounded up
    (as plover invoke --timeout rounds), at least 1; None for None."""
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool):  # float(True) is 1.0: a 1 ms deadline
        raise TypeError("timeout_ms must be a number of milliseconds, not a bool")
    t = float(timeout_ms)
    if not t > 0 or math.isinf(t):
        raise ValueError("timeout_ms must be a positive, finite number of milliseconds, not %r" % (timeout_ms,))
    return min(int(math.ceil(t)), 2**32 - 1)  # the server reads a uint32; --max-timeout caps it anyway


class Client:
    """A client for one Plover server.

    url: the server (default $PLOVER_SERVER, else http://127.0.0.1:8080;
    http or https, maybe with a base path; ValueError for a query, a
    fragment or another scheme); token: the bearer token for a server with
    --auth-file (default $PLOVER_TOKEN); timeout: seconds to wait for the
    server, to connect and for each read of its answer (not a bound on the
    whole request; an invoke with timeout_ms waits for its answer at least
    that deadline plus 2 s, but connects within timeout); cafile: PEM CA
    certificates to trust for https, besides the system's (default
    $PLOVER_CACERT); max_timeout: the server's --max-timeout in seconds
    (600, its default): the longest deadline an invoke's wait follows,
    since the server cuts a longer timeout_ms to it (an invoke waits at
    most max_timeout plus 2 s, or timeout if that is longer; None: no cap).

    After each invoke, last_timing ({"queue", "sched", "load", "copyin", "kernels",
    "copyout", "resolve", "dispatch", "total"}, and "handoff" and "handback",
    parts of dispatch, for a run in a worker process: milliseconds, from
    Server-Timing; the others add up to total), last_start
    ("cold", "warm" or "hot") and last_version (the version that ran)
    describe it. A Client keeps one connection per thread that uses it
    (HTTP keep-alive: no new TCP or TLS handshake per request; close()
    or a with block closes the calling thread's), so one may be shared by
    threads; last_* are kept per thread, each describing that thread's
    last invoke. Redirects are not followed. $http_proxy, $https_proxy
    and $no_proxy are honoured as urllib honours them.
    """

    def __init__(self, url=None, token=None, timeout=60, cafile=None, max_timeout=DEFAULT_MAX_TIMEOUT):
        url = url or os.environ.get("PLOVER_SERVER") or DEFAULT_SERVER
        if "://" not in url:
            url = "http://" + url
        self.url = _check_url(url.rstrip("/"))
        self.token = _check_token(token if token is not None else (os.environ.get("PLOVER_TOKEN") or None))
        # A longer wait than a socket keeps would wrap to a short one: cut
        # to it (some 24 days, a wait without end in practice).
        self.timeout = _seconds("timeout", timeout)
        if self.timeout is not None:
            self.timeout = min(self.timeout, _LONGEST_WAIT)
        _seconds("max_timeout", max_timeout)
        self.max_timeout = max_timeout
        self.cafile = cafile if cafile is not None else (os.environ.get("PLOVER_CACERT") or None)
        self._ssl = None
        if self.url.lower().startswith("https://"):
            self._ssl = ssl.create_default_context()
            if self.cafile:
                self._ssl.load_verify_locations(cafile=self.cafile)
        u = urllib.parse.urlsplit(self.url)
        self._host = u.hostname
        self._port = u.port or (443 if self._ssl is not None else 80)
        self._path = u.path
        self._proxy, self._proxy_auth = _proxy_for(u)
        self._local = threading.local()

    # last_*: per thread, so that threads sharing a Client each read their own.
    def _last(name, doc):
        default = {} if name == "last_timing" else None

        def get(self):
            return getattr(self._local, name, default)

        def set_(self, v):
            setattr(self._local, name, v)

        return property(get, set_, doc=doc)

    last_timing = _last("last_timing", "This thread's last invoke's Server-Timing, in ms.")
    last_start = _last("last_start", "This thread's last invoke's start kind: cold, warm or hot.")
    last_version = _last("last_version", "The version this thread's last invoke ran.")
    del _last

    def __repr__(self):
        return "plover.Client(%r%s)" % (self.url, ", token=..." if self.token else "")

    # -- transport ----------------------------------------------------------

    def _conn(self, wait):
        """This thread's connection to the server (made on first use), to
        connect within wait (the socket's timeout for the request is the
        caller's to set)."""
        c = getattr(self._local, "conn", None)
        if c is not None and self._local.forks != _forks[0]:
            # Made before a fork: the parent's socket too. Two processes
            # on one connection would read each other's answers.
            c.close()  # this process's descriptor only
            c = None
        if c is None:
            proxy = self._proxy
            if proxy is None:
                host, port = self._host, self._port
            else:
                host, port = proxy.hostname, proxy.port or (443 if proxy.scheme == "https" else 80)
            if self._ssl is not None:
                c = http.client.HTTPSConnection(host, port, timeout=wait, context=self._ssl)
                if proxy is not None:
                    c.set_tunnel(self._host, self._port, headers=self._proxy_auth)
            else:
                c = http.client.HTTPConnection(host, port, timeout=wait)
            self._local.conn, self._local.forks = c, _forks[0]
        c.timeout = wait
        return c

    def close(self):
        """Close the calling thread's connection to the server (other
        threads' close with their threads, or at their next close())."""
        c = getattr(self._local, "conn", None)
        self._local.conn = None
        if c is not None:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _exchange(self, method, target, body, headers, wait):
        """One request on this thread's connection: (response, body bytes).

        A kept connection is checked before it is used, without blocking:
        one the server closed while idle (its keep-alive timeout, a restart)
        reads as closed, and the request goes on a new connection instead,
        sent once. A connection cut after the request went out (a reset, or
        closed without an answer) may have been cut after the server read
        the request and ran it: only a GET or HEAD on a kept connection (the
        server's close can still cross the request on the wire) is then
        sent once more, on a new connection; any other request raises
        PloverError "unreachable" saying that it may have run, as does an
        answer cut short (any method). The caller decides whether to send
        it again.

        Connecting (a TLS handshake and a proxy's tunnel included) waits
        self.timeout; sending the request and each read of the answer wait
        wait (an invoke's deadline and a grace, when longer)."""
        for attempt in (0, 1):
            c = self._conn(self.timeout)
            reused = c.sock is not None
            if reused and _closed(c.sock):
                c.close()
                reused = False
            if c.sock is None:
                try:
                    c.connect()
                except BaseException as e:
                    e.plover_connected = False  # nothing was sent
                    c.close()
                    raise
            try:
                c.sock.settimeout(wait)
                c.request(method, target, body=body, headers=headers)
                resp = c.getresponse()
                data = resp.read()
            except _CUT as e:
                c.close()
                if reused and attempt == 0 and method in ("GET", "HEAD"):
                    continue
                raise PloverError(None, "unreachable", "the plover server at %s closed the connection before "
                                  "answering (%s): the %s request was sent and may have run"
                                  % (self.url, e or type(e).__name__, method)) from e
            except http.client.IncompleteRead as e:
                # The answer began and was cut: the request ran, or is
                # running; never sent again.
                c.close()
                raise PloverError(None, "unreachable", "the plover server at %s closed the connection in the middle "
                                  "of its answer (%s): the %s request was sent and may have run"
                                  % (self.url, e, method)) from e
            except BaseException as e:
                e.plover_connected = True
                c.close()  # a half-read answer leaves the connection unusable
                raise
            if resp.will_close:
                c.close()
            return resp, data

    def _request(self, method, path, body=None, content_type=None, headers=None, timeout=None):
        """Send a request; return (status, headers, body bytes) for a 2xx
        answer and raise PloverError for any other. timeout: seconds to
        send the request and for each read of the answer, in place of
        self.timeout (connecting always waits self.timeout)."""
        hdrs = {}
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        if content_type:
            hdrs["Content-Type"] = content_type
        hdrs.update(headers or {})
        target = self._path + path
        if self._proxy is not None and self._ssl is None:
            target = self.url + path  # a plain-HTTP proxy takes the absolute URL
            hdrs.update(self._proxy_auth or {})
        wait = self.timeout if timeout is None else timeout
        try:
            resp, data = self._exchange(method, target, body, hdrs, wait)
        except (socket.timeout, TimeoutError) as e:
            if not getattr(e, "plover_connected", True) and _timed_out(e, self.timeout):
                raise PloverError(None, "timeout", "the request to the plover server at %s was not sent within %g s "
                                  "(the client's wait to connect: its timeout)" % (self.url, self.timeout)) from e
            if _timed_out(e, wait):
                raise PloverError(None, "timeout", "no answer from the plover server at %s within %g s (the client's "
                                  "wait: its timeout, or an invoke's timeout_ms, at most max_timeout, and a grace)"
                                  % (self.url, wait)) from e
            raise PloverError(None, "unreachable", "cannot reach the plover server at %s: %s" % (self.url, e)) from e
        except (OSError, http.client.HTTPException) as e:
            raise PloverError(None, "unreachable", "talking to the plover server at %s: %s"
                              % (self.url, e or type(e).__name__)) from e
        if 200 <= resp.status < 300:
            return resp.status, resp.headers, data
        err = parse_error(resp.status, data, resp.headers)
        if 300 <= resp.status < 400:
            err.message = ("the server redirected to %s; redirects are not followed: give the Client that URL"
                           % resp.headers.get("Location")) + (": " + err.message if err.message else "")
        if resp.status == 401 and not self.token:
            err.message += " (no token was sent: pass token= or set $PLOVER_TOKEN)"
        raise err

    def _json(self, method, path, obj=None):
        body = None if obj is None else json.dumps(obj).encode()
        _, _, data = self._request(method, path, body, "application/json" if body is not None else None)
        return json.loads(data)

    @staticmethod
    def _fn(name):
        return "/v1/functions/" + urllib.parse.quote(name, safe="")

    def _wait(self, ms):
        """The wait for the answer to an invoke with deadline ms (or None):
        the client's timeout, but never less than the deadline plus
        INVOKE_GRACE, so that the server's answer, a 504 included, is
        waited for; the deadline counted at most max_timeout, as the
        server cuts it (else timeout_ms=1e12 would wait some 50 days for
        an answer that comes, if ever, within max_timeout); with none, at
        most _LONGEST_WAIT (some 24 days), the longest a socket keeps."""
        if ms is None:
            return None
        if self.timeout is None:
            return None
        deadline = ms / 1000.0
        if self.max_timeout is not None:
            deadline = min(deadline, float(self.max_timeout))
        return max(self.timeout, min(deadline + INVOKE_GRACE, _LONGEST_WAIT))

    def _meta(self, headers):
        self.last_timing = parse_server_timing(headers.get("Server-Timing"))
        self.last_start = headers.get("X-Plover-Start")
        self.last_version = headers.get("X-Plover-Version")

    # -- invoke -------------------------------------------------------------

    def invoke(self, name, data, *, dtype=None, shape=None, timeout_ms=None):
        """Run function name on data; return the output.

        data: bytes, bytearray or memoryview, or a NumPy array (sent as its
        raw bytes, C order, little-endian). Returns bytes, or with dtype a
        NumPy array of that dtype (reshaped to shape when given).
        timeout_ms is the request's deadline on the server
        (X-Plover-Timeout-Ms: rounded up to whole milliseconds; the
        server's --max-timeout caps it); the client then waits for the
        answer up to INVOKE_GRACE (2 s) past it even when that is longer
        than the client's timeout, the deadline counted at most the
        Client's max_timeout (600 s); it connects within its timeout.
        ValueError for timeout_ms <= 0, TypeError for a bool.
        """
        body = _input_bytes(data, "data")
        headers = {}
        ms = _timeout_header(timeout_ms)
        if ms is not None:
            headers["X-Plover-Timeout-Ms"] = str(ms)
        self.last_timing, self.last_start, self.last_version = {}, None, None
        _, hdrs, out = self._request("POST", self._fn(name) + "/invoke", body, OCTET_STREAM, headers,
                                     self._wait(ms))
        self._meta(hdrs)
        if dtype is None:
            if shape is not None:
                raise ValueError("shape needs dtype")
            return out
        return _to_array(out, dtype, shape)

    def invoke_pyplover(self, name, inputs, func_names, grid_sizes, block_sizes, output_size,
                        tmp_size=0, *, timeout_ms=None):
        """Run function name with PyPlover's JSON request: the chain given
        as parallel lists func_names, grid_sizes and block_sizes (kernels
        the bundle exports), output_size and tmp_size in bytes. Returns the
        output bytes. timeout_ms: the deadline, sent as "timeout_ms", as
        invoke sends it."""
        if not (len(func_names) == len(grid_sizes) == len(block_sizes)):
            raise ValueError("func_names, grid_sizes and block_sizes must have the same length")
        req = {
            "name": name,
            "inputs": base64.b64encode(_input_bytes(inputs, "inputs")).decode("ascii"),
            "func_names": list(func_names),
            "grid_sizes": [int(g) for g in grid_sizes],
            "block_sizes": [int(b) for b in block_sizes],
            "output_size": int(output_size),
            "tmp_size": int(tmp_size),
        }
        ms = _timeout_header(timeout_ms)
        if ms is not None:
            req["timeout_ms"] = ms
        self.last_timing, self.last_start, self.last_version = {}, None, None
        _, hdrs, data = self._request("POST", self._fn(name) + "/invoke",
                                      json.dumps(req).encode(), "application/json", timeout=self._wait(ms))
        self._meta(hdrs)
        resp = json.loads(data)
        return base64.b64decode(resp["output"])

    # -- the control plane --------------------------------------------------

    def health(self):
        """GET /healthz: {"status": "ok", "devices": [...]}. An unhealthy
        server answers 503, raised as PloverError."""
        return self._json("GET", "/healthz")

    def functions(self):
        """The deployed functions: a list of function infos."""
        return self._json("GET", "/v1/functions")["functions"]

    def function(self, name):
        """One function's info: version, manifest, instances, counters."""
        return self._json("GET", self._fn(name))

    def versions(self, name):
        """{"name", "current", "versions": [{"id", "sha256", "size", "created"}, ...]}"""
        return self._json("GET", self._fn(name) + "/versions")

    def rollback(self, name, version):
        """Make version (its id, or its first 8+ characters) current;
        returns the function's info."""
        return self._json("POST", self._fn(name) + "/rollback", {"version": version})

    def delete(self, name, *, force=False):
        """Delete a function and its versions. A function that pipelines
        name is refused (409 conflict) unless force is true: the pipelines
        then fail their requests until it is deployed again."""
        return self._json("DELETE", self._fn(name) + ("?force=true" if force else ""))

    def deploy_bundle(self, name, bundle, *, force=False):
        """PUT an already packed bundle (what Go's bundle.PackBytes makes, as
        plover deploy sends it: a deterministic tar, zstd-compressed) as
        function name. Returns the
        function's info; "unchanged": true when the bytes equal the current
        version's and force is false."""
        path = self._fn(name) + ("?force=true" if force else "")
        _, _, data = self._request("PUT", path, bytes(bundle), BUNDLE_MEDIA_TYPE)
        return json.loads(data)

    _SERVER_SAID = re.compile(r"server said (\d+) (\S+): (.*)")
    _RETRY_AFTER = re.compile(r" \(retry after (\d+) s\)$")

    def deploy(self, dir, *, force=False, plover="plover", timeout=None):
        """Check, pack and upload the bundle directory dir, by running the
        plover CLI (`plover deploy DIR --server URL`) with this client's
        token and CA file.

        timeout: seconds the CLI may run in all (None, the default: the
        CLI's own bound, 5 minutes with no byte of the bundle moving or no
        answer after the last; a large bundle over a slow link may take
        longer than any one figure); past it the CLI is stopped and
        PloverError code "timeout" raised (the server may still have
        stored the bundle if it was all sent: versions() shows).

        A bundle is a zstd-compressed tar, and the Python standard library
        has no zstd; the CLI also checks the manifest and the library's
        exports before anything is uploaded. Use deploy_bundle to send bytes
        packed elsewhere.

        Returns {"name", "version", "unchanged", "sha256", "bytes"}: the
        CLI's JSON answer, parsed ("unchanged" when the bytes equal the
        current version's and force is false); raises
        PloverError when the CLI fails (with the server's status and code
        when it reported one) and FileNotFoundError without the CLI.
        """
        exe = shutil.which(plover) if os.sep not in plover else plover
        if not exe:
            raise FileNotFoundError(
                "the plover CLI (%r) is not on PATH: Client.deploy runs `plover deploy`, because "
                "packing a bundle needs zstd, which Python's standard library lacks" % plover)
        cmd = [exe, "deploy", os.fspath(dir), "--server", self.url, "--json"]
        if force:
            cmd.append("--force")
        env = dict(os.environ)
        if self.token:
            env["PLOVER_TOKEN"] = self.token
        else:
            env.pop("PLOVER_TOKEN", None)
        if self.cafile:
            env["PLOVER_CACERT"] = self.cafile
        wait = timeout
        try:
            p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=wait)
        except subprocess.TimeoutExpired as e:
            raise PloverError(None, "timeout", "plover deploy %s did not finish within %g s (deploy's "
                              "timeout) and was stopped; if the whole bundle was sent the server may "
                              "still have stored it (versions() shows)" % (os.fspath(dir), wait)) from e
        if p.returncode != 0:
            msg = p.stderr.strip() or p.stdout.strip() or "exit status %d" % p.returncode
            m = self._SERVER_SAID.search(msg)
            if m:
                message, headers = m.group(3).strip(), None
                r = self._RETRY_AFTER.search(message)
                if r:  # the CLI's rendering of the answer's Retry-After
                    message, headers = message[:r.start()], {"Retry-After": r.group(1)}
                raise PloverError(int(m.group(1)), m.group(2), message, headers)
            raise PloverError(None, "deploy_failed", msg)
        try:
            r = json.loads(p.stdout)
            return {"name": r["name"], "version": r["version"], "unchanged": not r["created"],
                    "sha256": r.get("sha256"), "bytes": r.get("bytes")}
        except (ValueError, KeyError, TypeError):
            raise PloverError(None, "deploy_failed", "unexpected output from plover deploy --json: %r" % p.stdout)
