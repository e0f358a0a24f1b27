//go:build !race

package racebuild

const Enabled = false
