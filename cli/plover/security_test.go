package main_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// tokenSet is an auth file's tokens, by name.
type tokenSet map[string]string

// writeAuthFile writes lines NAME SCOPES SHA256 FUNCTIONS for tokens made
// fresh here, and returns them by name.
func writeAuthFile(t *testing.T, path string, lines [][3]string) tokenSet {
	t.Helper()
	toks := tokenSet{}
	var b strings.Builder
	b.WriteString("# test tokens\n\n")
	for _, l := range lines {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		toks[l[0]] = tok
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s   # %s\n", l[0], l[1], auth.Hash(tok), l[2], l[0])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return toks
}

type secResp struct {
	code int
	errc string
	body string
	hdr  http.Header
}

func secDo(t *testing.T, c *http.Client, method, url, token, ct string, body []byte) secResp {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := secResp{code: resp.StatusCode, body: string(b), hdr: resp.Header}
	if i := strings.Index(r.body, `"code":"`); i >= 0 {
		r.errc = strings.SplitN(r.body[i+8:], `"`, 2)[0]
	}
	return r
}

// TestAuthScopes: every route against every kind of token, on a real server.
func TestAuthScopes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	dir := t.TempDir()
	authFile := filepath.Join(dir, "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{
		{"root", "admin", "*"},
		{"ci", "deploy", "echo*"},
		{"app", "invoke", "echo-*"},
		{"dash", "read", "*"},
		{"ops", "deploy", "*"},
	})
	toks["stranger"] = "not-a-token-this-server-knows"
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	c := &http.Client{Timeout: 20 * time.Second}
	bundleDir := testkit.BundleDir(t, testkit.Manifest("echo-a"), nil)
	packed := packDir(t, bundleDir)
	other := testkit.Manifest("other")
	otherPacked := packDir(t, testkit.BundleDir(t, other, nil))
	if r := secDo(t, c, "PUT", srv.url+"/v1/functions/echo-a", toks["root"], bundle.MediaType, packed); r.code != 201 {
		t.Fatalf("admin deploy: %d %s", r.code, r.body)
	}

	fn := srv.url + "/v1/functions/"
	type route struct {
		name, method, url, ct string
		body                  []byte
		allowed               map[string]bool // token names allowed; the rest get 403
	}
	all := func(names ...string) map[string]bool {
		m := map[string]bool{"root": true}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	routes := []route{
		{"list", "GET", fn, "", nil, all("ci", "dash", "ops")},
		{"show", "GET", fn + "echo-a", "", nil, all("ci", "dash", "ops")},
		{"versions", "GET", fn + "echo-a/versions", "", nil, all("ci", "dash", "ops")},
		{"metrics", "GET", srv.url + "/metrics", "", nil, all("ci", "dash", "ops")},
		{"invoke", "POST", fn + "echo-a/invoke", "application/octet-stream", []byte("hi"), all("app")},
		{"invoke outside glob", "POST", fn + "other/invoke", "application/octet-stream", []byte("hi"), all()},
		{"deploy in glob", "PUT", fn + "echo-a", bundle.MediaType, packed, all("ci", "ops")},
		{"deploy outside glob", "PUT", fn + "other", bundle.MediaType, otherPacked, all("ops")},
		{"rollback", "POST", fn + "echo-a/rollback", "application/json", []byte(`{"version":"00000000"}`), all("ci", "ops")},
		{"gc (store-wide)", "POST", srv.url + "/v1/gc?grace=1h", "", nil, all("ops")},
		{"delete outside glob", "DELETE", fn + "other", "", nil, all("ops")},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			for _, who := range []string{"", "stranger", "root", "ci", "app", "dash", "ops"} {
				r := secDo(t, c, rt.method, rt.url, toks[who], rt.ct, rt.body)
				switch {
				case who == "" || who == "stranger":
					if r.code != 401 || r.errc != "unauthenticated" || !strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Bearer") {
						t.Errorf("%s by %q: %d %s (WWW-Authenticate %q), want 401 unauthenticated", rt.name, who, r.code, r.body, r.hdr.Get("WWW-Authenticate"))
					}
				case rt.allowed[who]:
					if r.code == 401 || r.code == 403 {
						t.Errorf("%s by %s: %d %s, want it let through", rt.name, who, r.code, r.body)
					}
				default:
					if r.code != 403 || r.errc != "forbidden" || !strings.Contains(r.body, `token \"`+who+`\"`) {
						t.Errorf("%s by %s: %d %s, want 403 forbidden naming the token", rt.name, who, r.code, r.body)
					}
				}
			}
		})
	}
	// The probes stay open.
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := secDo(t, c, "GET", srv.url+p, "", "", nil); r.code != 200 {
			t.Errorf("%s without a token: %d", p, r.code)
		}
	}
	// Refusals are counted.
	m := secDo(t, c, "GET", srv.url+"/metrics", toks["dash"], "", nil)
	for _, reason := range []string{"missing_token", "unknown_token", "forbidden"} {
		if !strings.Contains(m.body, `plover_auth_failures_total{reason="`+reason+`"}`) || strings.Contains(m.body, `plover_auth_failures_total{reason="`+reason+`"} 0`) {
			t.Errorf("metrics: no %s refusals counted", reason)
		}
	}

	t.Run("sighup-rotation", func(t *testing.T) {
		// A slow request with the old token is in flight while the tokens
		// change: it finishes; afterwards the old token is refused.
		slow := testkit.Slow("slow", 1500)
		if r := secDo(t, c, "PUT", fn+"slow", toks["root"], bundle.MediaType, packDir(t, testkit.BundleDir(t, slow, nil))); r.code != 201 {
			t.Fatalf("deploy slow: %d %s", r.code, r.body)
		}
		old := toks["root"]
		done := make(chan secResp, 1)
		go func() { done <- secDo(t, c, "POST", fn+"slow/invoke", old, "application/octet-stream", []byte("x")) }()
		waitFor(t, 10*time.Second, "the slow request to start", func() bool {
			r := secDo(t, c, "GET", fn+"slow", old, "", nil)
			return strings.Contains(r.body, `"instances_busy":1`)
		})
		fresh := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}})
		if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the old token to be refused", func() bool {
			return secDo(t, c, "GET", fn, old, "", nil).code == 401
		})
		if r := secDo(t, c, "GET", fn, fresh["root"], "", nil); r.code != 200 {
			t.Fatalf("new token after SIGHUP: %d %s", r.code, r.body)
		}
		if r := <-done; r.code != 200 {
			t.Fatalf("request in flight across the rotation: %d %s", r.code, r.body)
		}
		// A file that does not parse keeps the tokens it still names in
		// force.
		os.WriteFile(authFile, []byte("root admin "+auth.Hash(fresh["root"])+"\nroot2 admin nothex\n"), 0o600)
		srv.cmd.Process.Signal(syscall.SIGHUP)
		waitFor(t, 10*time.Second, "the reload error in the log", func() bool {
			return strings.Contains(srv.log.String(), "the tokens loaded before are kept")
		})
		if r := secDo(t, c, "GET", fn, fresh["root"], "", nil); r.code != 200 {
			t.Fatalf("after a bad reload: %d %s", r.code, r.body)
		}
	})
	srv.mustBeHealthy(t, "after the auth cases")
}

