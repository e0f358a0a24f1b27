package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/reqmetrics"
)

// landing is a lent slot that counts how it was given back.
type landing struct {
	mem                 [128 << 10]byte
	released, discarded int
}

func (l *landing) Input() []byte  { return l.mem[:64<<10] }
func (l *landing) Output() []byte { return l.mem[64<<10:] }
func (l *landing) Release()       { l.released++ }
func (l *landing) Discard()       { l.discarded++ }

// landRunner lends its landing to every raw invoke, whose run panics (a
// bug in a device's Go code, the worker perhaps still writing into it).
type landRunner struct {
	testkit.PanicRunner
	land *landing
}

func (landRunner) IO(string) *ioshare.Flow { return nil }

func (r landRunner) Land(string) call.Landing { return r.land }

func (landRunner) Invoke(context.Context, string, *call.Request) error {
	panic("a bug in Invoke")
}

// A raw invoke whose run panics discards the slot its body landed in: not
// released (the worker may still write into it while another request uses
// it), and not left lent either, as before the fix, when it stayed mapped
// for the server's life (up to the pool's 32 slots per program, per
// version): released 0, discarded 0.
func TestPanickedRawInvokeDiscardsItsSlot(t *testing.T) {
	land := &landing{}
	srv := httpapi.New(frontdoor.New(frontdoor.Config{Runner: landRunner{land: land}}), nil, httpapi.Options{})
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/v1/functions/f/invoke")
	ctx.Request.Header.SetContentType("application/octet-stream")
	ctx.Request.SetBodyString("a body")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the invoke did not panic")
			}
		}()
		srv.Handle(&ctx) // in process: no recovery around it
	}()
	if land.released != 0 || land.discarded != 1 {
		t.Fatalf("the panicked request's slot: released %d times, discarded %d; want discarded once", land.released, land.discarded)
	}
}

// panicReader is a body whose read panics (a bug while a piece moves)
// once it has given n bytes.
type panicReader struct{ n int }

func (r *panicReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		panic("a bug while reading a body piece")
	}
	k := min(len(p), r.n)
	r.n -= k
	return k, nil
}

// A panic while a body is read gives back the body budget its read window
// held and, for a raw invoke, releases the slot it was lent for the body
// once the body was arriving, past what came with the headers (no worker
// has it yet). Before the fix both were given back only on readBody's
// error return: the slot stayed lent (released 0, discarded 0), 32 such
// panics filling a program's pool, and --max-body-memory shrank by a
// window with every panic, on every route that reads a body.
func TestPanicInReadingABodyGivesBackItsSlotAndBudget(t *testing.T) {
	for _, c := range []struct {
		name, route, ct string
		slot            bool // the route lends the body a slot
	}{
		{"raw invoke", "/v1/functions/f/invoke", "application/octet-stream", true},
		{"JSON invoke", "/v1/functions/f/invoke", "application/json", false},
		{"v2 infer", "/v2/models/f/infer", "application/json", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			land := &landing{}
			budget := netguard.NewBudget(1 << 20)
			srv := httpapi.New(frontdoor.New(frontdoor.Config{Runner: landRunner{land: land}}), nil, httpapi.Options{BodyBudget: budget})
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI(c.route)
			ctx.Request.Header.SetContentType(c.ct)
			ctx.Request.SetBodyStream(&panicReader{n: 16 << 10}, 32<<10)
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("the body's read did not panic")
					}
				}()
				srv.Handle(&ctx) // in process: no recovery around it
			}()
			if want := map[bool]int{true: 1}[c.slot]; land.released != want || land.discarded != 0 {
				t.Errorf("the slot lent for the body: released %d times, discarded %d; want released %d times", land.released, land.discarded, want)
			}
			if n := budget.InUse(); n != 0 {
				t.Errorf("body budget still held after the request: %d bytes, want 0", n)
			}
		})
	}
}

// releasePanics is a lent slot whose release panics (a bug in giving a
// worker's slot back).
type releasePanics struct{ landing }

func (*releasePanics) Release() { panic("a bug in Release") }

// slotAnswerRunner lends its landing to every raw invoke and leaves the
// run's output in it, as a device's run does: the answer is written from
// the slot, released once written.
type slotAnswerRunner struct {
	testkit.PanicRunner
	land call.Landing
}

func (slotAnswerRunner) IO(string) *ioshare.Flow    { return nil }
func (r slotAnswerRunner) Land(string) call.Landing { return r.land }
func (r slotAnswerRunner) Invoke(_ context.Context, _ string, req *call.Request) error {
	req.Output = append(r.land.Output()[:0], "from the slot"...)
	return nil
}

// A panic in releasing the slot an answer was written from, which fasthttp
// calls as it closes the answer's body (outside the handler), is logged as
// request panicked and counted, and the answer, whole, still reaches its
// client. fasthttp's own recovery there made it an error (the answer left
// unflushed), and its reset of the context then closed the body again,
// unrecovered: the process ended.
func TestPanicInReleasingAnAnswersSlotIsRecorded(t *testing.T) {
	var log testkit.LogBuffer
	reg := prometheus.NewRegistry()
	door := frontdoor.New(frontdoor.Config{Runner: slotAnswerRunner{land: &releasePanics{}}, Metrics: reqmetrics.New(reg),
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	url := testkit.ServeWith(t, httpapi.New(door, nil, httpapi.Options{Registry: reg}))
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(url+"/v1/functions/f/invoke", "application/octet-stream", strings.NewReader("in"))
	if err != nil {
		t.Fatalf("the invoke: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "from the slot" || err != nil {
		t.Fatalf("the invoke: %d %q %v, want 200 and the slot's answer", resp.StatusCode, body, err)
	}
	if resp, err := client.Get(url + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the next request, GET /readyz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	onePanic(t, log.String(), reg, "POST /v1/functions/f/invoke", "a bug in Release", "f")
}
