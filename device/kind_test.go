package device

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
)

// A kind names a target package abi has registered, opens its devices, and
// is the only kind of its target: anything else is refused at init. An
// unknown kind's error names the registered ones.
func TestRegisterRefusesAndUnknownKinds(t *testing.T) {
	open := func(string, int64, *slog.Logger) ([]Device, error) { return nil, nil }
	openOne := func(int, int64, string, *slog.Logger) (Device, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		k    Kind
	}{
		{"a target abi does not know", Kind{Target: "tpu", Open: open, OpenOne: openOne}},
		{"no Open", Kind{Target: abi.TargetHost, OpenOne: openOne}},
		{"no OpenOne", Kind{Target: abi.TargetHost, Open: open}},
		{"a second kind of the host", Kind{Target: abi.TargetHost, Open: open, OpenOne: openOne}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			Register(tc.k)
		})
	}
	for _, tc := range []struct {
		name string
		open func() error
		want string
	}{
		{"Open", func() error { _, err := Open("tpu", 0, nil); return err }, `device kind "tpu": want auto, cuda, host`},
		{"OpenOne", func() error { _, err := OpenOne("tpu", 0, 0, "", nil); return err }, `device kind "tpu": want one of cuda, host`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.open(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s(tpu): %v, want %q", tc.name, err, tc.want)
			}
		})
	}
}
