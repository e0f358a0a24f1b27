package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/plover-run/plover/abi"
)

// Version is set at build time with -ldflags "-X .../cli.Version=...".
var Version = "dev"

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // arguments after the name
	nargs   int    // positional arguments the command takes
	hidden  bool   // not listed: internal to plover (the worker)
	example string
	run     func(fs *flag.FlagSet, args []string, env *Env) error
	flags   func(fs *flag.FlagSet)
}

// Env is the process environment a command runs in.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// StdoutIsTerminal makes invoke refuse to print binary output there.
	StdoutIsTerminal bool
	// StderrIsTerminal enables progress bars.
	StderrIsTerminal bool
	// StdinIsTerminal makes commands that read stdin say so.
	StdinIsTerminal bool
}

// printJSON writes v as indented JSON, for the --json flags.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func commands() []*command {
	return []*command{serveCmd(), initCmd(), buildCmd(), runCmd(), deployCmd(), invokeCmd(), benchCmd(), lsCmd(), rmCmd(), versionsCmd(), rollbackCmd(), gcCmd(), devicesCmd(), tokenCmd(), versionCmd(), workerCmd()}
}

// Main runs the plover command and returns its exit status.
func Main(args []string, env *Env) int {
	cmds := commands()
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		topUsage(env.Stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range cmds {
		if c.name != args[0] {
			continue
		}
		var ue *usageError
		switch err := c.execute(args[1:], env); {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			return 2
		default:
			fmt.Fprintf(env.Stderr, "plover %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(env.Stderr, "plover: unknown command %q\n\n", args[0])
	topUsage(env.Stderr, cmds)
	return 2
}

// usageError is a command line the command cannot run (exit status 2); the
// message and the usage are already on stderr.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// execute parses a command's flags, checks its argument count and runs it.
func (c *command) execute(args []string, env *Env) error {
	fs := flag.NewFlagSet("plover "+c.name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(env.Stderr, "%s\n\nUsage: plover %s %s\n\nFlags:\n", c.summary, c.name, c.usage)
		fs.PrintDefaults()
		if c.example != "" {
			fmt.Fprintf(env.Stderr, "\nExample:\n%s\n", c.example)
		}
	}
	if c.flags != nil {
		c.flags(fs)
	}
	if err := fs.Parse(interleave(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err.Error()}
	}
	if len(fs.Args()) != c.nargs {
		msg := fmt.Sprintf("plover %s: takes %d argument(s), got %d", c.name, c.nargs, len(fs.Args()))
		fmt.Fprintf(env.Stderr, "%s\n\n", msg)
		fs.Usage()
		return &usageError{msg}
	}
	return c.run(fs, fs.Args(), env)
}

// interleave lets flags follow positional arguments ("plover invoke NAME
// --in f"), which the flag package alone does not allow.
func interleave(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil && !isBool(f) && i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(flags, pos...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func topUsage(w io.Writer, cmds []*command) {
	fmt.Fprintln(w, "plover — a serverless runtime for GPU kernel chains")
	fmt.Fprintln(w, "\nUsage: plover <command> [flags]\n\nCommands:")
	for _, c := range cmds {
		if !c.hidden {
			fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintln(w, "\nRun 'plover <command> --help' for a command's flags and an example.")
	fmt.Fprintln(w, "Commands that talk to a server use --server, else $PLOVER_SERVER, else "+DefaultServer+".")
}

func versionCmd() *command {
	var asJSON bool
	return &command{
		name: "version", summary: "print the plover version and ABI version (also plover --version)",
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, `print {"version","abi"} instead`)
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if asJSON {
				return printJSON(env.Stdout, map[string]string{"version": Version, "abi": fmt.Sprintf("%d.%d", abi.Major, abi.Minor)})
			}
			fmt.Fprintf(env.Stdout, "plover %s (ABI %d.%d; loads ABI 1.0 bundles too)\n", Version, abi.Major, abi.Minor)
			return nil
		},
	}
}