func packDir(t *testing.T, dir string) []byte {
	t.Helper()
	b, _, _, err := bundle.PackBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTLSAndNonLoopback: HTTPS with a CA made here, through plover deploy and
// invoke; a non-loopback listener without tokens refuses to start.
func TestTLSAndNonLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	dir := t.TempDir()
	ca, cert, key, _ := testkit.WriteCerts(t, dir)
	authFile := filepath.Join(dir, "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile, "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(srv.url, "https://") {
		t.Fatalf("server address %s is not https", srv.url)
	}
	env := []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["root"], "PLOVER_CACERT=" + ca}
	bundleDir := testkit.BundleDir(t, testkit.Manifest("echo"), nil)
	run(t, bin, env, "deploy", bundleDir)
	in := filepath.Join(dir, "in.bin")
	os.WriteFile(in, []byte("over tls"), 0o644)
	outFile := filepath.Join(dir, "out.bin")
	run(t, bin, env, "invoke", "echo", "--in", in, "--out", outFile)
	if got, _ := os.ReadFile(outFile); !bytes.HasPrefix(got, []byte("over tls")) {
		t.Fatalf("invoke over TLS: %q", got)
	}
	// Without the CA the client refuses the server; without the token the
	// server refuses the client, and the CLI says how to send one.
	cmd := exec.Command(bin, "ls")
	cmd.Env = append(os.Environ(), "PLOVER_SERVER="+srv.url, "PLOVER_TOKEN="+toks["root"], "PLOVER_CACERT=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "certificate") {
		t.Fatalf("ls without the CA: %v %s", err, out)
	}
	cmd = exec.Command(bin, "ls")
	cmd.Env = append(os.Environ(), "PLOVER_SERVER="+srv.url, "PLOVER_CACERT="+ca, "PLOVER_TOKEN=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "401") || !strings.Contains(string(out), "PLOVER_TOKEN") {
		t.Fatalf("ls without a token: %v %s", err, out)
	}

	t.Run("certificate-rotation", func(t *testing.T) {
		// A certificate from another CA replaces the files; SIGHUP: the
		// server presents it, so clients that trust only the old CA fail.
		ca2PEM, cert2PEM, key2PEM := testkit.Certs(t)
		ca2 := filepath.Join(dir, "ca2.pem")
		os.WriteFile(ca2, ca2PEM, 0o644)
		os.WriteFile(cert, cert2PEM, 0o644)
		os.WriteFile(key, key2PEM, 0o600)
		if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the certificate reload", func() bool {
			return strings.Contains(srv.log.String(), "SIGHUP: certificate reloaded")
		})
		run(t, bin, []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["root"], "PLOVER_CACERT=" + ca2}, "ls")
		cmd := exec.Command(bin, "ls")
		cmd.Env = append(os.Environ(), env...) // the old CA
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "certificate") {
			t.Fatalf("ls trusting only the old CA after rotation: %v %s", err, out)
		}
	})

	t.Run("non-loopback-needs-auth", func(t *testing.T) {
		// Named as given: ":0" listens as "[::]:0", which no one typed.
		for _, addr := range []string{"0.0.0.0:0", ":0"} {
			cmd := exec.Command(bin, "serve", "--listen", addr, "--data", t.TempDir(), "--device", "host")
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "--listen "+addr+" (every address of this machine) is not a loopback address and there is no --auth-file") {
				t.Fatalf("serve on %s without auth: %v\n%s", addr, err, out)
			}
		}
		// With --insecure-no-auth it starts, and says what that means for
		// each exposed listener: gRPC's too, with HTTP on loopback.
		for _, tc := range []struct{ flag, args string }{
			{"--listen", "--listen 0.0.0.0:0"},
			{"--grpc-listen", "--listen 127.0.0.1:0 --grpc-listen 0.0.0.0:0"},
		} {
			args := append(strings.Fields("serve "+tc.args+" --insecure-no-auth --device host --data"), t.TempDir())
			cmd := exec.Command(bin, args...)
			stderr, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			warned := make(chan bool, 1)
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					if strings.Contains(sc.Text(), "--insecure-no-auth: no authentication on a non-loopback address") &&
						strings.Contains(sc.Text(), "flag="+tc.flag) {
						warned <- true
						io.Copy(io.Discard, stderr)
						return
					}
				}
				warned <- false
			}()
			select {
			case ok := <-warned:
				if !ok {
					t.Errorf("serve %s --insecure-no-auth exited without the warning for %s", tc.args, tc.flag)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("no --insecure-no-auth warning for %s within 20 s", tc.flag)
			}
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
}

