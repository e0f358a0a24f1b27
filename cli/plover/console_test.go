package main_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/internal/testkit"
)

// chromiumPath is the headless browser the console's tests drive, or ""
// when none is installed.
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// consoleBrowser is a headless Chromium for the console's tests. It
// accepts every dialog a page opens (a token link's confirm), keeping
// their messages.
type consoleBrowser struct {
	t   *testing.T
	ctx context.Context // without a deadline: one there would end the browser

	mu    sync.Mutex
	asked []string
}

// startBrowser starts one for the test, with extra options, which it skips
// without Chromium (fails with PLOVER_REQUIRE_CHROMIUM=1); it ends with
// the test.
func startBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) *consoleBrowser {
	t.Helper()
	chrome := chromiumPath()
	if chrome == "" && os.Getenv("PLOVER_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found, and PLOVER_REQUIRE_CHROMIUM=1 (bash scripts/install-chromium.sh installs Debian's)")
	}
	if chrome == "" {
		t.Skipf("\n\n*** SKIPPING %s: chromium not found (bash scripts/install-chromium.sh installs Debian's; PLOVER_REQUIRE_CHROMIUM=1 makes this a failure) ***\n\n", t.Name())
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	opts = append(opts, extra...)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	b := &consoleBrowser{t: t, ctx: ctx}
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", chrome, err)
	}
	// Answered from another goroutine: the page waits for the answer, and
	// so does whatever step opened the dialog.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.asked = append(b.asked, ev.Message)
			b.mu.Unlock()
			chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return b
}

// dialogs is the messages of the dialogs opened so far.
func (b *consoleBrowser) dialogs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.asked...)
}

