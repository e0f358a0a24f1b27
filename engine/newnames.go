package engine

import (
	"slices"
	"sync"
)

// A function deployed through another node is not known here until a
// request (or a start's Prewarm) reads its record, and a poll read only
// the records of names known or followed here: one that asks for
// instances kept warm (min_instances) was never pre-warmed here by the
// poll, though README says so. So a poll also reads, once per tag, the
// record of each name new here (in the store's listing, neither loaded
// nor followed here: refreshFollowed reads those, and takes them on
// likewise), a few per poll, and takes on, and pre-warms aside, those
// whose current version asks for instances kept warm (takeOnWarm), as a
// start's Prewarm does. The others stay unknown here: a request for one
// reads its record as before (a 404 once deleted), and only the tag read
// is remembered, so that the next poll does not read it again.

// newReadsPerPoll bounds a poll's reads of records new here: a node that
// starts beside thousands of functions (none known yet) reads them over
// several polls, not all in one, which would cut the poll's other reads.
const newReadsPerPoll = 16

// newNames is the names new here whose record a poll read and did not
// take on, each with the tag read; and those whose read failed, read
// after the others at the next poll.
type newNames struct {
	mu     sync.Mutex
	seen   map[string]string
	failed map[string]bool
}

// toRead is up to newReadsPerPoll names of tags, the store's listing,
// neither known here (loaded or followed: keys of either) nor seen with
// their tag now, those that failed last; it drops what it holds of names
// no longer new here.
func (n *newNames) toRead(loaded, followed map[string]bool, tags map[string]string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	isNew := func(name string) bool {
		_, listed := tags[name]
		return listed && !loaded[name] && !followed[name]
	}
	for name := range n.seen {
		if !isNew(name) {
			delete(n.seen, name)
		}
	}
	for name := range n.failed {
		if !isNew(name) {
			delete(n.failed, name)
		}
	}
	var names []string
	for name, tag := range tags {
		if seen, ok := n.seen[name]; isNew(name) && (!ok || seen != tag) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	slices.SortStableFunc(names, func(a, b string) int { return cmpBool(n.failed[a], n.failed[b]) })
	return names[:min(len(names), newReadsPerPoll)]
}

// read records the outcome of a read of name's record: the tag not to
// read again ("": none, taken on or gone), or that it failed.
func (n *newNames) read(name, tag string, failed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen == nil {
		n.seen, n.failed = map[string]string{}, map[string]bool{}
	}
	delete(n.seen, name)
	delete(n.failed, name)
	switch {
	case failed:
		n.failed[name] = true
	case tag != "":
		n.seen[name] = tag
	}
}
