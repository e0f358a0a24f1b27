package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// namedHost is a host device with a name of its own (two host devices
// are otherwise named alike) that holds its first program load, once
// armed, until released.
type namedHost struct {
	device.Device
	name             string
	mu               sync.Mutex
	loading, release chan struct{}
	// The next memWait MemInfo calls wait for memRelease, memAll closed
	// once they all came (gateMem).
	memWait            int
	memAll, memRelease chan struct{}
}

// gateMem arms the next n MemInfo calls to wait until release is closed;
// all is closed once the n are waiting.
func (d *namedHost) gateMem(n int) (all, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.memWait, d.memAll, d.memRelease = n, make(chan struct{}), make(chan struct{})
	return d.memAll, d.memRelease
}

func (d *namedHost) MemInfo() device.MemInfo {
	d.mu.Lock()
	if d.memWait == 0 {
		d.mu.Unlock()
		return d.Device.MemInfo()
	}
	d.memWait--
	last, all, release := d.memWait == 0, d.memAll, d.memRelease
	d.mu.Unlock()
	if last {
		close(all)
	}
	<-release
	return d.Device.MemInfo()
}

func newNamedHost(name string, limit int64) *namedHost {
	return &namedHost{Device: device.NewHost(limit), name: name}
}

func (d *namedHost) Name() string { return d.name }

// hold arms the next load to wait for release, and returns the channel
// closed once it is waiting.
func (d *namedHost) hold() (loading, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.loading, d.release = make(chan struct{}), make(chan struct{})
	return d.loading, d.release
}

func (d *namedHost) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	d.mu.Lock()
	in, out := d.loading, d.release
	d.loading, d.release = nil, nil
	d.mu.Unlock()
	if in != nil {
		close(in)
		<-out
	}
	return d.Device.Load(ctx, spec)
}

// Two cold starts at once go to two devices when one device has room for
// one of them only: the device picked is the one with the most free memory
// less what loads under way reserved there. Before, both went to the
// device with the most raw free memory, and the second got a 503 ("needs
// ... on host0") while host1 had room for it (review G, MEDIUM 1).
func TestPickCountsLoadsUnderWay(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host0, host1 := newNamedHost("host0", per+per/2), newNamedHost("host1", per+per/4)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host0, host1}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("c"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("d"), nil))
	loading, release := host0.hold()
	c := make(chan error, 1)
	go func() { c <- e.Invoke(context.Background(), "c", &call.Request{Input: []byte{1}}) }()
	<-loading // c's room reserved on host0, its load under way
	err := e.Invoke(context.Background(), "d", &call.Request{Input: []byte{1}})
	close(release)
	if err != nil {
		t.Fatalf("d, with host1 empty, while c loads on host0: %v", err)
	}
	if err := <-c; err != nil {
		t.Fatal(err)
	}
}

// A device that refuses the reservation (too little free and nothing idle
// to evict there) is not the answer while another device can make the
// room by evicting: the next is tried. Before, the device with the most
// free memory was the only one tried, and the request got a 503 (review
// G, MEDIUM 1).
func TestRefusedReservationTriesTheNextDevice(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host0, host1 := newNamedHost("host0", 2*per+per/2), newNamedHost("host1", 2*per)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host0, host1}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("a", 1000), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("q"), nil))
	mb := testkit.Manifest("b")
	mb.MaxInputBytes += per // b's instance is two of the others'
	testkit.Deploy(t, e, testkit.BundleDir(t, mb, nil))
	a := make(chan error, 1)
	go func() { a <- e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}) }()
	testkit.WaitFor(t, e, "a", "its run", testkit.Busy(1, 0)) // on host0, the larger
	invoke(t, e, "q", []byte{1})                              // on host1, now the freer; idle after
	// host0: 1.5 instances free, a's busy; host1: 1 free, q's idle. b
	// needs 2: host0 first, which cannot make them; host1 can, evicting q.
	if err := e.Invoke(context.Background(), "b", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatalf("b, which host1 has room for once q's idle instance goes: %v", err)
	}
	if fi := info(t, e, "q"); fi.Idle != 0 {
		t.Errorf("q has %d idle instances: b's room on host1 was not made by evicting it", fi.Idle)
	}
	if err := <-a; err != nil {
		t.Fatal(err)
	}
}

