package abi

import (
	"fmt"
	"time"
)

// Batch lets the runtime run several requests of a function as one chain
// (ABI 2.1): their inputs back to back in input, their outputs back to back
// in out, and the count in plover_state_t.items. The bundle must declare it
// can with PLOVER_BATCHED(max_items).
type Batch struct {
	// MaxItems is the most requests one run holds (2..MaxBatchItems, and
	// at most what the bundle's PLOVER_BATCHED declares).
	MaxItems int `json:"max_items"`
	// MaxDelay (a Go duration, "200us"; default 0) is how long a free
	// instance may hold a partial batch for more requests while other runs
	// of the function are in flight. 0: never; a free instance always runs
	// what is queued at once.
	MaxDelay string `json:"max_delay,omitempty"`
	// ItemInputBytes is the size of every request's body: a request of any
	// other size is refused (400).
	ItemInputBytes int64 `json:"item_input_bytes"`
	// ItemOutputBytes is each request's share of out: the response.
	ItemOutputBytes int64 `json:"item_output_bytes"`
}

// OutLenChanged is why a batched run fails when an entry changed out.len:
// the server (and plover run) answer each request its own slice of out.
const OutLenChanged = "an entry changed out.len in a batched run; each request's output is its batch.item_output_bytes slice of out, so leave out.len as it is"

// MaxBatchItems bounds Batch.MaxItems: 1 << MaxBatchItemsLog2.
const (
	MaxBatchItemsLog2 = 12
	MaxBatchItems     = 1 << MaxBatchItemsLog2
)

// SymMaxItems is the symbol PLOVER_BATCHED defines: the most items the
// bundle's kernels handle in one run (a uint32).
const SymMaxItems = "plover_max_items"

// BatchMinor is the ABI minor version that brought batching.
const BatchMinor = 1

// Delay parses MaxDelay (validated: never fails after Validate).
func (b *Batch) Delay() time.Duration {
	d, _ := time.ParseDuration(b.MaxDelay)
	return d
}

func (b *Batch) validate(m *Manifest) error {
	if b == nil {
		return nil
	}
	switch {
	case b.MaxItems < 2 || b.MaxItems > MaxBatchItems:
		return &FieldError{"batch.max_items", fmt.Sprintf("%d must be in 2..%d", b.MaxItems, MaxBatchItems)}
	case b.ItemInputBytes <= 0:
		return &FieldError{"batch.item_input_bytes", fmt.Sprintf("%d must be 1 or more", b.ItemInputBytes)}
	case b.ItemOutputBytes <= 0:
		return &FieldError{"batch.item_output_bytes", fmt.Sprintf("%d must be 1 or more", b.ItemOutputBytes)}
	// By division: a product of a huge item size could overflow to the
	// very buffer size.
	case m.MaxInputBytes%int64(b.MaxItems) != 0 || m.MaxInputBytes/int64(b.MaxItems) != b.ItemInputBytes:
		return &FieldError{"batch.item_input_bytes", fmt.Sprintf("%d × max_items %d must equal max_input_bytes %d (a full batch's input)", b.ItemInputBytes, b.MaxItems, m.MaxInputBytes)}
	case m.OutBytes%int64(b.MaxItems) != 0 || m.OutBytes/int64(b.MaxItems) != b.ItemOutputBytes:
		return &FieldError{"batch.item_output_bytes", fmt.Sprintf("%d × max_items %d must equal out_bytes %d (a full batch's output)", b.ItemOutputBytes, b.MaxItems, m.OutBytes)}
	case m.ABI == 1:
		return &FieldError{"batch", "needs ABI 2.1 or later (\"abi\": 2): ABI 1 bundles have no items field"}
	}
	if b.MaxDelay != "" {
		if d, err := time.ParseDuration(b.MaxDelay); err != nil || d < 0 || d > time.Second {
			return &FieldError{"batch.max_delay", fmt.Sprintf("%q must be a Go duration from 0 to 1s, such as \"200us\"", b.MaxDelay)}
		}
	}
	return nil
}
