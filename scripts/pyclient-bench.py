"""Latency of the Python client's invoke against a running server.

    python3 scripts/pyclient-bench.py CLIENT_DIR URL N [FUNCTION]

CLIENT_DIR holds the plover package to measure (clients/python, or a copy
of an older one, e.g. `git show REV:clients/python/plover/client.py`);
FUNCTION (default cnn, deployed from build/samples/cnn-host) gets a
zero input of 3136 bytes. Prints p50 and p99 of N invokes after 50 to warm.
$PLOVER_CACERT, $PLOVER_TOKEN as the client reads them.
"""

import sys
import time

path, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fn = sys.argv[4] if len(sys.argv) > 4 else "cnn"
sys.path.insert(0, path)
import plover  # noqa: E402

c = plover.Client(url, timeout=10)
x = bytes(3136)
for _ in range(50):
    c.invoke(fn, x)
ts = []
for _ in range(n):
    t = time.perf_counter()
    c.invoke(fn, x)
    ts.append((time.perf_counter() - t) * 1e3)
ts.sort()
print("%s p50 %.3f ms p99 %.3f ms (%d invokes)" % (path, ts[len(ts) // 2], ts[int(len(ts) * 0.99)], n))
