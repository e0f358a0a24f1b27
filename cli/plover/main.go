// Command plover serves, deploys and invokes GPU kernel-chain functions.
package main

import (
	"os"

	"github.com/plover-run/plover/cli"
)

func main() {
	fi, err := os.Stdout.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0
	os.Exit(cli.Main(os.Args[1:], &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, StdoutIsTerminal: tty}))
}
