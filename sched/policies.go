package sched

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// A policy registers itself under a name (wfq.go, fifo.go), so that a new
// one is a file here and plover serve --sched-policy NAME selects it.
var policies = struct {
	sync.RWMutex
	m map[string]PolicyMaker
}{m: map[string]PolicyMaker{}}

// PolicyMaker makes a policy for one device's Scheduler; maxWait is
// Config.MaxWait, for policies that bound waiting.
type PolicyMaker func(maxWait time.Duration) Policy

// DefaultPolicy is the policy a Scheduler uses when none is named.
const DefaultPolicy = "wfq"

// RegisterPolicy adds a policy; a second of the same name is a programming
// error.
func RegisterPolicy(name string, make PolicyMaker) {
	policies.Lock()
	defer policies.Unlock()
	if _, dup := policies.m[name]; dup || name == "" || make == nil {
		panic(fmt.Sprintf("sched: RegisterPolicy(%q): empty or registered twice", name))
	}
	policies.m[name] = make
}

// Policies are the registered policies' names, sorted.
func Policies() []string {
	policies.RLock()
	defer policies.RUnlock()
	return slices.Sorted(maps.Keys(policies.m))
}

// NewPolicy makes the policy registered as name ("": DefaultPolicy).
func NewPolicy(name string, maxWait time.Duration) (Policy, error) {
	if name == "" {
		name = DefaultPolicy
	}
	policies.RLock()
	make := policies.m[name]
	policies.RUnlock()
	if make == nil {
		return nil, fmt.Errorf("scheduling policy %q: want one of %s", name, strings.Join(Policies(), ", "))
	}
	return make(maxWait), nil
}
