package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/pipedef"
	"github.com/plover-run/plover/registry"
)

// progressThreshold: uploads above it show a progress bar on a terminal.
const progressThreshold = 4 << 20

// withProgress wraps r in a progress bar when the upload is large and stderr
// is a terminal. What it returns seeks as r does (progressBody says why).
func withProgress(r io.ReadSeeker, size int64, what string, env *Env) (io.ReadSeeker, func()) {
	if size < progressThreshold || !env.StderrIsTerminal {
		return r, func() {}
	}
	// DefaultBytes' look, drawn on env.Stderr (DefaultBytes draws on
	// os.Stderr, past the Env a command is given).
	bar := progressbar.NewOptions64(size,
		progressbar.OptionSetDescription(what),
		progressbar.OptionSetWriter(env.Stderr),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowTotalBytes(true),
		progressbar.OptionSetWidth(10),
		progressbar.OptionThrottle(65*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionOnCompletion(func() { fmt.Fprint(env.Stderr, "\n") }),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionFullWidth(),
		progressbar.OptionSetRenderBlankState(true),
	)
	return &progressBody{r: r, bar: bar, size: size}, func() { bar.Finish(); fmt.Fprintln(env.Stderr) }
}

// progressBody is an upload's body that moves a progress bar as it is
// read, and seeks as the reader it wraps does, because a deploy to a store
// needs that: minio-go retries a PUT (a 503 SlowDown) only with a body it
// can rewind, and a publish whose bundle a concurrent gc took while its
// record was written stores the bundle again only from a body it can read
// again (registry's ensureBundle). progressbar.Reader, which it replaces,
// could only Read: from a terminal, one 503 failed the deploy, and a bundle
// taken meanwhile left a record naming a missing object.
//
// The bar shows how far reading has got: a seek back (a retry, a second
// upload) takes it back at the next Read. A seek alone moves nothing,
// as the store seeks to the end and back to check the size before reading.
//
// It has no ReadAt, deliberately: minio-go would then read the single PUT
// through ReadAt and upload a bundle over 16 MiB in parallel parts read
// with ReadAt, each retried part read again, and a bar fed from those
// reads would jump about and overcount. Without it the PUT reads in turn
// and retries by Seek, and the parts of a large bundle are read one after
// another into buffers that minio-go sends again on a retry.
type progressBody struct {
	r    io.ReadSeeker
	bar  *progressbar.ProgressBar
	size int64
	pos  int64 // the offset in r: where the next Read starts
}

func (p *progressBody) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.pos += int64(n)
	if n > 0 {
		p.show()
	}
	return n, err
}

func (p *progressBody) Seek(offset int64, whence int) (int64, error) {
	pos, err := p.r.Seek(offset, whence)
	if err == nil {
		p.pos = pos
	}
	return pos, err
}

// show sets the bar to pos. A bar that reached its end stays there
// whatever is added (progressbar's rule), so one read to the end before
// a seek back starts over.
func (p *progressBody) show() {
	v := min(p.pos, p.size)
	if v < p.bar.State().CurrentNum && p.bar.IsFinished() {
		p.bar.Reset()
	}
	p.bar.Set64(v)
}

func versionsCmd() *command {
	var ep endpoint
	var asJSON bool
	return &command{
		nargs: 1,
		named: true,
		name:  "versions", summary: "list a function's versions (* marks the current one)",
		complete: ep.completeFunctions,
		usage:    "NAME [--server URL | --store URL]",
		long:     storeNote,
		example:  "  plover versions vecadd",
		flags: func(fs *flag.FlagSet) {
			ep.storeFlags(fs, "read the store directly instead of asking a server (file://... or s3://...)")
			fs.BoolVar(&asJSON, "json", false, "print the record as JSON")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			var rec *api.Record
			if ep.direct() {
				reg, err := ep.registry()
				if err != nil {
					return err
				}
				if rec, err = reg.Get(context.Background(), args[0]); err != nil {
					return err
				}
			} else {
				rec = &api.Record{}
				if err := ep.client().getJSON("/v1/functions/"+args[0]+"/versions", rec); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(env.Stdout, rec)
			}
			return writeVersions(env.Stdout, rec)
		},
	}
}

