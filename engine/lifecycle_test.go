package engine_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/evict"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
)

type holdKey struct{}

// holdStore holds a record write made with a marked context once it has
// landed in the store, until released: a control call whose store change
// is done and whose change of this node is still to come.
type holdStore struct {
	objectstore.Store
	landed, release chan struct{}
}

func (s holdStore) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	err := s.Store.PutIf(ctx, key, r, size, ifMatch)
	if err == nil && ctx.Value(holdKey{}) != nil && strings.HasPrefix(key, "functions/") {
		s.landed <- struct{}{}
		<-s.release
	}
	return err
}

// A deploy whose record landed in the store before another control call's
// change (a delete, a rollback, another deploy) but which changes this
// node after it leaves the node as the store is: the later change's, not
// the deploy's. Otherwise a deleted function keeps serving here, or the
// node runs a version the store no longer calls current, until a refresh
// (never with --poll 0).
func TestControlCallsLandInTheStoresOrder(t *testing.T) {
	pack := func(t *testing.T, m *abi.Manifest) []byte {
		t.Helper()
		b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, m, nil))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		// later makes the change that lands in the store after the held
		// deploy's, and returns the version the node must then run ("":
		// none, the function is gone).
		later func(t *testing.T, e *engine.Engine, v1 api.FunctionInfo) string
	}{
		{"delete", func(t *testing.T, e *engine.Engine, _ api.FunctionInfo) string {
			if err := e.Control().Delete(context.Background(), "fn", false); err != nil {
				t.Fatal(err)
			}
			return ""
		}},
		{"rollback", func(t *testing.T, e *engine.Engine, v1 api.FunctionInfo) string {
			if _, err := e.Control().Rollback(context.Background(), "fn", v1.Version); err != nil {
				t.Fatal(err)
			}
			return v1.Version
		}},
		{"deploy", func(t *testing.T, e *engine.Engine, _ api.FunctionInfo) string {
			m := testkit.Manifest("fn")
			m.OutBytes = 96
			fi, err := e.Control().Deploy(context.Background(), "fn", bytes.NewReader(pack(t, m)), false)
			if err != nil {
				t.Fatal(err)
			}
			return fi.Version
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := holdStore{Store: fsStore(t), landed: make(chan struct{}), release: make(chan struct{})}
			e := testkit.Engine(t, engine.Config{Store: store})
			m := testkit.Manifest("fn")
			v1 := testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			m.OutBytes = 128 // another bundle: a second version
			held := make(chan error, 1)
			go func() {
				_, err := e.Control().Deploy(context.WithValue(context.Background(), holdKey{}, 1), "fn", bytes.NewReader(pack(t, m)), false)
				held <- err
			}()
			<-store.landed // the held deploy's record is in the store
			want := tc.later(t, e, v1)
			close(store.release)
			if err := <-held; err != nil {
				t.Fatalf("the held deploy: %v", err)
			}
			req := &call.Request{Input: []byte("x")}
			err := e.Invoke(context.Background(), "fn", req)
			t.Logf("after the held deploy ended: version %q, error %v; want version %q", req.Version, err, want)
			switch {
			case want == "" && errdefs.KindOf(err) != errdefs.KindNotFound:
				t.Errorf("the function deleted after the held deploy landed still runs here (%v, version %s)", err, req.Version)
			case want != "" && (err != nil || req.Version != want):
				t.Errorf("node runs %s (%v), want %s: the store's current version", req.Version, err, want)
			}
		})
	}
}

// racingEvictor picks function v's program whenever it is offered, and the
// first time lets race run (a request for v arriving just then) before it
// answers; else what LRU picks.
type racingEvictor struct {
	race func()
}

func (r *racingEvictor) Pick(idle []evict.Idle) int {
	for i, c := range idle {
		if c.Function == "v" && !c.Instance {
			if race := r.race; race != nil {
				r.race = nil
				race()
			}
			return i
		}
	}
	return evict.LRU{}.Pick(idle)
}

