package cli

import (
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
// they are, and a device without pieces (the host) is passed over.
func TestSetCopyPiece(t *testing.T) {
	tests := []struct {
		kib  int
		set  bool
		want int64
	}{
		{0, false, 0},
		{256, true, 256 << 10},
	}
	for _, tt := range tests {
		d := &pieceDevice{}
		setCopyPiece([]device.Device{device.NewHost(0), d}, tt.kib)
		if d.set != tt.set || d.piece != tt.want {
			t.Errorf("--copy-piece %d: set %v, %d bytes; want set %v, %d bytes", tt.kib, d.set, d.piece, tt.set, tt.want)
		}
	}
}