// writeVersions is plover versions' table, newest first. A LABEL column
// only for a model repository's functions (their version folders), a
// TENANT column only where a token deployed a version (its name: whose
// worker runs it under --worker-scope tenant): plover deploy's without an
// auth file read as they always have.
func writeVersions(w io.Writer, rec *api.Record) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	labels := slices.ContainsFunc(rec.Versions, func(v api.Version) bool { return v.Label != "" })
	tenants := slices.ContainsFunc(rec.Versions, func(v api.Version) bool { return v.Tenant != "" })
	head := "\tVERSION\tSHA256\tBUNDLE\tDEPLOYED"
	if labels {
		head += "\tLABEL"
	}
	if tenants {
		head += "\tTENANT"
	}
	fmt.Fprintln(tw, head)
	for i := len(rec.Versions) - 1; i >= 0; i-- {
		v := rec.Versions[i]
		mark := ""
		if v.ID == rec.Current {
			mark = "*"
		}
		// A record is the store's word: one written by hand or by another
		// tool may hold a digest of any length, printed as it is.
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", mark, v.ID, v.SHA256[:min(12, len(v.SHA256))], humanBytes(v.Size), v.Created.Local().Format(time.DateTime))
		if labels {
			line += "\t" + v.Label
		}
		if tenants {
			line += "\t" + v.Tenant
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func rollbackCmd() *command {
	var ep endpoint
	var asJSON bool
	return &command{
		nargs: 2,
		named: true,
		name:  "rollback", summary: "make an earlier version of a function current again",
		complete: ep.completeFunctions,
		usage:    "NAME VERSION [--server URL | --store URL]",
		long:     storeNote,
		example:  "  plover versions vecadd && plover rollback vecadd 9fe7fab9",
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, `print {"name","version"} instead`)
			ep.storeFlags(fs, "change the record in the store directly; servers pick it up within their --poll interval")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			var id string
			var warnings []string
			if ep.direct() {
				reg, err := ep.registry()
				if err != nil {
					return err
				}
				// A pipeline's version is checked as a server checks it,
				// and the version checked is the one made current (a label
				// resolved again could name one deployed since).
				ref := args[1]
				if ref == "" {
					return fmt.Errorf("rollback %s: give a version id, a prefix of 8 or more characters, or a label (plover versions %s)", args[0], args[0])
				}
				rec, err := reg.Get(context.Background(), args[0])
				if err != nil && !errors.Is(err, registry.ErrNoFunction) {
					// Fail closed, as a server does: unchecked, a
					// rollback could make current a pipeline that breaks.
					return fmt.Errorf("rollback %s: reading its record: %w", args[0], err)
				}
				if err == nil {
					// No such version, or an ambiguous prefix: SetCurrent's
					// to refuse in its own words.
					if pv, err := pipedef.Pick(rec, args[1]); err == nil {
						if pv.IsPipeline() {
							if err := checkSteps(reg, args[0], pv.Steps); err != nil {
								return err
							}
							// Never a refusal: nothing blocks a rollback.
							w, _ := checkUsers(reg, "rollback", args[0], pv.Steps, true)
							if w != "" {
								warnings = append(warnings, w)
							}
						}
						ref = pv.ID
					}
				}
				v, _, err := reg.SetCurrent(context.Background(), args[0], ref)
				if err != nil {
					return err
				}
				id = v.ID
			} else {
				body, _ := json.Marshal(map[string]string{"version": args[1]})
				var fi api.FunctionInfo
				if err := ep.client().sendJSON(http.MethodPost, "/v1/functions/"+args[0]+"/rollback", "application/json", body, &fi); err != nil {
					return err
				}
				id, warnings = fi.Version, fi.Warnings
			}
			printWarnings(env.Stderr, warnings)
			if asJSON {
				return printJSON(env.Stdout, map[string]string{"name": args[0], "version": id})
			}
			in := ""
			if ep.direct() {
				in = " in store " + ep.store
			}
			fmt.Fprintf(env.Stdout, "%s: current version is now %s%s\n", args[0], id, in)
			return nil
		},
	}
}

func gcCmd() *command {
	var ep endpoint
	var grace time.Duration
	var asJSON bool
	return &command{
		nargs: 0,
		name:  "gc", summary: "delete bundles that no function version references",
		usage:   "[--server URL | --store URL] [--grace 1m]",
		long:    storeNote,
		example: "  plover gc --grace 0s",
		// $PLOVER_GRACE is plover serve's shutdown grace (10s by default):
		// exported for a server, it cut gc's grace to that, and a bundle
		// stored by a deploy not yet recorded could go.
		noEnv: []string{"grace"},
		flags: func(fs *flag.FlagSet) {
			ep.storeFlags(fs, "collect in the store directly")
			fs.DurationVar(&grace, "grace", time.Minute, "keep unreferenced bundles younger than this (a deploy may be uploading them); not read from $PLOVER_GRACE, which is plover serve's shutdown grace")
			fs.BoolVar(&asJSON, "json", false, `print {"removed": [...]} instead`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if grace < 0 {
				// A store's gc took it as no grace at all, deleting what
				// deploys were uploading; a server refused it without
				// naming the flag.
				return usagef(env, "gc", "--grace %v: want 0 or a positive duration", grace)
			}
			var removed []string
			if ep.direct() {
				reg, err := ep.registry()
				if err != nil {
					return err
				}
				if removed, err = reg.GC(context.Background(), grace); err != nil {
					return err
				}
			} else {
				var resp struct{ Removed []string }
				if err := ep.client().sendJSON(http.MethodPost, "/v1/gc?grace="+grace.String(), "", nil, &resp); err != nil {
					return err
				}
				removed = resp.Removed
			}
			if asJSON {
				if removed == nil {
					removed = []string{}
				}
				return printJSON(env.Stdout, map[string]any{"removed": removed})
			}
			for _, k := range removed {
				fmt.Fprintln(env.Stdout, "removed", k)
			}
			from := ""
			if ep.direct() {
				from = " from store " + ep.store
			}
			fmt.Fprintf(env.Stdout, "%d bundles removed%s\n", len(removed), from)
			return nil
		},
	}
}
