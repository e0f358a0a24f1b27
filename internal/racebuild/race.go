//go:build race

// Package racebuild says whether the race detector is built in, for tests
// whose counts it changes: it makes sync.Pool drop items on purpose (so
// allocation counts do not hold) and shadows a process's memory (so its
// resident size passes small limits).
package racebuild

const Enabled = true
