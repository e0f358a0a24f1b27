package repository

// Packing a version folder that others than the server write: the bundle
// package opens only regular files, without blocking on a FIFO.

import (
	"bytes"
	"errors"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/errdefs"
)

// isPipeline reports whether dir's manifest is a pipeline's.
func isPipeline(dir string) bool {
	m, err := bundle.ReadManifest(dir)
	return err == nil && m.IsPipeline()
}

// pack packs the version folder dir (as name, unless "") in memory,
// reading only regular files within it (bundle.PackWithin); it stops, KindTooLarge, as
// soon as the bundle passes MaxBundleBytes (a model of some GiB is not
// packed whole to be refused then).
func (r *Repository) pack(dir, name string) ([]byte, string, *abi.Manifest, error) {
	buf := &capped{max: r.cfg.MaxBundleBytes}
	m, err := bundle.RepackWithin(dir, name, buf) // today's rules at the deploy, for bytes the store lacks
	if errors.Is(err, errTooLarge) {
		return nil, "", nil, errdefs.New(errdefs.KindTooLarge, nil, "bundle is larger than %d bytes", buf.max)
	}
	if err != nil {
		return nil, "", nil, err
	}
	b := buf.b.Bytes()
	return b, bundle.Digest(b), m, nil
}

var errTooLarge = errors.New("bundle over the limit")

// capped is a buffer that refuses to grow past max bytes (0: no bound).
type capped struct {
	b   bytes.Buffer
	max int64
}

func (c *capped) Write(p []byte) (int, error) {
	if c.max > 0 && int64(c.b.Len())+int64(len(p)) > c.max {
		return 0, errTooLarge
	}
	return c.b.Write(p)
}
