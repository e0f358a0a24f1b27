// Command plover serves, deploys and invokes GPU kernel-chain functions.
package main

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		StdoutIsTerminal: isTerminal(os.Stdout), StderrIsTerminal: isTerminal(os.Stderr), StdinIsTerminal: isTerminal(os.Stdin)}))
}

// isTerminal asks the terminal driver: /dev/null is a character device but
// no terminal, and binary output may go there.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
