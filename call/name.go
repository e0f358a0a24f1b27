package call

import (
	"strings"
	"unsafe"
)

// Name is a function's name as a transport read it from a request: on the
// hot path a view of the request's own bytes, without a copy, which are
// reused once the request is answered. Its only ways out say which use is
// meant: Borrow for the call (a lookup, a comparison, an argument to a
// callee that copies what it keeps), Keep for a copy that may outlive the
// request. A layer that keeps a name (the request metrics' series, a
// trace's attribute) takes a Name and calls Keep, so that keeping the
// request's bytes by mistake is no longer a plain assignment.
type Name struct{ s string }

// BorrowName is a Name over b, without a copy: b must not change while the
// name is used (until the request is answered).
func BorrowName(b []byte) Name { return Name{unsafe.String(unsafe.SliceData(b), len(b))} }

// NameOf is a Name of s, a string of the caller's own (a decoded message's
// field, a constant): Keep still copies it.
func NameOf(s string) Name { return Name{s} }

// Borrow is the name for the call, not to be kept past it: a callee that
// keeps it copies it first.
func (n Name) Borrow() string { return n.s }

// Keep is a copy of the name that may be kept.
func (n Name) Keep() string { return strings.Clone(n.s) }
