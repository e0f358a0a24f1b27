package testkit

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/plover-run/plover/objectstore"
)

// SlowRecords is a store whose function records take at least Delay to
// read, as a distant store's do on a node's first request for a name.
type SlowRecords struct {
	objectstore.Store
	Delay time.Duration
}

// GetTagged waits Delay (or the context) before reading a function's record.
func (s SlowRecords) GetTagged(ctx context.Context, key string) (io.ReadCloser, objectstore.Info, error) {
	if strings.HasPrefix(key, "functions/") {
		t := time.NewTimer(s.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, objectstore.Info{}, ctx.Err()
		}
	}
	return s.Store.GetTagged(ctx, key)
}
