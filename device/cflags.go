package device

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#cgo CFLAGS: -O2 -I${SRCDIR}/../abi
#include "host_run.h"
*/
import "C"

// zeroFlags is what r asks zeroed before its chain, for the C runners.
func zeroFlags(r *Run) C.int {
	var z C.int
	if r.ZeroTmp {
		z |= C.PLOVER_ZERO_TMP
	}
	if r.ZeroOut {
		z |= C.PLOVER_ZERO_OUT
	}
	if r.InPlace {
		z |= C.PLOVER_IN_PLACE
	}
	return z
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
