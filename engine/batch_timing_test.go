package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/internal/testkit"
)

// Runs of a batching function that follow one another on its instances
// each report their own copy and kernel times: a run read them from its
// instance after putting it back, when the next run may already be using
// it (a data race, which go test -race reports here).
func TestBatchRunsReadTheirOwnTimingBeforeTheNextTakesTheInstance(t *testing.T) {
	m := testkit.BatchManifest("tm", 4, "")
	m.MaxInstances = 2
	e := batchEngine(t, m)
	const clients, perClient = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	stop := time.Now().Add(20 * time.Second)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				if time.Now().After(stop) {
					return
				}
				v := uint32(c*1000 + i)
				req := &call.Request{Input: item(v, 0)}
				if err := e.Invoke(context.Background(), "tm", req); err != nil {
					errs <- err
					return
				}
				if got := binary.LittleEndian.Uint32(req.Output); got != v+1 {
					errs <- fmt.Errorf("request %d got %d", v, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