// do runs steps within d, failing the test with what it was doing and the
// page.
func (b *consoleBrowser) do(d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.outerHTML`))
		b.t.Fatalf("%s: %v\npage: %.4000s", what, err, page)
	}
}

// text is the text of the element sel selects.
func (b *consoleBrowser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// evaluate is what expr evaluates to in b's page.
func evaluate[T any](b *consoleBrowser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// poll waits for expr to be true in the page.
func poll(expr string) chromedp.Action[chromedp.Void] { return chromedp.Poll[chromedp.Void](expr) }

// TestConsole: the console at /ui/ in a real headless Chromium against a
// real `plover serve` with tokens: the sign-in form; the overview lists the
// deployed functions with their figures; a function's page invokes with an
// uploaded file and gets the right bytes, shows Server-Timing, and shows
// the function's output as it comes, HTML included as text; rollback from
// the page changes the current version; a token in the address fragment
// leaves the address bar; the page fetches nothing but the server's own
// URLs. PLOVER_CONSOLE_SCREENSHOTS=DIR also writes the README's pictures
// (PNG; quality 100 is what makes chromedp write PNG, not JPEG).
func TestConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
	vecadd := filepath.Join(testkit.Root(), "build", "samples", "vecadd-host")
	input, err := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", "vecadd-input.bin"))
	if err != nil {
		t.Skipf("no vecadd sample (run make samples): %v", err)
	}
	want, err := os.ReadFile(filepath.Join(testkit.Root(), "build", "samples", "vecadd-expected.bin"))
	if err != nil {
		t.Skipf("no vecadd sample (run make samples): %v", err)
	}
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}, {"dash", "read", "*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile)
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/"
	deploy := func(dir, name, query string, code int) {
		t.Helper()
		if r := secDo(t, c, "PUT", fn+name+query, toks["root"], bundle.MediaType, packDir(t, dir)); r.code != code {
			t.Fatalf("deploy %s: %d %s", name, r.code, r.body)
		}
	}
	deploy(vecadd, "vecadd", "", 201)
	deploy(vecadd, "vecadd", "?force=true", 201) // a second version to roll back from
	talker, _ := outputBundle(t, "talker", "say", 1, 1)
	deploy(talker, "talker", "", 201)
	// "constructor", a valid function name and one a plain JavaScript
	// object already has (Object's): its figures must not break the page.
	ctor, _ := outputBundle(t, "constructor", "say", 1, 1)
	deploy(ctor, "constructor", "", 201)
	if r := secDo(t, c, "POST", fn+"constructor/invoke", toks["root"], "application/octet-stream", []byte("hi")); r.code != 200 {
		t.Fatalf("invoke constructor: %d %.200s", r.code, r.body)
	}
	if r := secDo(t, c, "POST", fn+"vecadd/invoke", toks["root"], "application/octet-stream", input); r.code != 200 {
		t.Fatalf("invoke vecadd: %d %.200s", r.code, r.body)
	}
	versions := func() api.Record {
		t.Helper()
		var rec api.Record
		if r := secDo(t, c, "GET", fn+"vecadd/versions", toks["root"], "", nil); r.code != 200 || json.Unmarshal([]byte(r.body), &rec) != nil || len(rec.Versions) != 2 {
			t.Fatalf("versions: %d %s", r.code, r.body)
		}
		return rec
	}
	before := versions()

	// Files served without a token carry the policy.
	resp, err := http.Get(srv.url + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("GET /ui/ without a token: %d, headers %v", resp.StatusCode, resp.Header)
	}

	// Every URL the page asks for.
	var mu sync.Mutex
	var urls []string
	if err := chromedp.Listen(b.ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			urls = append(urls, e.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("listen to chromium's requests: %v", err)
	}
	browser := b.ctx
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		b.do(30*time.Second, what, steps...)
	}
	text := b.text
	eval := func(expr string) bool {
		t.Helper()
		return evaluate[bool](b, expr)
	}
	shoot := func(name string) {
		t.Helper()
		dir := os.Getenv("PLOVER_CONSOLE_SCREENSHOTS")
		if dir == "" {
			return
		}
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), png, 0o644)
		}
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
	}

	// A wrong token: the form again, saying why in the server's words, and
	// the page holds no token it could go on showing as signed in.
	wrong := "not-a-token-this-server-knows"
	do("sign in with a wrong token",
		chromedp.Navigate(srv.url+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS("#token"), wrong),
		chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
		poll(`!document.getElementById("signin").hidden && document.getElementById("signin-error").textContent.includes("401")`))
	if why := text("#signin-error"); !strings.Contains(why, "not known to this server") {
		t.Errorf("a wrong token's sign-in error: %q, want the server's message (the bearer token is not known to this server)", why)
	}
	if who, held := text("#whoami"), evaluate[bool](b, `sessionStorage.getItem("plover-token") !== null || !document.getElementById("signout").hidden`); who != "" || held {
		t.Errorf("after a token the server refused the header says %q (sign-out shown or token kept: %v), want signed out", who, held)
	}
	if !eval(`document.activeElement === document.getElementById("token")`) {
		t.Error("the sign-in form shows without its token field focused")
	}

	// Sign in; the overview lists both functions with vecadd's figures.
	do("sign in and overview",
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS("#token"), toks["root"]),
		chromedp.Click(chromedp.CSS(`#signin button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-function="talker"]`)),
		poll(`document.querySelector('tr[data-function="vecadd"] td.p50').textContent !== "–"`),
		poll(`document.querySelector('tr[data-function="constructor"] td.p50').textContent !== "–"`))
	if requests, p50 := text(`tr[data-function="vecadd"] td.requests`), text(`tr[data-function="vecadd"] td.p50`); requests != "1" || !strings.HasSuffix(p50, " ms") {
		t.Errorf("overview's vecadd: requests %q p50 %q, want 1 and a time", requests, p50)
	}
	shoot("console-overview.png")

	// Live: an invoke made elsewhere shows without a reload.
	if r := secDo(t, c, "POST", fn+"vecadd/invoke", toks["root"], "application/octet-stream", input); r.code != 200 {
		t.Fatalf("invoke vecadd: %d %.200s", r.code, r.body)
	}
	do("the overview refreshing itself",
		poll(`document.querySelector('tr[data-function="vecadd"] td.requests').textContent === "2"`))

	// Pipelines: the digits sample's steps, each with its runs and time.
	samples := filepath.Join(testkit.Root(), "build", "samples")
	for _, d := range []string{"digits-normalize-host", "cnn-host", "digits-top1-host", "digits-pipeline"} {
		m, err := bundle.ReadManifest(filepath.Join(samples, d))
		if err != nil {
			t.Skipf("no %s sample (run make samples): %v", d, err)
		}
		deploy(filepath.Join(samples, d), m.Name, "", 201)
	}
	if r := secDo(t, c, "POST", fn+"digits/invoke", toks["root"], "application/octet-stream", make([]byte, 784)); r.code != 200 {
		t.Fatalf("invoke digits: %d %.200s", r.code, r.body)
	}
	do("the pipelines page",
		chromedp.Navigate(srv.url+"/ui/#/pipelines"),
		chromedp.WaitVisible(chromedp.CSS(`section[data-pipeline="digits"] tr[data-step="2"]`)),
		poll(`document.querySelector('section[data-pipeline="digits"] tr[data-step="2"] td.runs').textContent === "1"`))
	if steps := text(`section[data-pipeline="digits"] tbody`); !strings.Contains(steps, "digits-normalize") || !strings.Contains(steps, "cnn") ||
		!strings.Contains(steps, "digits-top1") || strings.Contains(text(`section[data-pipeline="digits"] tr[data-step="0"] td.p50`), "–") {
		t.Errorf("the digits pipeline's steps: %q", steps)
	}

	// A parallel step's branches share its index and are each a series of
	// their own (plover_pipeline_step_seconds' function label): a row each,
	// each with its own figures (one histogram read across both gave the
	// slow branch the fast one's p99) and a link to its own page. Both warm
	// first, so that the fast branch's time in the pipeline is its run.
	const slowMs = 300
	deploy(testkit.BundleDir(t, testkit.Manifest("fast"), nil), "fast", "", 201)
	deploy(testkit.BundleDir(t, testkit.Slow("slow", slowMs), nil), "slow", "", 201)
	deploy(testkit.PipelineDir(t, "par", map[string]any{"parallel": []string{"fast", "slow"}}), "par", "", 201)
	for _, name := range []string{"fast", "slow", "par"} {
		if r := secDo(t, c, "POST", fn+name+"/invoke", toks["root"], "application/octet-stream", []byte("x")); r.code != 200 {
			t.Fatalf("invoke %s: %d %.200s", name, r.code, r.body)
		}
	}
	branch := func(name string) string {
		return `section[data-pipeline="par"] tr[data-step="0"][data-function="` + name + `"]`
	}
	do("a parallel step's branches",
		chromedp.WaitVisible(chromedp.CSS(branch("slow"))),
		poll(`document.querySelector('`+branch("slow")+` td.runs').textContent === "1" && document.querySelector('`+branch("fast")+` td.runs').textContent === "1"`))
	p99 := func(name string) time.Duration {
		t.Helper()
		s := strings.TrimSuffix(text(branch(name)+" td.p99"), " ms")
		d, err := time.ParseDuration(s + "ms")
		if err != nil {
			t.Fatalf("%s's p99 on the pipelines page: %q", name, s)
		}
		return d
	}
	if got := p99("slow"); got < slowMs*time.Millisecond {
		t.Errorf("the slow branch's p99 on the pipelines page: %v, under its %d ms run (another branch's series mixed in)", got, slowMs)
	}
	for _, name := range []string{"fast", "slow"} {
		if href := evaluate[string](b, `document.querySelector('`+branch(name)+` a').getAttribute("href")`); href != "#/functions/"+name {
			t.Errorf("the %s branch links to %q, want #/functions/%s", name, href, name)
		}
	}
	do("a branch's link", chromedp.Click(chromedp.CSS(branch("slow")+" a")),
		poll(`document.querySelector("#main h2").textContent === "slow" && document.querySelector("#versions tr.current") !== null`))

	// A function's page from a link with the token in the fragment: the
	// token leaves the address bar. Invoking with an uploaded file gives the
	// function's bytes and the Server-Timing parts.
	inFile := filepath.Join(t.TempDir(), "vecadd-input.bin")
	os.WriteFile(inFile, input, 0o644)
	sum := sha256.Sum256(want)
	do("invoke from the page",
		chromedp.Navigate(srv.url+"/ui/#/functions/vecadd?token="+toks["root"]),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)),
		// The chart shows the requests since the page's first poll at the
		// earliest (their window's start): one made before it is not drawn.
		poll(`!document.getElementById("chart").getAttribute("aria-label").endsWith("measuring")`),
		chromedp.SetUploadFiles(chromedp.CSS("#invoke-file"), []string{inFile}),
		chromedp.Click(chromedp.CSS(`#invoke button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#invoke-sha256")))
	href, err := chromedp.Run(browser, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(href, toks["root"]) || !strings.HasSuffix(href, "#/functions/vecadd") {
		t.Errorf("address after a token link: %q (the token must leave it)", href)
	}
	// A link with the token the page holds already changes nothing, and
	// asks nothing; the header names the token by its first characters.
	tag := func(name string) string { return toks[name][:6] + "…" }
	if d := b.dialogs(); len(d) != 0 {
		t.Errorf("a link with the token held asked %q", d)
	}
	if who := text("#whoami"); who != "token "+tag("root") {
		t.Errorf("the header says %q, want token %s", who, tag("root"))
	}
	// A version names the token that deployed it (its tenant), never the token.
	if by := text(`#versions tr.current td.tenant`); by != "root" {
		t.Errorf("the current version's deployer: %q, want root", by)
	}
	if got := text("#invoke-sha256"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("invoke from the page: output sha256 %s, want %x", got, sum)
	}
	// The download link holds the output (a blob: URL of the bytes hashed
	// above; the page's own CSP keeps a test from fetching it back); the
	// chart draws the server's p50 and p99 once it has two samples.
	do("download link and latency chart",
		poll(`document.getElementById("invoke-download").href.startsWith("blob:`+srv.url+`/") && document.getElementById("invoke-download").download === "vecadd.out"`),
		poll(`document.querySelectorAll("#chart polyline").length === 2 && document.querySelector("#chart polyline.p99").getAttribute("points").split(" ").length >= 2`))
	if timing := text("#server-timing"); !strings.Contains(timing, "kernels") || !strings.Contains(timing, "total") {
		t.Errorf("Server-Timing shown: %q", timing)
	}

	// Rollback from the page makes the other version current.
	other := before.Versions[0].ID
	if other == before.Current {
		other = before.Versions[1].ID
	}
	// Each rollback button is named for its version, for a screen reader;
	// the upload field has a label.
	if name := evaluate[string](b, `document.querySelector('button.rollback[data-version="`+other+`"]').getAttribute("aria-label")`); name != "Roll back to "+other[:12] {
		t.Errorf("the rollback button's accessible name: %q, want Roll back to %s", name, other[:12])
	}
	if !eval(`document.getElementById("invoke-file").labels.length === 1 && document.getElementById("chart").getAttribute("role") === "img" && document.getElementById("chart").getAttribute("aria-label").includes("latency of vecadd")`) {
		t.Error("the upload field has no label, or the chart no role and name")
	}
	do("rollback from the page",
		chromedp.Click(chromedp.CSS(`button.rollback[data-version="`+other+`"]:not([aria-disabled])`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.current[data-version="`+other+`"]`)))
	if after := versions(); after.Current != other {
		t.Errorf("after rollback from the page: current %s, want %s", after.Current, other)
	}

	// A read token sees the button but the server refuses the rollback:
	// the page shows the server's reason and the version stays. Its link
	// asks before it replaces the token held (the browser says yes).
	back := before.Current
	do("rollback with a read token",
		chromedp.Navigate(srv.url+"/ui/#/functions/vecadd?token="+toks["dash"]),
		chromedp.WaitVisible(chromedp.CSS(`button.rollback[data-version="`+back+`"]`)),
		chromedp.Click(chromedp.CSS(`button.rollback[data-version="`+back+`"]:not([aria-disabled])`)),
		poll(`document.getElementById("rollback-error").textContent.includes("403 forbidden")`))
	if after := versions(); after.Current != other {
		t.Errorf("a read token's rollback from the page: current %s, want %s still", after.Current, other)
	}
	if d := b.dialogs(); len(d) != 1 || !strings.Contains(d[0], tag("dash")+" instead of yours ("+tag("root")+")") {
		t.Errorf("a link with another token asked %q, want one question naming both", d)
	}
	if who := text("#whoami"); who != "token "+tag("dash") {
		t.Errorf("the header says %q, want token %s", who, tag("dash"))
	}
	// Signed out (as a new tab holds no token), a link still asks: it is
	// anyone's, and would act as its sender's token. Followed while the
	// sign-in form shows, it leaves no form beside the signed-in page.
	do("sign out", chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#signin")))
	// Waited for until the overview shows: the page keeps the link's token
	// as it loads, and the next step's navigation must not come first.
	do("back to the admin token", chromedp.Navigate(srv.url+"/ui/#/?token="+toks["root"]),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-function="vecadd"]`)))
	if d := b.dialogs(); len(d) != 2 || !strings.Contains(d[1], "signs you in with token "+tag("root")) {
		t.Errorf("a link opened without a token asked %q, want a second question naming it", d)
	}
	if eval(`!document.getElementById("signin").hidden`) {
		t.Error("a token link followed from the sign-in form left the form showing beside the signed-in page")
	}

	// A link someone was sent, naming no function: nothing is called with
	// the user's token on a path it builds.
	do("a fragment that is not a function name",
		chromedp.Navigate(srv.url+"/ui/#/functions/..%2F..%2Fhealthz"),
		poll(`document.getElementById("main").textContent.includes("not a function name")`))

	// A function deleted under its open page: nothing of it is left to
	// roll back to, and the page says why.
	do("vecadd's page", chromedp.Navigate(srv.url+"/ui/#/functions/vecadd"),
		chromedp.WaitVisible(chromedp.CSS(`#versions button.rollback`)))
	if r := secDo(t, c, "DELETE", fn+"vecadd", toks["root"], "", nil); r.code != 200 {
		t.Fatalf("delete vecadd: %d %s", r.code, r.body)
	}
	do("a deleted function's page",
		poll(`document.getElementById("summary").textContent === "function vecadd not found (deleted?)" && document.querySelector("#versions button.rollback") === null && document.querySelector("#chart polyline") === null`))

	// A function printing HTML: its output shows as text, as it comes.
	htmlIn := filepath.Join(t.TempDir(), "html.txt")
	os.WriteFile(htmlIn, []byte(`<b id="injected">bold</b><img src="x" onerror="document.title='pwned'">`), 0o644)
	do("output of a function printing HTML",
		chromedp.Navigate(srv.url+"/ui/#/functions/talker"),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)),
		chromedp.SetUploadFiles(chromedp.CSS("#invoke-file"), []string{htmlIn}),
		chromedp.Click(chromedp.CSS(`#invoke button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#invoke-sha256")),
		poll(`document.getElementById("logs").textContent.includes('say: <b id="injected">')`))
	if eval(`document.getElementById("injected") !== null || document.querySelector("#logs img") !== null || document.title === "pwned"`) {
		t.Errorf("a function's HTML output became elements:\n%s", text("#logs"))
	}
	shoot("console-function.png")

	// A function refusing its input with the input as its message: the
	// error shows escaped, as its output does, not applied (a bidi
	// override could make what the operator reads say something else).
	refuser, _ := outputBundle(t, "refuser", "refuse", 1, 1)
	deploy(refuser, "refuser", "", 201)
	bidiIn := filepath.Join(t.TempDir(), "bidi.txt")
	os.WriteFile(bidiIn, []byte("report-\u202egpj.exe"), 0o644)
	do("a function's refusal in its own words",
		chromedp.Navigate(srv.url+"/ui/#/functions/refuser"),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)),
		chromedp.SetUploadFiles(chromedp.CSS("#invoke-file"), []string{bidiIn}),
		chromedp.Click(chromedp.CSS(`#invoke button[type="submit"]`)),
		poll(`document.getElementById("invoke-error") !== null`))
	if got := text("#invoke-error"); !strings.Contains(got, `report-\u202egpj.exe`) || strings.ContainsRune(got, '\u202e') {
		t.Errorf("the refusal shows as %q, want the override escaped", got)
	}

	// The page sends tokens only in Authorization headers, which the
	// server never logs.
	for _, tok := range []string{toks["root"], toks["dash"], wrong} {
		if strings.Contains(srv.log.String(), tok) {
			t.Errorf("the server's log has a token the console sent:\n%s", srv.log)
		}
	}

	// A server without tokens: no sign-in, the figures at once.
	open := startServer(t, bin)
	do("a console without auth",
		chromedp.Navigate(open.url+"/ui/"),
		poll(`document.getElementById("health").textContent.includes("status: ok")`))
	if eval(`!document.getElementById("signin").hidden`) {
		t.Error("a server without auth shows the sign-in form")
	}

	// --console=false: /ui/ is no route.
	off := startServer(t, bin, "--console=false")
	if resp, err := http.Get(off.url + "/ui/"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /ui/ with --console=false: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	mu.Lock()
	defer mu.Unlock()
	if len(urls) == 0 {
		t.Fatal("no requests seen: the network listener is not working")
	}
	for _, u := range urls {
		ours := false
		for _, s := range []string{srv.url, open.url} {
			ours = ours || strings.HasPrefix(u, s+"/") || strings.HasPrefix(u, "blob:"+s+"/")
		}
		if !ours && !strings.HasPrefix(u, "data:") {
			t.Errorf("the console fetched %s, not from the servers %s and %s", u, srv.url, open.url)
		}
	}
}

// TestConsoleInsecureOrigin: a console read over plain HTTP from a name
// other than localhost (http://gpu-box:8080 with tokens: TLS is optional)
// is no secure context, and its browser has no crypto.subtle. Invoking from it still
// shows the output's size and offers it for download, and says why no
// sha256 is shown, instead of an error after the function ran.
func TestConsoleInsecureOrigin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t, chromedp.Flag("host-resolver-rules", "MAP plover.test 127.0.0.1"))
	bin := buildPlover(t)
	// A server without tokens answers only its loopback names.
	authFile := filepath.Join(t.TempDir(), "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}})
	srv := startServer(t, bin, "--auth-file", authFile)
	c := &http.Client{Timeout: 30 * time.Second}
	talker, _ := outputBundle(t, "talker", "say", 1, 1)
	if r := secDo(t, c, "PUT", srv.url+"/v1/functions/talker", toks["root"], bundle.MediaType, packDir(t, talker)); r.code != 201 {
		t.Fatalf("deploy talker: %d %s", r.code, r.body)
	}
	page := strings.Replace(srv.url, "127.0.0.1", "plover.test", 1) + "/ui/#/functions/talker"
	in := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(in, []byte("hello"), 0o644)
	b.do(30*time.Second, "open talker's page at "+page,
		chromedp.Navigate(page+"?token="+toks["root"]),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	if evaluate[bool](b, `window.isSecureContext || globalThis.crypto.subtle !== undefined`) {
		t.Fatalf("%s is a secure context here: the test would not see what a plain-HTTP console's browser lacks", page)
	}
	b.do(30*time.Second, "invoke from a page that is no secure context",
		chromedp.SetUploadFiles(chromedp.CSS("#invoke-file"), []string{in}),
		chromedp.Click(chromedp.CSS(`#invoke button[type="submit"]`)),
		poll(`document.getElementById("invoke-download") !== null || document.getElementById("invoke-error") !== null`))
	if evaluate[bool](b, `document.getElementById("invoke-error") !== null`) {
		t.Fatalf("invoke from %s: %q, want the output offered (the function ran)", page, b.text("#invoke-error"))
	}
	if href := evaluate[string](b, `document.getElementById("invoke-download").href`); !strings.HasPrefix(href, "blob:http://plover.test:") {
		t.Errorf("the download link: %q, want a blob: URL of the page's origin", href)
	}
	if note := b.text("#invoke-sha256-note"); !strings.Contains(note, "HTTPS") || !strings.Contains(note, "localhost") {
		t.Errorf("the page says %q where the sha256 would be, want why there is none (HTTPS or localhost)", note)
	}
	if got := b.text("#invoke-result"); !strings.Contains(got, "200 ·") {
		t.Errorf("the invoke's result: %q, want its status and size", got)
	}
}

// TestConsoleLatencyWindow: a function page's latency chart reads the
// requests of its window (?window=10s here; a minute by default), not the
// server's life: the server's histogram is cumulative, and a function
// that was slow once read slow for ever (its p99 while slow requests were
// 1% of all it served). Slow requests, then fast ones: the chart's p99
// follows the fast ones once the slow have left the window, and once no
// request comes it shows none rather than the last figure.
func TestConsoleLatencyWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
	srv := startServer(t, buildPlover(t))
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/lat"
	deploy := func(m *abi.Manifest) {
		t.Helper()
		if r := secDo(t, c, "PUT", fn+"?force=true", "", bundle.MediaType, packDir(t, testkit.BundleDir(t, m, nil))); r.code != 201 {
			t.Fatalf("deploy lat: %d %s", r.code, r.body)
		}
	}
	// invoke also runs on another goroutine than the test's: it fails
	// nothing itself.
	invoke := func() error {
		resp, err := c.Post(fn+"/invoke", "application/octet-stream", strings.NewReader("x"))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
			return fmt.Errorf("invoke lat: %d %.200s", resp.StatusCode, b)
		}
		return nil
	}
	// label is the chart's accessible name; p99 reads its figure in ms
	// (-1: none).
	const label = `document.getElementById("chart").getAttribute("aria-label")`
	const p99 = `(() => { const m = / p99 ([0-9.]+) ms/.exec(` + label + `); return m ? Number(m[1]) : -1; })()`
	const slowMs = 300 // its bucket starts at 238 ms; an echo's ends at 95 ms

	deploy(testkit.Slow("lat", slowMs))
	b.do(30*time.Second, "lat's page, no request yet in its window",
		chromedp.Navigate(srv.url+"/ui/#/functions/lat?window=10s"),
		poll(label+`.endsWith("now no requests")`))
	if title := b.text("#chart-title"); !strings.Contains(title, "requests in the last 10 s") {
		t.Errorf("the chart's title %q does not say its window", title)
	}
	for range 5 {
		if err := invoke(); err != nil {
			t.Fatal(err)
		}
	}
	b.do(30*time.Second, "the slow requests drawn", poll(p99+` >= 200`))

	// Fast requests, kept coming until the chart has followed them. Paced
	// (a load, not a wait): at 5 a second the 5 slow ones stay over 1% of
	// the server's life's requests for 100 s, so within the 40 s waited
	// only a windowed p99 falls.
	deploy(testkit.Manifest("lat"))
	ctx, cancel := context.WithCancel(context.Background())
	fast := make(chan error, 1)
	go func() {
		pace := time.NewTicker(200 * time.Millisecond)
		defer pace.Stop()
		for ctx.Err() == nil {
			if err := invoke(); err != nil {
				fast <- err
				return
			}
			select {
			case <-pace.C:
			case <-ctx.Done():
			}
		}
		fast <- nil
	}()
	b.do(40*time.Second, "the chart following the fast requests", poll(p99+` >= 0 && `+p99+` < 100`))
	cancel()
	if err := <-fast; err != nil {
		t.Fatal(err)
	}
	b.do(60*time.Second, "a window with no request", poll(label+`.endsWith("now no requests")`))
	if b.text("#chart text") == "" || !strings.Contains(b.text("#chart text"), "none") {
		t.Errorf("the chart's own text: %q, want it to say no requests came in its window", b.text("#chart text"))
	}
}

