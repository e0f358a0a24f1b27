//go:build cgo

package contain

import "github.com/plover-run/plover/worker/contain/internal/cthread"

// With cgo the tests also probe from a thread that C code created, as
// the CUDA driver or a tenant's thread pool would.
func init() {
	startCThread = cthread.Start
	openOnCThread = cthread.Open
}