// When no device has the room, the 503 names what each needed.
func TestNoRoomOnAnyDeviceNamesEach(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host0, host1 := newNamedHost("host0", per+per/2), newNamedHost("host1", per+per/4)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host0, host1}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Slow("a", 500), nil))
	mb := testkit.Manifest("b")
	mb.MaxInputBytes -= per / 8
	testkit.Deploy(t, e, testkit.BundleDir(t, mb, nil))
	a := make(chan error, 2)
	for range 2 {
		go func() { a <- e.Invoke(context.Background(), "a", &call.Request{Input: []byte{1}}) }()
	}
	testkit.WaitFor(t, e, "a", "its runs", testkit.Busy(2, 0)) // one on each device
	err := e.Invoke(context.Background(), "b", &call.Request{Input: []byte{1}})
	if err == nil || !strings.Contains(err.Error(), "host0") || !strings.Contains(err.Error(), "host1") {
		t.Errorf("b with both devices busy: %v; want a 503 naming host0 and host1", err)
	}
	for range 2 {
		if err := <-a; err != nil {
			t.Fatal(err)
		}
	}
}

// instanceBytesOf is what one instance of m holds on its device.
func instanceBytesOf(m *abi.Manifest) int64 { return m.MaxInputBytes + m.TmpBytes + m.OutBytes }

// A second instance goes where its function's program is loaded and has
// room for the instance alone, before a device with more room where the
// program would load again: ranked by room alone, the instance went to
// the roomier device, which took a second copy of the constants (and, on
// a fuller node, evicted others for it; helper-369's review).
func TestAnInstanceGoesWhereItsProgramIs(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host0, host1 := newNamedHost("host0", 6*per), newNamedHost("host1", 7*per)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host0, host1}})
	m := testkit.Slow("f", 1500)
	m.Constants = "w.bin"
	testkit.Deploy(t, e, testkit.BundleDir(t, m, make([]byte, 4*per)))
	first := make(chan error, 1)
	go func() { first <- e.Invoke(context.Background(), "f", &call.Request{Input: []byte{1}}) }()
	waitBusy(t, e, "f", 1) // on host1, the roomier then: 2 instances' room left there
	free0 := host0.MemInfo().Free
	if err := e.Invoke(context.Background(), "f", &call.Request{Input: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := host0.MemInfo().Free; got != free0 {
		t.Fatalf("host0 free %d after the second instance, %d before: it loaded the program again there, beside host1 where it was loaded with room for the instance", got, free0)
	}
}

// Two cold starts that read the same room at once, both ranking host0
// first where it had room for one of them: the second evicted an idle
// instance there, though host1 had room for it without evicting. Now a
// device is taken for eviction only once no device has the room as it
// is (helper-370's LOW).
func TestNoEvictionBesideADeviceWithRoom(t *testing.T) {
	per := instanceBytesOf(testkit.Manifest("x"))
	host0, host1 := newNamedHost("host0", 2*per+per/2), newNamedHost("host1", per+per/5)
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{host0, host1}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("g"), nil))
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("f"), nil))
	invoke(t, e, "g", []byte{1}) // on host0, the roomier; idle there after
	// Both of f's picks read host0's room (1.5 instances) before either
	// reserves: they wait in their reading of host1's.
	all, release := host1.gateMem(2)
	f := make(chan error, 2)
	for range 2 {
		go func() { f <- e.Invoke(context.Background(), "f", &call.Request{Input: []byte{1}}) }()
	}
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("f's two cold starts did not both read host1's memory within 10 s")
	}
	close(release)
	for range 2 {
		if err := <-f; err != nil {
			t.Fatal(err)
		}
	}
	if fi := info(t, e, "g"); fi.Idle != 1 {
		t.Errorf("g has %d idle instances: its one on host0 was evicted while host1 had room for f's second", fi.Idle)
	}
}
