package cli

import (
	"context"
	"flag"

	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/runtime/registry"
)

// endpoint is where a client command acts: a server's API, or with --store
// the object store directly (no server needed).
type endpoint struct {
	server string
	store  string
	s3     objectstore.S3Options
}

// serverFlag registers --server.
func (e *endpoint) serverFlag(fs *flag.FlagSet) {
	fs.StringVar(&e.server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+")")
}

// storeFlags registers --server plus --store and the S3 settings; usage says
// what --store does for this command.
func (e *endpoint) storeFlags(fs *flag.FlagSet, usage string) {
	e.serverFlag(fs)
	fs.StringVar(&e.store, "store", "", usage)
	s3Flags(fs, &e.s3)
}

func (e *endpoint) direct() bool    { return e.store != "" }
func (e *endpoint) client() *client { return newClient(e.server) }

func (e *endpoint) registry() (registry.Registry, error) {
	s, err := openStore(context.Background(), e.store, e.s3)
	if err != nil {
		return registry.Registry{}, err
	}
	return registry.Registry{Store: s}, nil
}