// TestConsoleConcurrencyOne: the console signed in with a token limited to
// concurrency=1 (README, token limits). A function's page follows its
// output and polls its figures together: when the stream held the token's
// only place, every poll was refused 429 (the chart stayed empty, the
// status line said rate_limited). Streams are now counted apart, up to the
// same bound, and the page sends one read at a time: the output comes,
// the chart fills, and the server refuses none of the page's requests,
// on the overview either.
func TestConsoleConcurrencyOne(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries, starts a server and a browser")
	}
	b := startBrowser(t)
	bin := buildPlover(t)
	authFile := filepath.Join(t.TempDir(), "tokens")
	tok := writeLimitedAuthFile(t, authFile, []limitedToken{
		{"root", auth.Admin, auth.Limits{}},
		{"one", auth.Read, auth.Limits{Concurrency: 1}},
	})
	srv := startServer(t, bin, "--auth-file", authFile)
	c := &http.Client{Timeout: 30 * time.Second}
	fn := srv.url + "/v1/functions/talker"
	talker, _ := outputBundle(t, "talker", "say", 1, 1)
	if r := secDo(t, c, "PUT", fn, tok["root"], bundle.MediaType, packDir(t, talker)); r.code != 201 {
		t.Fatalf("deploy talker: %d %s", r.code, r.body)
	}
	// refused is what the server counted of the token's 429s.
	refused := func() string {
		t.Helper()
		r := secDo(t, c, "GET", srv.url+"/metrics", tok["root"], "", nil)
		var out []string
		for _, l := range strings.Split(r.body, "\n") {
			if strings.HasPrefix(l, "plover_token_limited_total{") && strings.Contains(l, `token="one"`) {
				out = append(out, l)
			}
		}
		return strings.Join(out, "; ")
	}

	b.do(30*time.Second, "talker's page, following its output",
		chromedp.Navigate(srv.url+"/ui/#/functions/talker?token="+tok["one"]),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	for i := range 3 {
		if r := secDo(t, c, "POST", fn+"/invoke", tok["root"], "application/octet-stream", []byte(fmt.Sprintf("line-%d", i))); r.code != 200 {
			t.Fatalf("invoke talker: %d %.200s", r.code, r.body)
		}
	}
	// Polls made while the stream is open: the chart's samples, each a
	// poll of /metrics after the function's summary and versions.
	b.do(30*time.Second, "the output and the figures together",
		poll(`document.getElementById("logs").textContent.includes("say: line-2")`),
		poll(`/last ([3-9]|[1-9][0-9]+) samples/.test(document.getElementById("chart").getAttribute("aria-label"))`))
	if st := b.text("#status"); st != "" {
		t.Errorf("the status line says %q with the output followed, want nothing", st)
	}
	if n := refused(); n != "" {
		t.Errorf("the server refused the page's requests: %s", n)
	}

	// The overview, two reads each refresh.
	b.do(30*time.Second, "the overview refreshing",
		chromedp.Navigate(srv.url+"/ui/#/"),
		poll(`document.querySelector('tr[data-function="talker"] td.requests') !== null && document.querySelector('tr[data-function="talker"] td.requests').textContent === "3"`))
	if r := secDo(t, c, "POST", fn+"/invoke", tok["root"], "application/octet-stream", []byte("line-3")); r.code != 200 {
		t.Fatalf("invoke talker: %d %.200s", r.code, r.body)
	}
	b.do(30*time.Second, "the overview refreshed",
		poll(`document.querySelector('tr[data-function="talker"] td.requests').textContent === "4" && document.getElementById("health").textContent.includes("status: ok")`))
	if st := b.text("#status"); st != "" {
		t.Errorf("the overview's status line says %q, want nothing", st)
	}
	if n := refused(); n != "" {
		t.Errorf("the server refused the overview's requests: %s", n)
	}

	// A reload: the new page asks to follow before the server has seen
	// the old one's stream go (its poll is a second) and may be refused
	// (429, the token's one stream): it asks again quietly, and follows.
	b.do(30*time.Second, "talker's page, reloaded",
		chromedp.Navigate(srv.url+"/ui/#/functions/talker"),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)),
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS(`#versions tr.current`)))
	if r := secDo(t, c, "POST", fn+"/invoke", tok["root"], "application/octet-stream", []byte("line-5")); r.code != 200 {
		t.Fatalf("invoke talker: %d %.200s", r.code, r.body)
	}
	// The new stream sends the kept lines of the last hour as it opens,
	// whenever that is.
	b.do(30*time.Second, "the output followed after the reload",
		poll(`document.getElementById("logs").textContent.includes("say: line-5")`))
	// unbroken fails the test where the output pane says its stream ended.
	unbroken := func(after string) {
		t.Helper()
		if out := evaluate[string](b, `document.getElementById("logs").textContent`); strings.Contains(out, "output stream ended") {
			t.Errorf("after %s the output pane says its stream ended: %q", after, out)
		}
	}
	unbroken("a reload")

	// A hidden tab follows nothing: the token's one stream is free for
	// another client until the tab is shown again, when the page follows
	// again. (Headless pages are never hidden: the page is told it is.)
	hide := func(hidden bool) {
		evaluate[bool](b, fmt.Sprintf(`(Object.defineProperty(document, "hidden", {value: %v, configurable: true}), document.dispatchEvent(new Event("visibilitychange")), true)`, hidden))
	}
	follow := func() int { // opens a stream with the page's token and ends it
		req, _ := http.NewRequest("GET", fn+"/logs?follow=true", nil)
		req.Header.Set("Authorization", "Bearer "+tok["one"])
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	hide(true)
	deadline := time.Now().Add(10 * time.Second)
	for code := follow(); code != 200; code = follow() {
		if time.Now().After(deadline) {
			t.Fatalf("with the page hidden, a stream with its token is still refused after 10 s: %d", code)
		}
		time.Sleep(200 * time.Millisecond) // the server sees the page's stream go on its next poll
	}
	hide(false)
	if r := secDo(t, c, "POST", fn+"/invoke", tok["root"], "application/octet-stream", []byte("line-6")); r.code != 200 {
		t.Fatalf("invoke talker: %d %.200s", r.code, r.body)
	}
	b.do(30*time.Second, "the output followed again once shown",
		poll(`document.getElementById("logs").textContent.includes("say: line-6")`))
	unbroken("the tab was shown again")
}
