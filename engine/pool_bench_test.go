package engine

import (
	"context"
	"testing"
	"time"
)

// A request's admission to a warm pool with a slot free: take one, give
// it back (the hot path of every request), alone and from every CPU.
func BenchmarkPoolAdmission(b *testing.B) {
	for _, bc := range []struct {
		name     string
		parallel bool
	}{{"alone", false}, {"every CPU", true}} {
		b.Run(bc.name, func(b *testing.B) {
			p := &pool{}
			p.open(nil, 1024, nil, time.Now())
			ctx := context.Background()
			run := func() {
				if _, err := p.acquire(ctx, time.Time{}, nil); err != nil {
					b.Fatal(err)
				}
				p.release()
			}
			if !bc.parallel {
				for b.Loop() {
					run()
				}
				return
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					run()
				}
			})
		})
	}
}
