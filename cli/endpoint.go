package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// endpoint is where a client command acts: a server's API, or with --store
// the object store directly (no server needed).
type endpoint struct {
	server string
	token  string
	cacert string
	store  string
	s3     objectstore.S3Options
}

// serverFlag registers --server.
func (e *endpoint) serverFlag(fs *flag.FlagSet) {
	fs.StringVar(&e.server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+"); https:// for a server with --tls-cert")
	fs.StringVar(&e.token, "token", "", "bearer token for a server with --auth-file (default $PLOVER_TOKEN; prefer the variable: flags show in ps)")
	fs.StringVar(&e.cacert, "cacert", "", "PEM file of CA certificates to trust for https, besides the system's (default $PLOVER_CACERT)")
}

// storeFlags registers --server plus --store and the S3 settings; usage says
// what --store does for this command.
func (e *endpoint) storeFlags(fs *flag.FlagSet, usage string) {
	e.serverFlag(fs)
	fs.StringVar(&e.store, "store", "", usage)
	s3Flags(fs, &e.s3)
}

func (e *endpoint) direct() bool { return e.store != "" }

// storeNote is the help of the commands that act on a server or a store:
// which one they use when the command line and the environment differ.
const storeNote = `Where it acts: the server (--server, else $PLOVER_SERVER, else ` + DefaultServer + `),
or with --store the object store itself. A flag on the command line beats the
other's variable: --server wins over $PLOVER_STORE, --store over
$PLOVER_SERVER; both flags together are refused (exit 2). An empty one
(--server=, --store=) overrides only its own variable. With neither flag,
$PLOVER_STORE wins over $PLOVER_SERVER. A command that acts on a store says
which.`

// endpointChosen, for a command that takes both --server and --store,
// names the flag whose variable is not read: a --server on the command
// line would otherwise be overridden by a $PLOVER_STORE exported for plover
// serve, and the server named never saw the deploy. Both flags given is a
// command line that cannot run: which was meant is not for plover to guess.
func endpointChosen(fs *pflag.FlagSet) (unread []string, err error) {
	server, store := fs.Lookup("server"), fs.Lookup("store")
	if server == nil || store == nil {
		return nil, nil
	}
	// An empty flag (--store=, --server=) overrides its own variable but
	// names no place to act on, so it leaves the other's variable read:
	// an empty --server= that blocked $PLOVER_STORE (and was refused beside
	// --store) while an empty --store= did neither read as two rules.
	serverGiven := server.Changed && server.Value.String() != ""
	storeGiven := store.Changed && store.Value.String() != ""
	switch {
	case serverGiven && storeGiven:
		return nil, errors.New("--server and --store both given: a command acts on one of them (--server: the server's API; --store: the store directly)")
	case serverGiven:
		return []string{"store"}, nil
	case storeGiven:
		return []string{"server"}, nil
	}
	return nil, nil
}
func (e *endpoint) client() *client {
	return newClient(e.server, e.token, e.cacert)
}

func (e *endpoint) registry() (registry.Registry, error) {
	s, err := openStore(context.Background(), e.store, e.s3)
	if err != nil {
		return registry.Registry{}, err
	}
	// The cache keeps the records a gc or rm reads again under its marks
	// to those changed since (by ETag): read whole each time, hundreds of
	// records on S3 took longer than a delete's bound, and nothing went.
	return registry.Registry{Store: s, Cache: registry.NewCache()}, nil
}

// tlsConfig is the client TLS configuration: the system roots plus the CA
// certificates in cacert (a PEM file), if any.
func tlsConfig(cacert string) (*tls.Config, error) {
	if cacert == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--cacert %s: no PEM certificate in it", cacert)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// completeFunctions offers the server's function names for a command's
// first argument. Completion must never hang a shell, so the server gets
// two seconds, and any failure just offers nothing.
func (e *endpoint) completeFunctions(_ *flag.FlagSet, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 || e.direct() {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c := e.client()
	c.http.Timeout = 2 * time.Second
	all, err := c.functionNames()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for _, n := range all {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
