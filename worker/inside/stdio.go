package inside

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#include <stdio.h>

// C's stdout on a pipe is fully buffered: a bundle's printf would reach the
// server in 4 KiB blocks, late, and what a crash left in the buffer would
// be lost. Line-buffered, each line is written as it ends (a kernel's
// printf on the host device shows line by line); stderr is unbuffered
// already, and C++'s streams write through stdio.
static void plover_line_buffered(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IONBF, 0);
}
*/
import "C"

// lineBuffered makes C's stdout line-buffered. It must come before anything
// writes to stdout: a worker calls it first thing.
func lineBuffered() { C.plover_line_buffered() }
