package cli

import (
	"fmt"
	"log/slog"

	"github.com/plover-run/plover/cuda"
)

func openDevices(kind string, limit int64, log *slog.Logger) ([]cuda.Device, error) {
	switch kind {
	case "host", "auto":
		return []cuda.Device{cuda.NewHost(limit)}, nil
	}
	return nil, fmt.Errorf("--device %q: want auto, host or cuda", kind)
}
