package sched

import "time"

func init() { RegisterPolicy("fifo", func(time.Duration) Policy { return FIFO{} }) }

// FIFO admits the oldest queued run first, whatever its function's share
// and priority: the order runs came in, with the Scheduler's slots and
// reserve still in force. For comparison with WFQ, and for nodes whose
// functions need no shares.
type FIFO struct{}

// Woke implements Policy.
func (FIFO) Woke(*Flow, time.Time) {}

// Started implements Policy.
func (FIFO) Started(*Flow, time.Time) float64 { return 0 }

// Ended implements Policy.
func (FIFO) Ended(*Flow, time.Duration, float64, time.Time) {}

// Charged implements Policy.
func (FIFO) Charged(*Flow, time.Duration, time.Time) {}

// Reweighed implements Policy.
func (FIFO) Reweighed(*Flow, float64, Class, float64, time.Time) float64 { return 1 }

// Pick implements Policy: the flow whose oldest run is oldest.
func (FIFO) Pick(waiting []*Flow, _ time.Time) int {
	best := 0
	for i, f := range waiting[1:] {
		if f.Oldest().Before(waiting[best].Oldest()) {
			best = i + 1
		}
	}
	return best
}