// A function offered for eviction as a whole (loaded, no instance, no
// request) that a request takes before the eviction does stays: the
// eviction takes something else. Evicting it anyway counted its constants
// as freed while the request kept them loaded (and ran on a version no
// longer the function's), so the device took more than its memory.
func TestEvictionSparesAFunctionARequestTook(t *testing.T) {
	mv := testkit.Manifest("v")
	mv.Constants = "w.bin"
	per := mv.MaxInputBytes + mv.TmpBytes + mv.OutBytes
	consts := int64(4 * per)
	host := device.NewHost(consts + per + per/2) // v's constants, one instance and a half
	ev := &racingEvictor{}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host}, Evictor: ev})
	testkit.Deploy(t, e, testkit.BundleDir(t, mv, make([]byte, consts)))
	for _, n := range []string{"a", "b"} {
		testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest(n), nil))
	}
	within := func(when string) {
		t.Helper()
		if mi := host.MemInfo(); mi.Used > mi.Total {
			t.Errorf("%s: %d bytes in use on a device of %d", when, mi.Used, mi.Total)
		}
	}
	invoke(t, e, "v", []byte{1})
	invoke(t, e, "a", []byte{1}) // takes v's idle instance: v is loaded with none
	within("after a")
	pinned := make(chan engine.Pin, 1)
	ev.race = func() {
		go func() {
			p, err := e.Pin(context.Background(), "v", time.Time{})
			if err != nil {
				t.Error(err)
			}
			pinned <- p
		}()
		// Pin has returned: it holds v before the eviction takes it.
		pinned <- <-pinned
	}
	invoke(t, e, "b", []byte{1}) // needs a's instance or v's constants
	within("after b")
	p := <-pinned
	defer p.Release()
	if err := p.Invoke(context.Background(), &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	within("after the request that took v")
	if fi := info(t, e, "v"); !fi.Loaded || fi.Idle != 1 {
		t.Errorf("v after its request: loaded %v, %d idle instances; want it loaded, its instance kept", fi.Loaded, fi.Idle)
	}
}

// holdLoads holds the next program load, once it is under way, until
// released: a request's cold start in flight.
type holdLoads struct {
	device.Device
	loading, release chan struct{}
}

func (d *holdLoads) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	if d.loading != nil {
		d.loading <- struct{}{}
		d.loading = nil
		<-d.release
	}
	return d.Device.Load(ctx, spec)
}

// A request of a deleted function that loads its program after the delete
// (its cold start in flight) runs, but leaves no device flow under the
// name: the next function of that name does not start with the deleted
// one's device time (plover ls) and standing with the scheduler.
func TestDeletedFunctionsLateLoadLeavesNoFlow(t *testing.T) {
	d := &holdLoads{Device: device.NewHost(0), loading: make(chan struct{}), release: make(chan struct{})}
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{d}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("fn", 50), nil))
	ran := make(chan error, 1)
	go func() { ran <- e.Invoke(context.Background(), "fn", &call.Request{Input: []byte{1}}) }()
	<-d.loading
	if err := e.Control().Delete(context.Background(), "fn", false); err != nil {
		t.Fatal(err)
	}
	close(d.release)
	if err := <-ran; err != nil {
		t.Fatalf("the request in flight at the delete: %v", err)
	}
	if _, _, ok := e.DeviceFlowShare("fn"); ok {
		t.Error("a device flow for fn after its delete")
	}
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("fn"), nil))
	if fi := info(t, e, "fn"); fi.DeviceSeconds != 0 {
		t.Errorf("fn deployed anew has %.3f device seconds before its first request: the deleted one's", fi.DeviceSeconds)
	}
}

// A transport asking for a function's I/O flow as the function is deleted
// must not leave a flow for the name's next function (its I/O time, and
// the share charged with it): the flow is made only while the function
// still holds its name. Raced many times over; on the old code the flow
// was made after the delete's Forget in some of them.
func TestDeletedFunctionLeavesNoIOFlow(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	for round := range 200 {
		testkit.Deploy(t, e, dir)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					e.IO("fn")
				}
			}
		}()
		if err := e.Control().Delete(context.Background(), "fn", false); err != nil {
			t.Fatal(err)
		}
		close(stop)
		<-done
		if e.HasIOFlow("fn") {
			t.Fatalf("round %d: an I/O flow for fn after its delete", round)
		}
	}
}

