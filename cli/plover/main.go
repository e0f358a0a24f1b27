// Command plover serves, deploys and invokes GPU kernel-chain functions.
package main

import (
	"os"

	"github.com/plover-run/plover/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdoutIsTerminal: isTerminal(os.Stdout), StderrIsTerminal: isTerminal(os.Stderr)}))
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
