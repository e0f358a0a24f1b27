package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/plover-run/plover/abi"
)

// Version is set at build time with -ldflags "-X .../cli.Version=...".
var Version = "dev"

// command is one subcommand. Commands declare their flags on a standard
// library FlagSet, which cobra reads through pflag: the declarations stay
// plain, and every command gets --long flags, completion and the
// PLOVER_<FLAG> environment variables the same way.
type command struct {
	name    string
	summary string
	// long follows the summary in the command's help: what a summary
	// line cannot hold, such as exit statuses.
	long  string
	usage string // arguments after the name
	nargs int    // positional arguments the command takes
	// named: the first argument is a function's name, which goes into
	// request paths: refused (exit 2) unless a function can have it.
	named   bool
	hidden  bool // not listed: internal to plover (the worker)
	example string
	run     func(fs *flag.FlagSet, args []string, env *Env) error
	flags   func(fs *flag.FlagSet)
	// shorthands gives flags one-letter forms: {"output": "o"} is -o.
	shorthands map[string]string
	// complete offers values for the positional arguments (function names
	// from the server); nil offers files.
	complete func(fs *flag.FlagSet, args []string, toComplete string) ([]string, cobra.ShellCompDirective)
	// noEnv names flags that read no PLOVER_<FLAG> variable: one that is
	// plover serve's for another meaning (gc's --grace is a bundle's age,
	// serve's the shutdown's), set in the shell for a server.
	noEnv []string
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
	// Getenv reads the environment; nil means os.Getenv. Tests set it so
	// that PLOVER_<FLAG> variables can be checked without touching the
	// process environment.
	Getenv func(string) string
}

func (e *Env) getenv(k string) string {
	if e.Getenv != nil {
		return e.Getenv(k)
	}
	return os.Getenv(k)
}

// printJSON writes v as indented JSON, for the --json flags.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func commands() []*command {
	return []*command{serveCmd(), initCmd(), buildCmd(), runCmd(), deployCmd(), invokeCmd(), benchCmd(), lsCmd(), logsCmd(), rmCmd(), versionsCmd(), rollbackCmd(), gcCmd(), devicesCmd(), tokenCmd(), healthCmd(), versionCmd(), workerCmd()}
}

// Main runs the plover command and returns its exit status: 0, 1 for a
// command that failed, 2 for a command line that cannot run, or the status
// a command's exitError carries (plover health's 3: no answer).
func Main(args []string, env *Env) int {
	root := newRoot(env)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	default:
		// An error may quote what others wrote (a server's message, a
		// bundle's): escaped as a function's output is.
		fmt.Fprintf(env.Stderr, "plover %s: %s\n", cmd.Name(), visibleLines(err.Error()))
		var xe *exitError
		if errors.As(err, &xe) {
			return xe.code
		}
		return 1
	}
}

// usageError is a command line the command cannot run (exit status 2); the
// message and the usage are already on stderr.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

const envNote = `Every flag can also be set in the environment as PLOVER_<FLAG>, upper case
with dashes as underscores (--max-conns as PLOVER_MAX_CONNS, --json as
PLOVER_JSON=true); a flag on the command line wins.`

// newRoot builds the command tree. It is rebuilt per Main call: the
// commands' flag variables live in closures, so a tree is good for one run.
func newRoot(env *Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "plover",
		Short: "a serverless runtime for GPU kernel chains",
		Long: "plover — a serverless runtime for GPU kernel chains.\n\n" +
			"Commands that talk to a server use --server, else $PLOVER_SERVER, else " + DefaultServer + ".\n" + envNote,
		Version:               Version,
		Args:                  cobra.ArbitraryArgs,
		SilenceErrors:         true,
		SilenceUsage:          true,
		DisableFlagsInUseLine: true,
		DisableAutoGenTag:     true,
		// The root runs only when no command matched.
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				cmd.SetOut(env.Stderr)
				cmd.Help()
				return &usageError{"no command"}
			}
			return unknownCommand(env, cmd, args[0])
		},
	}
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	root.SetVersionTemplate(versionLine() + "\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		fmt.Fprintf(env.Stderr, "plover %s: %v%s\n\n", c.Name(), err, flagSuggestion(c, err))
		c.SetOut(env.Stderr)
		c.Usage()
		return &usageError{err.Error()}
	})
	for _, c := range commands() {
		root.AddCommand(c.cobra(env))
	}
	// cobra's help finds the root for a name it does not know (the root
	// takes any arguments), so plover help invok printed the root's help
	// and exited 0: it says what plover invok says.
	root.InitDefaultHelpCmd()
	for _, h := range root.Commands() {
		if h.Name() == "help" && h.Run != nil {
			show := h.Run
			h.RunE = func(c *cobra.Command, args []string) error {
				if found, rest, err := root.Find(args); err == nil && found == root && len(rest) > 0 {
					return unknownCommand(env, root, rest[0])
				}
				show(c, args)
				return nil
			}
		}
	}
	return root
}

