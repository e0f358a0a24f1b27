package engine

// The function a pipeline's requests run first: what reads its body, and
// what its I/O is charged to and floods by (io.go, engine.go).

// firstStep is the function name's requests run first (firstStep), by
// the versions current here, read under t.mu.
func (t *table) firstStep(name string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return firstStep(name, t.curLocked)
}

// firstStep is the function a pipeline's requests run first, through
// nested pipelines and the first branch of a parallel step, as this node
// has it (look: a function's current version, nil for none; "": name is no
// pipeline here). It reads no store: a step not known here yet has no
// device flow either.
func firstStep(name string, look func(string) *version) string {
	first := ""
	for range maxNesting {
		v := look(name)
		if v == nil || !v.rec.IsPipeline() || len(v.rec.Steps) == 0 {
			return first
		}
		st := v.rec.Steps[0]
		for st.Function == "" && len(st.Parallel) > 0 {
			st = st.Parallel[0]
		}
		name, first = st.Function, st.Function
	}
	return "" // deeper than any deploy allows: a record changed under us
}

// maxNesting bounds firstStep's walk: deploys allow pipelines 8 levels
// deep.
const maxNesting = 16
