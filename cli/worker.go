package cli

import (
	"flag"

	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
)

// workerCmd is the process a server starts per function version (with
// --isolation process); it is not meant to be run by hand.
func workerCmd() *command {
	var cfg worker.Config
	var user string
	return &command{
		name: "worker", summary: "internal: serve one function for a plover server", hidden: true,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&cfg.Device, "device", "host", "host | cuda")
			fs.IntVar(&cfg.Ordinal, "ordinal", 0, "CUDA device ordinal")
			fs.StringVar(&cfg.Driver, "driver", "", "CUDA driver library (default libcuda.so.1)")
			fs.Int64Var(&cfg.MemLimit, "memory-limit", 0, "device memory budget in bytes")
			fs.IntVar(&cfg.ParentPID, "parent", 0, "the server's pid")
			fs.StringVar(&user, "user", "", "run as UID:GID")
			fs.BoolVar(&cfg.Landlock, "landlock", false, "restrict the filesystem to the bundle and system libraries")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if user != "" {
				id, err := contain.LookupUser(user)
				if err != nil {
					return err
				}
				cfg.Drop = &id
			}
			return worker.Serve(cfg)
		},
	}
}
