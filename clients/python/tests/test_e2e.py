"""End-to-end tests against a real plover serve, run by the Go test
cli/plover/python_test.go (TestPythonClient), which sets:

    PLOVER_SERVER, PLOVER_TOKEN    the server and an admin token
    PLOVER_TEST_FUNCTION           a deployed function with the test kernels
                                   (internal/testkit), whose chain is echo
    PLOVER_TEST_PACKED             that function's bundle, packed (optional)
    PLOVER_TEST_BUNDLE             a bundle directory to deploy with the CLI,
    PLOVER_TEST_BUNDLE_NAME        and the name in its plover.json (optional)
    PLOVER_TEST_INVOKE_TOKEN       a token with only the invoke scope (optional)

and puts the plover binary on PATH. Without PLOVER_TEST_FUNCTION every test
is skipped.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import plover  # noqa: E402
from plover import PloverError  # noqa: E402

FN = os.environ.get("PLOVER_TEST_FUNCTION")

try:
    import numpy as np
except ImportError:
    np = None


@unittest.skipUnless(FN, "PLOVER_TEST_FUNCTION is not set (cli/plover/python_test.go sets it)")
class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.c = plover.Client(timeout=30)  # PLOVER_SERVER, PLOVER_TOKEN

    def test_health(self):
        self.assertEqual(self.c.health()["status"], "ok")

    def test_invoke_bytes(self):
        out = self.c.invoke(FN, b"hello plover")
        # echo: the input, then zeros to the manifest's out_bytes (256).
        self.assertEqual(len(out), 256)
        self.assertEqual(out[:12], b"hello plover")
        self.assertEqual(out[12:], bytes(244))
        self.check_meta()
        out = self.c.invoke(FN, bytearray(b"again"), timeout_ms=5000)
        self.assertEqual(out[:5], b"again")
        self.assertIn(self.c.last_start, ("warm", "hot"))  # loaded by the call before
        self.check_meta()

    def test_fractional_timeout(self):
        # Rounded up to 1 ms, not cut to "0", which the server refuses (400).
        try:
            self.c.invoke(FN, b"x", timeout_ms=0.5)
        except PloverError as e:
            self.assertEqual((e.status, e.code), (504, "timeout"), e)

    def check_meta(self):
        t = self.c.last_timing
        # The test's server runs functions in worker processes: handoff
        # and handback too.
        self.assertEqual(set(t), set(plover.client.TIMING_NAMES), t)
        for k, v in t.items():
            self.assertIsInstance(v, float, k)
            self.assertGreaterEqual(v, 0.0, k)
        self.assertGreaterEqual(t["total"], t["kernels"])
        self.assertIn(self.c.last_start, ("cold", "warm", "hot"))
        self.assertEqual(self.c.last_version, self.c.function(FN)["version"])

    @unittest.skipIf(np is None, "NumPy is not installed")
    def test_invoke_numpy(self):
        a = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)  # 256 bytes: all of out
        got = self.c.invoke(FN, a, dtype=np.float32, shape=(8, 8))
        np.testing.assert_array_equal(got, a)
        got = self.c.invoke(FN, a.T, dtype="<f4", shape=(8, 8))  # sent in C order
        np.testing.assert_array_equal(got, a.T)
        self.check_meta()

    def test_invoke_pyplover(self):
        # The chain from the request, not the manifest: echo, then add_one.
        out = self.c.invoke_pyplover(FN, b"hello", ["echo", "add_one"], [1, 1], [64, 1], 8)
        self.assertEqual(out, b"ifmmp\x01\x01\x01")
        self.check_meta()
        out = self.c.invoke_pyplover(FN, b"abc", ["echo"], [1], [32], 3, tmp_size=0, timeout_ms=5000)
        self.assertEqual(out, b"abc")

    def test_pyplover_bad_kernel(self):
        with self.assertRaises(PloverError) as cm:
            self.c.invoke_pyplover(FN, b"x", ["no_such_kernel"], [1], [1], 8)
        self.assertTrue(400 <= cm.exception.status < 500, cm.exception)
        self.assertTrue(cm.exception.code and cm.exception.message, cm.exception)

    def test_functions(self):
        names = [f["name"] for f in self.c.functions()]
        self.assertIn(FN, names)
        info = self.c.function(FN)
        self.assertEqual(info["name"], FN)
        self.assertEqual(info["manifest"]["name"], FN)

    def test_unknown_function(self):
        with self.assertRaises(PloverError) as cm:
            self.c.invoke("no-such-function", b"x")
        e = cm.exception
        self.assertEqual((e.status, e.code), (404, "not_found"))
        self.assertIn("no-such-function", e.message)
        with self.assertRaises(PloverError) as cm:
            self.c.versions("no-such-function")
        self.assertEqual(cm.exception.status, 404)

    def test_no_token(self):
        c = plover.Client(token="", timeout=30)
        with self.assertRaises(PloverError) as cm:
            c.invoke(FN, b"x")
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))
        with self.assertRaises(PloverError) as cm:
            c.functions()
        self.assertEqual(cm.exception.status, 401)
        self.assertEqual(c.health()["status"], "ok")  # the probes need no token

    @unittest.skipUnless(os.environ.get("PLOVER_TEST_INVOKE_TOKEN"), "no invoke-only token")
    def test_forbidden(self):
        c = plover.Client(token=os.environ["PLOVER_TEST_INVOKE_TOKEN"], timeout=30)
        self.assertEqual(c.invoke(FN, b"ok")[:2], b"ok")
        with self.assertRaises(PloverError) as cm:
            c.rollback(FN, "00000000")
        self.assertEqual((cm.exception.status, cm.exception.code), (403, "forbidden"))

    @unittest.skipUnless(os.environ.get("PLOVER_TEST_PACKED"), "no packed bundle")
    def test_deploy_bundle_versions_rollback(self):
        with open(os.environ["PLOVER_TEST_PACKED"], "rb") as f:
            packed = f.read()
        before = self.c.versions(FN)
        # The same bytes as the current version: nothing new.
        fi = self.c.deploy_bundle(FN, packed)
        self.assertTrue(fi.get("unchanged"), fi)
        self.assertEqual(fi["version"], before["current"])
        fi = self.c.deploy_bundle(FN, packed, force=True)
        self.assertFalse(fi.get("unchanged"), fi)
        self.assertNotEqual(fi["version"], before["current"])
        rec = self.c.versions(FN)
        self.assertEqual(rec["current"], fi["version"])
        self.assertEqual(len(rec["versions"]), len(before["versions"]) + 1)
        self.assertEqual(self.c.invoke(FN, b"new")[:3], b"new")
        self.assertEqual(self.c.last_version, fi["version"])
        # Back to the version before, by an id prefix.
        info = self.c.rollback(FN, before["current"][:12])
        self.assertEqual(info["version"], before["current"])
        self.assertEqual(self.c.versions(FN)["current"], before["current"])
        self.assertEqual(self.c.invoke(FN, b"old")[:3], b"old")
        self.assertEqual(self.c.last_version, before["current"])
        with self.assertRaises(PloverError) as cm:
            self.c.rollback(FN, "ffffffffffff")
        self.assertTrue(400 <= cm.exception.status < 500, cm.exception)
        with self.assertRaises(PloverError) as cm:
            self.c.deploy_bundle(FN, b"not a bundle")
        self.assertTrue(400 <= cm.exception.status < 500, cm.exception)

    @unittest.skipUnless(os.environ.get("PLOVER_TEST_BUNDLE"), "no bundle directory")
    def test_deploy_cli(self):
        d, name = os.environ["PLOVER_TEST_BUNDLE"], os.environ["PLOVER_TEST_BUNDLE_NAME"]
        r = self.c.deploy(d)
        self.assertEqual((r["name"], r["unchanged"]), (name, False), r)
        self.assertEqual(self.c.function(name)["version"], r["version"])
        again = self.c.deploy(d)
        self.assertEqual((again["version"], again["unchanged"]), (r["version"], True), again)
        forced = self.c.deploy(d, force=True)
        self.assertFalse(forced["unchanged"])
        self.assertNotEqual(forced["version"], r["version"])
        self.assertEqual(self.c.invoke(name, b"cli")[:3], b"cli")
        with self.assertRaises(PloverError) as cm:
            plover.Client(token="").deploy(d)
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthenticated"))
        self.assertEqual(self.c.delete(name), {"deleted": name})
        with self.assertRaises(PloverError) as cm:
            self.c.function(name)
        self.assertEqual(cm.exception.status, 404)


if __name__ == "__main__":
    unittest.main()
