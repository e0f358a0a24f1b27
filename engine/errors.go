// Package engine owns deployed functions on one node: it resolves a function
// to its current version, loads versions onto devices (cold start), keeps a
// warm pool of instances per version and runs requests through them.
package engine

import (
	"errors"
	"strconv"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/loader"
)

// The engine's errors are errdefs', made here with these two.
func errorf(k errdefs.Kind, err error, format string, a ...any) *errdefs.Error {
	return errdefs.New(k, err, format, a...)
}

func unavailable(err error, format string, a ...any) *errdefs.Error {
	return errdefs.Unavailable(err, format, a...)
}

// inBundle names the library in a loader refusal by its file name in the
// bundle: the client should read "kernels.so", not where this node keeps
// its cache.
func inBundle(err error, library string) error {
	var le *loader.Error
	if errors.As(err, &le) {
		le.Path = library
	}
	return err
}

// quoted and plural word lists in messages.
func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
