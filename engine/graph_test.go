package engine_test

import (
	"context"
	"sync"
	"testing"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/internal/testkit"
)

// keySpy is the host device, recording the ChainKey of every run: the
// promise that lets a CUDA device record a chain once and replay it.
type keySpy struct {
	device.Device
	mu   sync.Mutex
	keys []uint64
}

type spyProgram struct {
	device.Program
	spy *keySpy
}

type spyInstance struct {
	device.Instance
	spy *keySpy
}

func (d *keySpy) Load(ctx context.Context, spec device.ProgramSpec) (device.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &spyProgram{Program: p, spy: d}, nil
}

func (p *spyProgram) NewInstance(cfg device.InstanceConfig) (device.Instance, error) {
	i, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &spyInstance{Instance: i, spy: p.spy}, nil
}

func (i *spyInstance) Run(r *device.Run) error {
	i.spy.mu.Lock()
	i.spy.keys = append(i.spy.keys, r.ChainKey)
	i.spy.mu.Unlock()
	return i.Instance.Run(r)
}

// A manifest's "graph": false withholds the replay promise from every run;
// by default manifest-chain runs carry it and override runs do not.
func TestGraphOptOut(t *testing.T) {
	no := false
	tests := []struct {
		name     string
		graph    *bool
		override bool
		wantKey  bool
	}{
		{"default", nil, false, true},
		{"graph false", &no, false, false},
		{"override", nil, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spy := &keySpy{Device: device.NewHost(0)}
			e := testkit.Engine(t, engine.Config{Devices: []device.Device{spy}})
			m := testkit.Manifest("fn")
			m.Graph = tt.graph
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			req := &call.Request{Input: []byte("x")}
			if tt.override {
				req.Override = &call.Override{Chain: m.Chain, OutBytes: -1, TmpBytes: -1}
			}
			if err := e.Invoke(context.Background(), "fn", req); err != nil {
				t.Fatal(err)
			}
			spy.mu.Lock()
			defer spy.mu.Unlock()
			if len(spy.keys) != 1 || (spy.keys[0] != 0) != tt.wantKey {
				t.Fatalf("chain keys %v, want a nonzero key: %v", spy.keys, tt.wantKey)
			}
		})
	}
}
