package gate

import (
	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/reqmetrics"
)

// View is what one caller may read of the node: the functions its token
// covers (auth.Principal.Covers). A read token passes the gate on its
// scope alone for the routes that name no function or only read one (the
// listing, a function's details and versions, model metadata and
// readiness, the repository's index, /metrics); what they show is cut to
// its View, the one rule both transports apply: a tenant's token does not
// learn another tenant's functions, its deployers' names, its series, nor
// that a name outside its globs is a function's.
type View struct {
	p   *auth.Principal // nil: no tokens, or a token not known (all false)
	all bool
}

// View is the caller's view, from the authorization it sends: every
// function without tokens; none for a token the gate does not know (its
// request was refused already, or is a probe's).
func (g *Gate) View(authorization []byte) View {
	if g.tokens == nil {
		return View{all: true}
	}
	tok, _ := auth.BearerToken(authorization)
	p := g.tokens.Lookup(tok)
	return View{p: p, all: p.CoversAll()}
}

// All reports whether v sees every function, those deployed later too
// (no tokens, an admin token, functions "*"): what it reads needs no cut.
func (v View) All() bool { return v.all }

// Sees reports whether v may learn of function.
func (v View) Sees(function string) bool { return v.all || v.p.Covers(function) }

// Owns reports whether token is v's own token's name (or v sees all): a
// series labelled with another token's name is another tenant's.
func (v View) Owns(token string) bool { return v.all || v.p != nil && v.p.Name == token }

// SeesLabel reports whether v may read a metric series that has label
// name of value: a function's or a pipeline's (function, pipeline; a
// pipeline step's function label is its path, "inner/cnn", every name of
// which v must see) only where v sees it, a token's (token) only where it
// is v's own, any other label (a device, a reason, a step's index) always:
// node-wide series are every reader's.
func (v View) SeesLabel(name, value string) bool {
	switch {
	case v.all:
		return true
	case name == "function" || name == "pipeline":
		return reqmetrics.PathShown(value, v.Sees)
	case name == "token":
		return v.Owns(value)
	}
	return true
}

// Hide is nil for a name v sees, else the error of a name no function has
// (errdefs.UnknownFunction, as the engine answers one), for a read of it
// to answer as it would answer a name of no function: the same 404 and
// message whether or not the name is another tenant's. A name no function
// can have is left to the engine, which says why.
func (v View) Hide(function string) error {
	if v.Sees(function) || !abi.ValidName(function) {
		return nil
	}
	return errdefs.UnknownFunction(function, nil, "")
}
