package cli

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/plover-run/plover/device"
)

type pieceDevice struct {
	device.Device
	piece int64
	set   bool
}

func (d *pieceDevice) SetCopyPiece(n int64) { d.piece, d.set = n, true }

// --copy-piece reaches, in bytes, the devices that copy in pieces, which
// with --isolation none run the functions themselves; 0 leaves them as
// they are, and a device without pieces (the host) is passed over. A
// server with none of them says the flag is ignored.
func TestSetCopyPiece(t *testing.T) {
	tests := []struct {
		kib     int
		cuda    bool
		set     bool
		want    int64
		ignored bool
	}{
		{0, true, false, 0, false},
		{256, true, true, 256 << 10, false},
		{256, false, false, 0, true},
		{0, false, false, 0, false},
	}
	for _, tt := range tests {
		d := &pieceDevice{}
		devs := []device.Device{device.NewHost(0)}
		if tt.cuda {
			devs = append(devs, d)
		}
		var logs bytes.Buffer
		setCopyPiece(devs, tt.kib, slog.New(slog.NewTextHandler(&logs, nil)))
		if d.set != tt.set || d.piece != tt.want {
			t.Errorf("--copy-piece %d: set %v, %d bytes; want set %v, %d bytes", tt.kib, d.set, d.piece, tt.set, tt.want)
		}
		if got := strings.Contains(logs.String(), "--copy-piece applies to CUDA devices only"); got != tt.ignored {
			t.Errorf("--copy-piece %d, CUDA %v: said ignored %v, want %v", tt.kib, tt.cuda, got, tt.ignored)
		}
	}
}
