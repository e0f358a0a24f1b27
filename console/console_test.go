package console_test

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/console"
)

func get(method, path string) *fasthttp.Response { return serve(method, path, false) }

// serve answers a request for path; raw leaves its dot segments as sent
// (fasthttp's server removes them before a handler sees the path: without
// raw the console's own refusal of them is never reached).
func serve(method, path string, raw bool) *fasthttp.Response {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.URI().DisablePathNormalizing = raw
	ctx.Request.SetRequestURI(path)
	console.Serve(&ctx)
	var r fasthttp.Response
	ctx.Response.CopyTo(&r)
	return &r
}

// TestServe: the files, their types, and the policy on every answer,
// refusals included.
func TestServe(t *testing.T) {
	for _, c := range []struct {
		method, path string
		code         int
		ctype        string
	}{
		{"GET", "/ui/", 200, "text/html; charset=utf-8"},
		{"GET", "/ui/index.html", 200, "text/html; charset=utf-8"},
		{"GET", "/ui/app.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/ui/metrics.js", 200, "text/javascript; charset=utf-8"}, // app.js imports it
		{"GET", "/ui/output.js", 200, "text/javascript; charset=utf-8"},  // and this
		{"HEAD", "/ui/style.css", 200, "text/css; charset=utf-8"},
		{"GET", "/ui", 302, ""},
		{"GET", "/", 302, ""},
		{"HEAD", "/", 302, ""},
		{"GET", "/ui/nothing.js", 404, ""},
		{"GET", "/ui/../console.go", 404, ""},
		{"GET", "/ui/%2e%2e/console.go", 404, ""},
		{"POST", "/ui/", 405, ""},
	} {
		r := get(c.method, c.path)
		if r.StatusCode() != c.code || c.ctype != "" && string(r.Header.ContentType()) != c.ctype {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, r.StatusCode(), r.Header.ContentType(), c.code, c.ctype)
		}
		if got := string(r.Header.Peek("Content-Security-Policy")); got != console.Policy {
			t.Errorf("%s %s: Content-Security-Policy %q", c.method, c.path, got)
		}
		if c.code == 302 && string(r.Header.Peek("Location")) != console.Prefix {
			t.Errorf("%s %s: Location %q, want the path %s (not an absolute URL from the request's Host)", c.method, c.path, r.Header.Peek("Location"), console.Prefix)
		}
		if string(r.Header.Peek("Referrer-Policy")) != "no-referrer" {
			t.Errorf("%s %s: Referrer-Policy %q", c.method, c.path, r.Header.Peek("Referrer-Policy"))
		}
		if string(r.Header.Peek("Cross-Origin-Opener-Policy")) != "same-origin" {
			t.Errorf("%s %s: Cross-Origin-Opener-Policy %q, want same-origin", c.method, c.path, r.Header.Peek("Cross-Origin-Opener-Policy"))
		}
		if string(r.Header.Peek("X-Frame-Options")) != "DENY" || string(r.Header.Peek("X-Content-Type-Options")) != "nosniff" {
			t.Errorf("%s %s: framing or sniffing allowed: %s", c.method, c.path, r.Header.String())
		}
	}
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(console.Policy, want) {
			t.Errorf("the policy lacks %s: %s", want, console.Policy)
		}
	}
	if strings.Contains(console.Policy, "unsafe-") {
		t.Errorf("the policy allows inline script or eval: %s", console.Policy)
	}
	// Dot segments that reach the console as sent: no file outside its
	// own, and a path that stays inside after them is served.
	for _, c := range []struct {
		path string
		code int
	}{
		{"/ui/../console.go", 404},
		{"/ui/x/../../console.go", 404},
		{"/ui/..", 302}, // the server's root: led to the console, no file served
		{"/ui/x/../app.js", 200},
	} {
		if r := serve("GET", c.path, true); r.StatusCode() != c.code {
			t.Errorf("GET %s as sent: %d, want %d", c.path, r.StatusCode(), c.code)
		}
	}
	if !console.Is([]byte("/ui/")) || !console.Is([]byte("/ui")) || !console.Is([]byte("/")) || console.Is([]byte("/uix")) || console.Is([]byte("/v1/functions")) {
		t.Error("Is: wrong paths")
	}
}

// TestFilesStayStrict reads every embedded file for what the policy would
// refuse or what would let a tenant's string become markup: inline script
// or handlers, eval, innerHTML and its kin, another origin.
func TestFilesStayStrict(t *testing.T) {
	bad := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|setHTML|document\.write|DOMParser|parseFromString|createContextualFragment|srcdoc|javascript:|\beval\(|new Function\(|https?://[a-z]|<script>|<script [^>]*>[^<]|\son[a-z]+=`)
	n := 0
	err := fs.WalkDir(console.Files(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(console.Files(), p)
		if err != nil {
			return err
		}
		n++
		for i, line := range strings.Split(string(b), "\n") {
			// The SVG namespace is a name, not a fetch.
			line = strings.ReplaceAll(line, "http://www.w3.org/2000/svg", "")
			if m := bad.FindString(line); m != "" {
				t.Errorf("%s:%d: %q in %q", p, i+1, m, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil || n < 3 {
		t.Fatalf("walk the files: %v (%d files)", err, n)
	}
}
