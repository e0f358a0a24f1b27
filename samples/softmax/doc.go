// Package softmax is the dense-layer-plus-softmax sample bundle: softmax.cu
// (one portable kernel source whose threads cooperate through shared memory
// and barriers), plover.json, and weights.bin made by gen. This package holds
// only its tests; the layer in Go is package model. See README.md.
package softmax
