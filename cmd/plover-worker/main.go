// Command plover-worker is the process a plover server starts per function
// (--isolation process), installed beside the plover binary: the worker
// alone, without the server, the store clients and the CLI, so that it
// starts in about a third of the time (`plover worker` is the same code in
// the full binary, and what the server runs when this one is missing).
// It is not meant to be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/plover-run/plover/worker/inside"
)

func main() {
	// Started as "plover-worker worker FLAGS", the argv of `plover worker`,
	// so that the worker's early containment (worker/contain) sees the
	// same argv[1] whichever binary runs.
	inside.RunIfWorker()
	fmt.Fprintln(os.Stderr, "plover-worker is started by plover serve; it is not meant to be run by hand")
	os.Exit(2)
}