// TestHostileClients: connections past the cap, header-only requests that
// announce large bodies, and request smuggling, against a real server.
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	const maxConns = 300 // above the 200 connections of the memory case
	// All the hostile connections come from 127.0.0.1, like the test's own
	// requests: the per-client cap (netguard's tests) is set to the global
	// one so that this test sees the global cap.
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--max-conns", strconv.Itoa(maxConns), "--max-conns-per-client", strconv.Itoa(maxConns))
	addr := strings.TrimPrefix(srv.url, "http://")
	c := &http.Client{Timeout: 5 * time.Second}
	testkitDeploy := func() {
		b := packDir(t, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
		if r := secDo(t, c, "PUT", srv.url+"/v1/functions/echo", "", bundle.MediaType, b); r.code != 201 {
			t.Fatalf("deploy: %d %s", r.code, r.body)
		}
	}
	testkitDeploy()

	t.Run("connections-past-the-cap", func(t *testing.T) {
		var conns []net.Conn
		defer func() {
			for _, cn := range conns {
				cn.Close()
			}
		}()
		for i := 0; i < maxConns+1000; i++ {
			cn, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				t.Fatalf("dial %d: %v", i, err)
			}
			conns = append(conns, cn)
		}
		// The last one is past the cap: it reads the 503 and EOF.
		last := conns[len(conns)-1]
		last.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(last)
		if !strings.Contains(string(b), "503") || !strings.Contains(string(b), "--max-conns") {
			t.Fatalf("connection past the cap read %q", b)
		}
		for _, cn := range conns {
			cn.Close()
		}
		conns = nil
		closed := time.Now()
		waitFor(t, 5*time.Second, "/healthz after the connections closed", func() bool {
			r, err := (&http.Client{Timeout: 500 * time.Millisecond}).Get(srv.url + "/healthz")
			if err != nil {
				return false
			}
			r.Body.Close()
			return r.StatusCode == 200
		})
		if d := time.Since(closed); d > time.Second {
			t.Errorf("/healthz answered %v after the connections closed, want within 1s", d)
		}
		t.Logf("/healthz answered %v after %d connections closed", time.Since(closed), maxConns+1000)
	})

	t.Run("announced-bodies-reserve-nothing", func(t *testing.T) {
		base := rss(t, srv.pid)
		var conns []net.Conn
		for i := 0; i < 200; i++ {
			cn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(cn, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\nabc", 200<<20)
			conns = append(conns, cn)
		}
		waitFor(t, 10*time.Second, "the server to hold the 200 connections", func() bool {
			r := secDo(t, c, "GET", srv.url+"/metrics", "", "", nil)
			for _, l := range strings.Split(r.body, "\n") {
				if v, ok := strings.CutPrefix(l, "plover_connections_open "); ok {
					n, _ := strconv.ParseFloat(v, 64)
					return n >= 200
				}
			}
			return false
		})
		during := rss(t, srv.pid)
		for _, cn := range conns {
			cn.Close()
		}
		srv.mustBeHealthy(t, "after the header-only requests")
		after := rss(t, srv.pid)
		t.Logf("server RSS: %d MiB before, %d MiB with 200 requests announcing 200 MiB each, %d MiB after", base>>20, during>>20, after>>20)
		if during-base > 64<<20 || after-base > 64<<20 {
			t.Fatalf("RSS grew from %d MiB to %d MiB (during) / %d MiB (after): bodies were reserved from Content-Length", base>>20, during>>20, after>>20)
		}
	})

	t.Run("content-length-and-transfer-encoding", func(t *testing.T) {
		cn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cn.Close()
		fmt.Fprint(cn, "POST /v1/functions/echo/invoke HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		cn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(cn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), "Content-Length and Transfer-Encoding") || !resp.Close {
			t.Fatalf("CL+TE: %d close=%v %s", resp.StatusCode, resp.Close, b)
		}
	})
	srv.mustBeHealthy(t, "after the hostile clients")
}

// rss is a process's resident memory in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