// unknownCommand says that name is no command, with the one meant if a typo
// away; a usage error.
func unknownCommand(env *Env, root *cobra.Command, name string) error {
	if s := commandSuggestions(root, name); len(s) > 0 {
		fmt.Fprintf(env.Stderr, "plover: unknown command %q (did you mean \"%s\"?)\n", name, strings.Join(s, `" or "`))
	} else {
		fmt.Fprintf(env.Stderr, "plover: unknown command %q\n", name)
	}
	fmt.Fprintln(env.Stderr, "\nRun 'plover --help' for the commands.")
	return &usageError{"unknown command " + name}
}

// commandSuggestions are the commands a mistyped name may have meant: the
// one within a typo of it (abi.Suggest), else those it begins ("dep":
// deploy).
func commandSuggestions(root *cobra.Command, name string) []string {
	var names []string
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	if s := abi.Suggest(name, names); s != "" {
		return []string{s}
	}
	var prefixed []string
	for _, n := range names {
		if len(name) >= 2 && strings.HasPrefix(n, strings.ToLower(name)) {
			prefixed = append(prefixed, n)
		}
	}
	return prefixed
}

// durationHint follows a bad duration's error, from the command line or
// the environment: the likely slip is its unit.
const durationHint = " (a duration takes a unit: 500ms, 2s, 1m)"

// flagSuggestion is " (did you mean --timing?)" for an unknown flag within
// a typo of one of the command's flags, a hint for a duration without its
// unit, else "".
func flagSuggestion(c *cobra.Command, err error) string {
	var bad *pflag.InvalidValueError
	if errors.As(err, &bad) {
		// A bad value: for a duration, the likely slip is its unit.
		if f := bad.GetFlag(); f != nil && f.Value.Type() == "duration" {
			return durationHint
		}
		return ""
	}
	var unknown *pflag.NotExistError
	if !errors.As(err, &unknown) || unknown.GetSpecifiedShortnames() != "" {
		return "" // not an unknown --long flag
	}
	name := unknown.GetSpecifiedName()
	var names []string
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	if s := abi.Suggest(name, names); s != "" {
		return fmt.Sprintf(" (did you mean --%s?)", s)
	}
	return ""
}