// holdDeletes holds a record's delete made with a marked context once it
// is done in the store, until released.
type holdDeletes struct {
	objectstore.Store
	landed, release chan struct{}
}

func (s holdDeletes) Delete(ctx context.Context, key string) error {
	err := s.Store.Delete(ctx, key)
	if err == nil && ctx.Value(holdKey{}) != nil && strings.HasPrefix(key, "functions/") {
		s.landed <- struct{}{}
		<-s.release
	}
	return err
}

// A function deployed after a delete is a new function, whichever of the
// two calls comes back first: when the deploy reaches this node before
// the delete does, it must not take over the deleted function's history
// (its requests, logs, flows), as it did (5 requests carried over), nor
// may the delete then drop it.
func TestDeployAfterADeleteThatLandsLaterStartsAfresh(t *testing.T) {
	store := holdDeletes{Store: fsStore(t), landed: make(chan struct{}), release: make(chan struct{})}
	e := testkit.Engine(t, engine.Config{Store: store})
	dir := testkit.BundleDir(t, testkit.Manifest("fn"), nil)
	testkit.Deploy(t, e, dir)
	for range 5 {
		if err := e.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := make(chan error, 1)
	go func() {
		deleted <- e.Control().Delete(context.WithValue(context.Background(), holdKey{}, 1), "fn", false)
	}()
	select {
	case <-store.landed: // the record is gone from the store; this node still runs fn
	case err := <-deleted:
		t.Fatalf("the delete ended (%v) without deleting the record through the store", err)
	}
	v2 := testkit.Deploy(t, e, dir)
	close(store.release)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	fi := info(t, e, "fn")
	if fi.Version != v2.Version || fi.Requests != 0 {
		t.Fatalf("after the redeploy and the delete: version %s, %d requests; want %s and none: the deleted function's", fi.Version, fi.Requests, v2.Version)
	}
	if err := e.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")}); err != nil {
		t.Fatalf("the function deployed anew: %v", err)
	}
}

// The same when the record is made anew on another node: a node still
// running the deleted function that then takes a deploy (or a rollback)
// of the new record's must start the name afresh, though its own call did
// not make the record (the new function carried the old one's 5 requests,
// for good: a later refresh found its version listed).
func TestDeployOntoARecordMadeAnewElsewhereStartsAfresh(t *testing.T) {
	store := fsStore(t)
	a := testkit.Engine(t, engine.Config{Store: store})
	b := testkit.Engine(t, engine.Config{Store: store})
	m := testkit.Manifest("fn")
	testkit.Deploy(t, b, testkit.BundleDir(t, m, nil))
	for range 5 {
		if err := b.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Control().Delete(context.Background(), "fn", false); err != nil {
		t.Fatal(err)
	}
	first := testkit.Deploy(t, a, testkit.BundleDir(t, m, nil)) // the record made anew, on a
	m.OutBytes = 128
	v := testkit.Deploy(t, b, testkit.BundleDir(t, m, nil)) // onto it, on b: b still runs the deleted fn
	if fi := info(t, b, "fn"); fi.Version != v.Version || fi.Requests != 0 {
		t.Fatalf("b after a's delete and redeploy and its own deploy: version %s, %d requests; want %s and none: the deleted function's", fi.Version, fi.Requests, v.Version)
	}
	// A rollback onto a record made anew elsewhere, the same.
	for range 3 {
		if err := b.Invoke(context.Background(), "fn", &call.Request{Input: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Control().Delete(context.Background(), "fn", false); err != nil {
		t.Fatal(err)
	}
	m.OutBytes = 64
	first = testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	m.OutBytes = 96
	testkit.Deploy(t, a, testkit.BundleDir(t, m, nil))
	if _, err := b.Control().Rollback(context.Background(), "fn", first.Version); err != nil {
		t.Fatal(err)
	}
	if fi := info(t, b, "fn"); fi.Version != first.Version || fi.Requests != 0 {
		t.Fatalf("b after a rollback onto a record made anew: version %s, %d requests; want %s and none", fi.Version, fi.Requests, first.Version)
	}
}
