package cli

import (
	"flag"

	"github.com/plover-run/plover/worker/inside"
)

// workerCmd is the process a server starts per function version (with
// --isolation process); it is not meant to be run by hand.
func workerCmd() *command {
	var cfg inside.Config
	var resolve func() error
	return &command{
		name: "worker", summary: "internal: serve one function for a plover server", hidden: true,
		flags: func(fs *flag.FlagSet) { resolve = inside.BindFlags(fs, &cfg) },
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if err := resolve(); err != nil {
				return err
			}
			return inside.Serve(cfg)
		},
	}
}
