package httpapi_test

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/ioshare"
)

// landing is a lent slot that counts how it was given back.
type landing struct {
	mem                 [64]byte
	released, discarded int
}

func (l *landing) Input() []byte  { return l.mem[:32] }
func (l *landing) Output() []byte { return l.mem[32:] }
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