// cobra turns c into a cobra command.
func (c *command) cobra(env *Env) *cobra.Command {
	fs := flag.NewFlagSet("plover "+c.name, flag.ContinueOnError)
	if c.flags != nil {
		c.flags(fs)
	}
	cc := &cobra.Command{
		Use:     strings.TrimSpace(c.name + " " + c.usage),
		Short:   c.summary,
		Long:    strings.TrimSpace(c.summary + "\n\n" + c.long),
		Example: c.example,
		Hidden:  c.hidden,
		// The usage strings already show the flags that matter.
		DisableFlagsInUseLine: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == c.nargs {
				return nil
			}
			msg := fmt.Sprintf("plover %s: takes %d argument(s), got %d", c.name, c.nargs, len(args))
			fmt.Fprintf(env.Stderr, "%s\n\n", msg)
			cmd.SetOut(env.Stderr)
			cmd.Usage()
			return &usageError{msg}
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			// The worker is started by the server with a clean
			// environment and every flag given; it reads no variables.
			if !c.hidden {
				serverGiven := cmd.Flags().Changed("server")
				unread, err := endpointChosen(cmd.Flags())
				if err != nil {
					return usagef(env, c.name, "%v", err)
				}
				if err := flagsFromEnv(cmd.Flags(), env, append(unread, c.noEnv...)...); err != nil {
					fmt.Fprintf(env.Stderr, "plover %s: %v\n", c.name, err)
					return &usageError{err.Error()}
				}
				if f := cmd.Flags().Lookup("server"); f != nil {
					if err := checkServerURL(f.Value.String()); err != nil {
						from := "--server"
						if !serverGiven {
							from = "$PLOVER_SERVER"
						}
						if errors.Is(err, errUserInfo) {
							return usagef(env, c.name, "%s: %v", from, err) // not echoed: it may hold a password
						}
						return usagef(env, c.name, "%s %q: %v", from, f.Value.String(), err)
					}
				}
			}
			if c.named && !abi.ValidName(args[0]) {
				return usagef(env, c.name, "NAME %q: not a function name (names match [a-z0-9][a-z0-9-]{0,62})", args[0])
			}
			return c.run(fs, args, env)
		},
	}
	fs.VisitAll(func(gf *flag.Flag) {
		pf := pflag.PFlagFromGoFlag(gf)
		if pf.Value.Type() == "duration" && pf.DefValue == "0s" {
			// No default to show, as for pflag's own durations: a
			// wrapped one printed "(default 0s)" after a usage that says
			// what 0 means, or its own default (logs --since).
			pf.DefValue = "0"
		}
		if short := c.shorthands[gf.Name]; short != "" {
			pf.Shorthand = short
		}
		cc.Flags().AddFlag(pf)
	})
	if vars := envNames(cc.Flags(), c.noEnv); len(vars) > 0 {
		cc.Long += "\n\nEach flag can also be set in the environment (the command line wins): " + strings.Join(vars, ", ") + "."
		if c.name != "serve" && !c.hidden {
			cc.Long += sharedWithServe(cc.Flags(), c.noEnv)
		}
	}
	if c.complete != nil {
		cc.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			unread, _ := endpointChosen(cmd.Flags())
			flagsFromEnv(cmd.Flags(), env, append(unread, c.noEnv...)...)
			return c.complete(fs, args, toComplete)
		}
	}
	return cc
}

// envName is the variable that stands for a flag: --max-conns is
// PLOVER_MAX_CONNS.
func envName(flag string) string {
	return "PLOVER_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func envNames(fs *pflag.FlagSet, noEnv []string) []string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && !slices.Contains(noEnv, f.Name) {
			names = append(names, envName(f.Name))
		}
	})
	sort.Strings(names)
	return names
}

// sharedWithServe is the help's note on the variables a command shares
// with plover serve: one exported in a shell for a server is read by the
// client commands run there too, and a user reading only this command's
// help would not guess it.
func sharedWithServe(fs *pflag.FlagSet, noEnv []string) string {
	serve := serveFlagSet()
	var vars, flags []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && !slices.Contains(noEnv, f.Name) && serve.Lookup(f.Name) != nil {
			vars, flags = append(vars, envName(f.Name)), append(flags, "--"+f.Name)
		}
	})
	switch len(vars) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf(" %s is plover serve's variable too (its %s): one exported for a server applies here as well; give the flag to choose.", vars[0], flags[0])
	}
	return fmt.Sprintf(" %s are plover serve's variables too (its %s): one exported for a server applies here as well; give the flag to choose.", strings.Join(vars, ", "), strings.Join(flags, ", "))
}

// serveFlagSet is plover serve's flags, declared once for every command's
// help to look up.
var serveFlagSet = sync.OnceValue(func() *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveCmd().flags(fs)
	return fs
})

// flagsFromEnv sets every flag not given on the command line from its
// PLOVER_<FLAG> variable, where that is set and not empty, but for the
// flags named in unread.
func flagsFromEnv(fs *pflag.FlagSet, env *Env, unread ...string) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" || slices.Contains(unread, f.Name) {
			return
		}
		k := envName(f.Name)
		v := env.getenv(k)
		if v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			hint := ""
			if f.Value.Type() == "duration" {
				hint = durationHint
			}
			err = fmt.Errorf("$%s (for --%s): %v%s", k, f.Name, e, hint)
		}
	})
	return err
}

func versionLine() string {
	return fmt.Sprintf("plover %s (ABI %d.%d; loads ABI 1.0 bundles too)", Version, abi.Major, abi.Minor)
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
			fmt.Fprintln(env.Stdout, versionLine())
			return nil
		},
	}
}
