package sched

import (
	"time"

	"github.com/plover-run/plover/named"
)

// A policy registers itself under a name (wfq.go, fifo.go), so that a new
// one is a file here and plover serve --sched-policy NAME selects it.
var policies = named.New[PolicyMaker]("scheduling policy")

// PolicyMaker makes a policy for one device's Scheduler; maxWait is
// Config.MaxWait, for policies that bound waiting.
type PolicyMaker func(maxWait time.Duration) Policy

// DefaultPolicy is the policy a Scheduler uses when none is named.
const DefaultPolicy = "wfq"

// RegisterPolicy adds a policy; an empty name, a nil maker or a second of
// the same name is a programming error (it panics).
func RegisterPolicy(name string, make PolicyMaker) { policies.Register(name, make) }

// Policies are the registered policies' names, sorted.
func Policies() []string { return policies.Names() }

// NewPolicy makes the policy registered as name ("": DefaultPolicy).
func NewPolicy(name string, maxWait time.Duration) (Policy, error) {
	if name == "" {
		name = DefaultPolicy
	}
	make, err := policies.Lookup(name)
	if err != nil {
		return nil, err
	}
	return make(maxWait), nil
}
