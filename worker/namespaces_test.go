package worker

import "testing"

// A bundle cannot make a user namespace, nor a network namespace in one:
// there a process holds every capability, CAP_NET_ADMIN over its network
// among them, which opens nf_tables, tc and xfrm to it, the kernel's code
// most often found exploitable by an unprivileged process (a review's
// probe: a worker's forked child had CapEff 000001ffffffffff after
// unshare(CLONE_NEWUSER), and an nf_tables batch was acked). Before, on
// a kernel that allows user namespaces, both calls succeeded.
func TestABundleCannotMakeANamespace(t *testing.T) {
	if said := runFiltered(t, "namespaces"); said != "unshare=EPERM clone=EPERM" {
		t.Errorf("the worker's unshare and clone into a user and network namespace: %q, want both refused with EPERM", said)
	}
}
