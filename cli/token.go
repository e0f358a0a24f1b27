package cli

import (
	"flag"
	"fmt"
	"reflect"
	"strings"

	"github.com/plover-run/plover/auth"
)

func tokenCmd() *command {
	var scopes, functions, limits string
	var asJSON bool
	return &command{
		nargs: 2,
		name:  "token", summary: "make a bearer token and the auth-file line that grants it",
		usage: "new NAME --scopes SCOPE[,SCOPE...] [--functions GLOB[,GLOB...]] [--limits rate=R,burst=B,concurrency=C]",
		example: "  plover token new ops --scopes admin\n" +
			"  TOKEN=$(plover token new ci --scopes invoke,read --functions 'cnn,vec*')   # the auth-file line goes to stderr (2>>auth appends it, its notes as comments)\n" +
			"  plover token new tenant-a --scopes invoke --limits rate=100,burst=200,concurrency=16",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&scopes, "scopes", "", "what the token may do, comma-separated: read, invoke, deploy (implies read), admin (required)")
			fs.BoolVar(&asJSON, "json", false, `print {"name","token","line"} to stdout, the auth-file line included`)
			fs.StringVar(&functions, "functions", "*", "path.Match globs, comma-separated, limiting the functions the token may invoke and deploy")
			fs.StringVar(&limits, "limits", "", "bounds on the token's requests: rate (per second), burst, concurrency (in flight), e.g. rate=100,burst=200,concurrency=16; past them 429 with Retry-After")
		},
		run: func(_ *flag.FlagSet, args []string, env *Env) error {
			if args[0] != "new" {
				return usagef(env, "token", "unknown subcommand %q: want plover token new NAME --scopes ...", args[0])
			}
			name := args[1]
			if err := auth.CheckName(name); err != nil {
				return usagef(env, "token", "NAME: %v", err)
			}
			if scopes == "" {
				return usagef(env, "token", "--scopes is required (read, invoke, deploy, admin)")
			}
			sc, err := auth.ParseScopes(scopes)
			if err != nil {
				return usagef(env, "token", "--scopes: %v", err)
			}
			globs, err := auth.ParseFunctions(functions)
			if err == nil {
				err = auth.CheckGrant(sc, globs)
			}
			if err != nil {
				return usagef(env, "token", "--functions: %v", err)
			}
			var lim auth.Limits
			if limits != "" {
				if lim, err = auth.ParseLimits(limits); err != nil {
					return usagef(env, "token", "--limits: %v", err)
				}
			}
			tok, err := auth.NewToken()
			if err != nil {
				return err
			}
			line := auth.Line(name, sc, auth.Hash(tok), globs, lim)
			// The line must mean what was asked for when a server reads it.
			tab, err := auth.Parse(strings.NewReader(line+"\n"), "line")
			if err != nil {
				return fmt.Errorf("internal error: the auth-file line does not parse: %v", err)
			}
			if p := tab.Lookup([]byte(tok)); p == nil || p.Name != name || p.Scopes != sc || !reflect.DeepEqual(p.Functions, globs) || p.Limits != lim {
				return fmt.Errorf("internal error: the auth-file line %q does not grant what was asked", line)
			}
			if asJSON {
				return printJSON(env.Stdout, map[string]string{"name": name, "token": tok, "line": line})
			}
			// The token alone on stdout, so that TOKEN=$(plover token new ...) captures it.
			if _, err := fmt.Fprintln(env.Stdout, tok); err != nil {
				return err
			}
			// The prose as the auth file's comments, so that stderr as a
			// whole may be appended to the file (2>>auth), as the help shows.
			fmt.Fprintf(env.Stderr, "# Append this line to the server's auth file, then send the server SIGHUP (or restart it):\n%s\n", line)
			fmt.Fprintln(env.Stderr, "# The token is not stored anywhere (the file holds only its SHA-256): keep it now, it cannot be shown again.")
			return nil
		},
	}
}
