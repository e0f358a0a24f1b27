// Package cnn is the MNIST CNN sample bundle: cnn.cu (one portable kernel
// source for the host and CUDA targets), plover.json, and weights.bin. This
// package holds only its tests; the network in Go is package model, the
// data files are package digits, and cmd/ has the converter, trainer and
// client. See README.md.
package cnn
