package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/runtime"
	"github.com/plover-run/plover/runtime/registry"
)

// progressThreshold: uploads above it show a progress bar on a terminal.
const progressThreshold = 4 << 20

// withProgress wraps r in a progress bar when the upload is large and stderr
// is a terminal.
func withProgress(r io.Reader, size int64, what string, env *Env) (io.Reader, func()) {
	if size < progressThreshold || !env.StderrIsTerminal {
		return r, func() {}
	}
	bar := progressbar.DefaultBytes(size, what)
	pr := progressbar.NewReader(r, bar)
	return &pr, func() { bar.Finish(); fmt.Fprintln(env.Stderr) }
}

func versionsCmd() *command {
	var server, store string
	var s3 objectstore.S3Options
	var asJSON bool
	return &command{
		name: "versions", summary: "list a function's versions (* marks the current one)",
		usage:   "NAME [--server URL | --store URL]",
		example: "  plover versions vecadd",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+")")
			fs.StringVar(&store, "store", "", "read the store directly instead of asking a server (file://... or s3://...)")
			s3Flags(fs, &s3)
			fs.BoolVar(&asJSON, "json", false, "print the record as JSON")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if len(args) != 1 {
				return errUsage
			}
			var rec *registry.Record
			if store != "" {
				reg, err := openRegistry(store, s3)
				if err != nil {
					return err
				}
				if rec, err = reg.Get(context.Background(), args[0]); err != nil {
					return err
				}
			} else {
				rec = &registry.Record{}
				if err := newClient(server).getJSON("/v1/functions/"+args[0]+"/versions", rec); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(env.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rec)
			}
			tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\tVERSION\tSHA256\tBUNDLE\tDEPLOYED")
			for i := len(rec.Versions) - 1; i >= 0; i-- {
				v := rec.Versions[i]
				mark := ""
				if v.ID == rec.Current {
					mark = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, v.ID, v.SHA256[:12], humanBytes(v.Size), v.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

func rollbackCmd() *command {
	var server, store string
	var s3 objectstore.S3Options
	return &command{
		name: "rollback", summary: "make an earlier version of a function current again",
		usage:   "NAME VERSION [--server URL | --store URL]",
		example: "  plover versions vecadd && plover rollback vecadd 9fe7fab9",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+")")
			fs.StringVar(&store, "store", "", "change the record in the store directly; servers pick it up within their --poll interval")
			s3Flags(fs, &s3)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if len(args) != 2 {
				return errUsage
			}
			var id string
			if store != "" {
				reg, err := openRegistry(store, s3)
				if err != nil {
					return err
				}
				v, err := reg.SetCurrent(context.Background(), args[0], args[1])
				if err != nil {
					return err
				}
				id = v.ID
			} else {
				body, _ := json.Marshal(map[string]string{"version": args[1]})
				var fi runtime.FunctionInfo
				if err := newClient(server).sendJSON(http.MethodPost, "/v1/functions/"+args[0]+"/rollback", "application/json", body, &fi); err != nil {
					return err
				}
				id = fi.Version
			}
			fmt.Fprintf(env.Stdout, "%s: current version is now %s\n", args[0], id)
			return nil
		},
	}
}

func gcCmd() *command {
	var server, store string
	var s3 objectstore.S3Options
	var grace time.Duration
	return &command{
		name: "gc", summary: "delete bundles that no function version references",
		usage:   "[--server URL | --store URL] [--grace 1m]",
		example: "  plover gc --grace 0s",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&server, "server", "", "server URL (default $PLOVER_SERVER or "+DefaultServer+")")
			fs.StringVar(&store, "store", "", "collect in the store directly")
			s3Flags(fs, &s3)
			fs.DurationVar(&grace, "grace", time.Minute, "keep unreferenced bundles younger than this (a deploy may be uploading them)")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if len(args) != 0 {
				return errUsage
			}
			var removed []string
			if store != "" {
				reg, err := openRegistry(store, s3)
				if err != nil {
					return err
				}
				if removed, err = reg.GC(context.Background(), grace); err != nil {
					return err
				}
			} else {
				var resp struct{ Removed []string }
				if err := newClient(server).sendJSON(http.MethodPost, "/v1/gc?grace="+grace.String(), "", nil, &resp); err != nil {
					return err
				}
				removed = resp.Removed
			}
			for _, k := range removed {
				fmt.Fprintln(env.Stdout, "removed", k)
			}
			fmt.Fprintf(env.Stdout, "%d bundles removed\n", len(removed))
			return nil
		},
	}
}

func openRegistry(url string, o objectstore.S3Options) (registry.Registry, error) {
	s, err := openStore(context.Background(), url, o)
	if err != nil {
		return registry.Registry{}, err
	}
	return registry.Registry{Store: s}, nil
}
