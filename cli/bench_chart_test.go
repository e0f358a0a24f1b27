package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/plover-run/plover/internal/tmpfs"
)

// A chart that cannot be written whole (the disk full) leaves the file as
// it was: it was truncated and written in place, and a new chart larger
// than the old on a full disk left part of it, the old one lost.
func TestChartOnAFullDiskLeavesTheOldOne(t *testing.T) {
	dir := t.TempDir()
	tmpfs.Mount(t, dir, "64k")
	path := filepath.Join(dir, "lat.svg")
	old := "<svg>" + strings.Repeat("o", 8<<10) + "</svg>"
	c, err := openChart(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.write(old); err != nil {
		t.Fatal(err)
	}
	// The rest of the disk filled, but for a page or so.
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := fill.Write(make([]byte, 4096)); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	fill.Close()
	c, err = openChart(path)
	if err != nil {
		t.Fatal(err)
	}
	err = c.write("<svg>" + strings.Repeat("n", 32<<10) + "</svg>")
	c.discard()
	t.Logf("the larger chart: %v", err)
	if err == nil || !strings.Contains(err.Error(), path+" left as it was") {
		t.Errorf("write: %v; want ENOSPC saying %s is left as it was", err, path)
	}
	if b, _ := os.ReadFile(path); string(b) != old {
		t.Errorf("the chart holds %d bytes, %.20q...; want the old one whole (%d bytes)", len(b), b, len(old))
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "lat.svg" && e.Name() != "fill" {
			t.Errorf("%s left beside it", e.Name())
		}
	}
}
