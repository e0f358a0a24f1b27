package runtime_test

import (
	"context"
	"sync"
	"testing"

	"github.com/plover-run/plover/cuda"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/runtime"
)

// keySpy is the host device, recording the ChainKey of every run: the
// promise that lets a CUDA device record a chain once and replay it.
type keySpy struct {
	cuda.Device
	mu   sync.Mutex
	keys []uint64
}

type spyProgram struct {
	cuda.Program
	spy *keySpy
}

type spyInstance struct {
	cuda.Instance
	spy *keySpy
}

func (d *keySpy) Load(ctx context.Context, spec cuda.ProgramSpec) (cuda.Program, error) {
	p, err := d.Device.Load(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &spyProgram{Program: p, spy: d}, nil
}

func (p *spyProgram) NewInstance(cfg cuda.InstanceConfig) (cuda.Instance, error) {
	i, err := p.Program.NewInstance(cfg)
	if err != nil {
		return nil, err
	}
	return &spyInstance{Instance: i, spy: p.spy}, nil
}

func (i *spyInstance) Run(r *cuda.Run) error {
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
			spy := &keySpy{Device: cuda.NewHost(0)}
			e := testkit.Engine(t, runtime.Config{Devices: []cuda.Device{spy}})
			m := testkit.Manifest("fn")
			m.Graph = tt.graph
			testkit.Deploy(t, e, testkit.BundleDir(t, m, nil))
			req := &runtime.Request{Input: []byte("x")}
			if tt.override {
				req.Override = &runtime.Override{Chain: m.Chain, OutBytes: -1, TmpBytes: -1}
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
